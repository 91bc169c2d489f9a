"""The simulated MIG manager's rules (mig-parted reconfigure.go) and NVIDIA's geometry."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

from gpushare_testing.migmanager import (
    DEPLOY_LABELS,
    PAUSED,
    GpuMig,
    Target,
    apply_layout,
    disabled,
    mode_changes,
    paused_labels,
    restored_labels,
    select_target,
)
from gpushare_testing.migtables import fits, load_tables

H100 = "NVIDIA-H100-80GB-HBM3"
H100_ID = "0x233010DE"
CONFIG = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  too-many:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 8}
  overlap:
    - devices: all
      mig-enabled: true
      mig-devices: {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}
  first-two:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {"7g.80gb": 1}
  twice:
    - devices: all
      mig-enabled: false
    - devices: [0]
      mig-enabled: false
"""


@pytest.mark.parametrize(
    ("product", "devices", "fit"),
    [
        (H100, {"1g.10gb": 7}, True),
        (H100, {"1g.10gb": 8}, False),  # more than the instance count
        (H100, {"3g.40gb": 2}, True),
        (H100, {"4g.40gb": 1, "3g.40gb": 1}, True),
        (H100, {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}, True),
        (H100, {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}, False),  # no slice left
        (H100, {"7g.80gb": 1, "1g.10gb": 1}, False),
        (H100, {"1g.20gb": 4}, True),
        (H100, {"1g.20gb": 4, "1g.10gb": 1}, False),  # 1g.20gb takes two memory slices
        (H100, {"1g.5gb": 1}, False),  # an A100 40GB profile, not an H100's
        ("NVIDIA-A100-SXM4-40GB", {"3g.20gb": 2}, True),
        ("NVIDIA-A100-SXM4-40GB", {"4g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1}, True),
        ("NVIDIA-A30-PCIE-24GB", {"1g.6gb": 4}, True),
        ("NVIDIA-A30-PCIE-24GB", {"1g.6gb": 5}, False),
        ("NVIDIA-H200-141GB-HBM3e", {"1g.18gb": 7}, True),
        ("NVIDIA-B200-180GB-HBM3e", {"2g.45gb": 3, "1g.23gb": 1}, True),
    ],
)
def test_the_fitter_places_instances_as_nvidia_tables_allow(
    product: str, devices: dict[str, int], fit: bool
) -> None:
    assert fits(load_tables()[product], devices) is fit


def _target(selected: str, gpus: int = 2) -> Target:
    target = select_target(
        text=CONFIG, selected=selected, current=disabled(gpus), device_id=H100_ID
    )
    assert isinstance(target, Target), target
    return target


def test_a_config_missing_from_the_file_or_no_file_fails_validation() -> None:
    assert "not in the mig-parted config file" in str(
        select_target(text=CONFIG, selected="nope", current=disabled(1), device_id=H100_ID)
    )
    assert "does not exist" in str(
        select_target(text=None, selected="all-disabled", current=disabled(1), device_id=H100_ID)
    )
    assert "invalid mig-parted config" in str(
        select_target(text="version: v2", selected="a", current=disabled(1), device_id=H100_ID)
    )


def test_the_target_gives_each_matched_gpu_its_devices_and_leaves_the_others() -> None:
    uniform = _target("all-1g.10gb")
    assert uniform.layout == (GpuMig(True, ("1g.10gb",) * 7),) * 2
    assert mode_changes(uniform.layout, disabled(2))
    partial = _target("first-two", gpus=3)
    assert partial.layout == (GpuMig(True, ("7g.80gb",)),) * 2 + (GpuMig(),)
    assert _target("twice").reason  # two entries on GPU 0: refused (harsher than mig-parted)


def test_applying_a_layout_that_fits_gives_the_gpus_their_devices() -> None:
    target = _target("all-1g.10gb")
    layout, reason = apply_layout(target=target, current=disabled(2), model=load_tables()[H100])
    assert (layout, reason) == (target.layout, "")


@pytest.mark.parametrize("selected", ["too-many", "overlap"])
def test_a_layout_nvidia_refuses_leaves_mig_enabled_gpus_without_devices(selected: str) -> None:
    target = _target(selected)
    layout, reason = apply_layout(target=target, current=disabled(2), model=load_tables()[H100])
    assert "cannot hold" in reason
    assert layout == (GpuMig(enabled=True),) * 2


def test_a_model_outside_the_tables_cannot_hold_any_mig_device() -> None:
    layout, reason = apply_layout(target=_target("all-1g.10gb"), current=disabled(2), model=None)
    assert "not in NVIDIA's MIG tables" in reason
    assert all(gpu.enabled and not gpu.devices for gpu in layout)
    # Disabling MIG needs no table.
    assert apply_layout(target=_target("all-disabled"), current=layout, model=None) == (
        disabled(2),
        "",
    )


def test_deploy_labels_are_paused_and_restored_except_those_set_false() -> None:
    labels = {DEPLOY_LABELS[0]: "true", DEPLOY_LABELS[2]: "false"}
    paused = paused_labels(labels)
    assert paused[DEPLOY_LABELS[0]] == PAUSED and paused[DEPLOY_LABELS[2]] == "false"
    assert paused["nvidia.com/gpu.deploy.nvsm"] == PAUSED  # absent counts as deployed
    restored = restored_labels(paused)
    assert restored[DEPLOY_LABELS[0]] == "true" and restored[DEPLOY_LABELS[2]] == "false"
    assert set(restored) == set(DEPLOY_LABELS)


@pytest.mark.parametrize("module", ["migparted", "migtables", "migmanager", "miglabels"])
def test_the_mig_rules_are_pure(module: str) -> None:
    """Like the other agents' rules (the import-linter contract): no asyncio, no I/O client."""
    source = importlib.import_module(f"gpushare_testing.{module}").__file__
    assert source is not None
    tree = ast.parse(pathlib.Path(source).read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    forbidden = {"asyncio", "aiohttp", "kopf", "kubernetes_asyncio", "gpushare_testing.rawclient"}
    assert not imported & forbidden, imported & forbidden
    # and nothing of the operator's code: only its data file (``importlib.resources``)
    assert not [name for name in imported if name.startswith("gpushare_operator")]
