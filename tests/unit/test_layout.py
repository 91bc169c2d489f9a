"""Guards on the project layout that docs/architecture.md describes."""

from __future__ import annotations

import operator
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_operator_folder_is_not_a_package() -> None:
    # A package named `operator` would shadow the standard library module asyncio imports.
    assert (ROOT / "operator" / "gpushare_operator" / "__init__.py").exists()
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_import_operator_is_the_standard_library() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert Path(operator.__file__).resolve().parent == stdlib
    assert operator.itemgetter(1)([0, 7]) == 7


def test_layer_packages_exist() -> None:
    package = ROOT / "operator" / "gpushare_operator"
    for layer in ("core", "cache", "reconcile", "kube", "app", "testing"):
        assert (package / layer / "__init__.py").is_file(), layer
    assert (package / "py.typed").is_file()
    assert (package / "__main__.py").is_file()
