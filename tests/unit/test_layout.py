"""Guards on the project layout that docs/architecture.md describes."""

from __future__ import annotations

import ast
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


def _imported_modules(tree: ast.Module) -> list[str]:
    """Every module an ``import`` or ``from ... import`` names, relative ones as ``.name``."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append("." * node.level + (node.module or ""))
    return found


def test_no_test_module_imports_another() -> None:
    """What tests share is in the test support (``gpushare_testing``) or is a fixture, which
    pytest injects; a test module that imports another runs that one's tests' set-up code and
    breaks when it is renamed."""
    tests = ROOT / "tests"
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for module in _imported_modules(tree):
            if module == "tests" or module.startswith(("tests.", ".")) or "conftest" in module:
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == []


def test_the_import_guard_sees_test_imports() -> None:
    tests = "tests"  # spelled apart, so that a grep for such imports finds none here either
    tree = ast.parse(
        f"import {tests}.unit.test_planner\n"
        f"from {tests}.integration import helpers as h\n"
        "from .conftest import ROOT\n"
        f"def f():\n    from {tests}.waiting import eventually\n"
        "from gpushare_testing.waiting import eventually\n"
    )
    assert sorted(_imported_modules(tree)) == [
        ".conftest",
        "gpushare_testing.waiting",
        "tests.integration",
        "tests.unit.test_planner",
        "tests.waiting",
    ]


def test_tests_hold_only_tests_and_fixtures() -> None:
    """Shared helpers belong in ``gpushare_testing``: a helper module among the tests would be
    imported by them."""
    extra = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("*.py")
        if not path.name.startswith("test_") and path.name not in ("conftest.py", "__init__.py")
    }
    # Run by `make image-test` only: a test module, named so that `make test` does not collect it.
    assert extra == {"tests/integration/image_smoke.py"}
