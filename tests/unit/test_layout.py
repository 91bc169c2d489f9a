"""Guards on the project layout that docs/architecture.md describes."""

from __future__ import annotations

import operator
import subprocess
import sys
import sysconfig
import zipfile
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
    for layer in ("core", "cache", "reconcile", "kube", "app", "kubectl"):
        assert (package / layer / "__init__.py").is_file(), layer
    assert (package / "py.typed").is_file()
    assert (package / "__main__.py").is_file()


def test_the_wheel_holds_the_operator_and_the_plugin_only(tmp_path: Path) -> None:
    """The test support is a distribution of its own: nothing of it reaches the product."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), ROOT],
        check=True,
    )
    [wheel] = tmp_path.glob("gpushare_operator-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names}
    assert packages == {"gpushare_operator", "gpushare_operator-0.1.0.dist-info"}, packages
    support = ROOT / "testing" / "gpushare_testing"
    modules = {path.stem for path in support.glob("*.py")} - {"__init__"}
    shipped = {Path(name).stem for name in names if name.endswith(".py")}
    assert modules and not (modules & shipped), modules & shipped
    assert "gpushare_operator/kubectl/cli.py" in names  # the plugin ships
    assert "gpushare_operator/app/cli.py" in names


def test_the_image_is_built_from_the_operator_alone() -> None:
    """The image's build context is the operator's source and metadata, nothing else."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert ignored[0] == "*"
    assert {line for line in ignored if line.startswith("!")} == {
        "!pyproject.toml",
        "!README.md",
        "!operator",
    }
    copies = [
        line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")
    ]
    assert not any("testing" in line for line in copies), copies
