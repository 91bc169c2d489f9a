"""The seam the three backends fill (``core.backends``): which one governs a policy's nodes,
what each adds to a node's target and what it renders cluster-wide, and what a move disrupts."""

from __future__ import annotations

from typing import Any

from gpushare_operator.core import backends, migphases
from gpushare_operator.core.api.models import MIG_IDLE
from gpushare_operator.core.backends.deviceplugin import DEVICE_PLUGIN
from gpushare_operator.core.backends.dra import DRA
from gpushare_operator.core.backends.mig import MIG
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.records.nodes import MIG_CONFIG_LABEL, project_node
from gpushare_operator.core.records.policies import CompiledPolicy, compile_policy
from gpushare_testing.builders import node

H100 = "NVIDIA-H100-80GB-HBM3"
SELECT = {"nodeSelector": {"matchLabels": {"pool": "a"}}}
MIXED = {"devices": {"3g.40gb": 1, "1g.10gb": 4}}


def compiled(**spec: Any) -> CompiledPolicy:
    policy = compile_policy(name="p", uid="uid-p", generation=1, spec={**SELECT, **spec})
    assert policy.error is None, policy.error
    return policy


def h100(**labels: str) -> Any:
    return project_node(node("n", count="2", **{"nvidia.com/gpu.product": H100, **labels}))


def test_each_policy_has_the_backend_that_changes_its_nodes() -> None:
    assert backends.of(None) is DEVICE_PLUGIN
    assert backends.of(compiled(strategy="TimeSlicing", replicas=4)) is DEVICE_PLUGIN
    assert backends.of(compiled(strategy="MIG", mig=MIXED)) is MIG
    assert backends.of(compiled(strategy="Exclusive", backend="DRA")) is DRA
    assert backends.of(compiled(strategy="MIG", mig=MIXED, backend="DRA")) is DRA


def test_what_each_renders_outside_the_nodes() -> None:
    shared = compiled(strategy="TimeSlicing", replicas=4)
    rendered = backends.of(shared).renders(shared)
    assert rendered.config == {shared.config_key: shared.config_text}
    assert (dict(rendered.layouts), rendered.device_classes) == ({}, ())
    mig = compiled(strategy="MIG", mig=MIXED)
    assert mig.mig is not None
    assert backends.of(mig).renders(mig).layouts == mig.mig.entries
    assert backends.of(mig).renders(mig).device_classes == ()
    dra_mig = compiled(strategy="MIG", mig=MIXED, backend="DRA")
    rendered = backends.of(dra_mig).renders(dra_mig)
    # GPU Feature Discovery reads the config key on a DRA node too; the layouts go to
    # mig-parted; a DeviceClass per profile.
    assert list(rendered.config) == [dra_mig.config_key] and rendered.layouts
    assert sorted(rendered.device_classes) == ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]


def test_each_adds_its_own_labels_to_the_target() -> None:
    record = h100()
    assert DEVICE_PLUGIN.target(record, compiled(strategy="Exclusive")) == {}
    mig = compiled(strategy="MIG", mig=MIXED)
    assert MIG.target(record, mig) == {MIG_CONFIG_LABEL: migphases.layout_name(record, mig)}
    dra_mig = compiled(strategy="MIG", mig=MIXED, backend="DRA")
    assert DRA.target(record, dra_mig) == {
        **dra.ON,
        MIG_CONFIG_LABEL: migphases.layout_name(record, dra_mig),
    }
    # Back from DRA: the switch goes with the apply (left out: server-side apply drops it).
    on = h100(**dra.ON)
    assert DEVICE_PLUGIN.target(on, compiled(strategy="Exclusive")) == dict(dra.OFF)


def test_a_move_disrupts_running_pods_only_across_backends_or_layouts() -> None:
    record = h100()
    same = compiled(strategy="TimeSlicing", replicas=4)
    assert backends.disruption(record, same, layouts={}) is None
    assert backends.disruption(
        record, compiled(strategy="Exclusive", backend="DRA"), layouts={}
    ) == (dra.BACKEND_IDLE)
    assert backends.disruption(record, compiled(strategy="MIG", mig=MIXED), layouts={}) == MIG_IDLE
    # Leaving DRA (a release included) is a backend move too.
    on = h100(**dra.ON)
    assert backends.disruption(on, None, layouts={}) == dra.BACKEND_IDLE
    assert (
        backends.disruption(on, compiled(strategy="Exclusive", backend="DRA"), layouts={}) is None
    )
