"""The committed MIG tables are go-nvml's export plus the listed corrections, and nothing else.

``core/hardware/migtables.json`` is what the operator decides MIG layouts with. It claims to be the
output
of ``make mig-tables`` (the Go exporter in tests/miggeometry, against the go-nvml version in its
go.mod) with each field the MIG User Guide corrects listed under ``corrections``. Here the
exporter is built (cached) and run, the corrections are undone on the committed data, and the
two must be equal: a hand edit that is not listed, a correction whose ``goNvml`` value is not
go-nvml's, or a go-nvml bump that changes a table all fail. No control plane is needed, only Go.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from gpushare_testing.paths import ROOT

EXPORTER = ROOT / "tests" / "miggeometry"
TABLES = ROOT / "operator" / "gpushare_operator" / "core" / "hardware" / "migtables.json"


@pytest.fixture(scope="module")
def exported() -> dict[str, Any]:
    out = ROOT / ".cache" / "miggeometry"
    subprocess.run(["bash", str(EXPORTER / "build.sh"), str(out)], check=True)
    run = subprocess.run([str(out / "miggeometry")], check=True, capture_output=True, text=True)
    data: dict[str, Any] = json.loads(run.stdout)
    return data


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TABLES.read_text())
    return data


def _undo_corrections(committed: dict[str, Any]) -> dict[str, Any]:
    """The committed models in the exporter's shape, each correction back to go-nvml's value."""
    models: dict[str, Any] = {}
    for product, raw in copy.deepcopy(committed["models"]).items():
        profiles = {name: {"name": name, **body} for name, body in raw.pop("profiles").items()}
        models[product] = {**raw, "profiles": profiles}
    renames: dict[str, str] = {}
    for correction in committed["corrections"]:
        model = models[correction["model"]]
        field, used, original = correction["field"], correction["used"], correction["goNvml"]
        assert used != original, correction
        if field == "product":
            assert correction["profile"] is None and used == correction["model"], correction
            renames[used] = original
            continue
        target = (
            model if correction["profile"] is None else model["profiles"][correction["profile"]]
        )
        assert target[field] == used, f"correction not applied: {correction}"
        target[field] = original
    undone = {}
    for product, model in models.items():
        profiles = sorted(model.pop("profiles").values(), key=lambda p: p["giProfileId"])
        undone[renames.get(product, product)] = {**model, "profiles": profiles}
    return undone


def test_committed_tables_are_the_export_plus_the_listed_corrections(
    exported: dict[str, Any], committed: dict[str, Any]
) -> None:
    assert _undo_corrections(committed) == exported["models"]


def test_provenance_names_the_go_nvml_the_exporter_builds_against(
    exported: dict[str, Any], committed: dict[str, Any]
) -> None:
    required = re.search(r"github.com/NVIDIA/go-nvml (\S+)", (EXPORTER / "go.mod").read_text())
    assert required is not None
    version = committed["provenance"]["goNvml"]["version"]
    assert version == required.group(1) == exported["goNvml"]


def test_every_correction_cites_nvidia(committed: dict[str, Any]) -> None:
    for correction in committed["corrections"]:
        assert "docs.nvidia.com/datacenter/tesla/mig-user-guide" in correction["source"], correction
        assert correction["model"] in committed["models"], correction


def test_the_wheel_ships_the_tables(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
    )
    [wheel] = tmp_path.glob("gpushare_operator-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.read("gpushare_operator/core/hardware/migtables.json")
    assert shipped == TABLES.read_bytes()
