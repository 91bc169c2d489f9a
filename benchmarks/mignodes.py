"""H100 nodes as a MIG policy leaves them under ``mixed``: the bodies the MIG ingest rows feed.

A node gpushare has put on a mixed layout carries, besides what ``gpushare_testing.bodies``
gives every GPU node, GPU Feature Discovery's labels for each MIG resource
(NVIDIA/k8s-device-plugin ``internal/lm/resource.go``: ``product``, ``count``, ``replicas`` from
the base labeler, and the MIG device's attributes: ``memory``, ``multiprocessors``,
``slices.gi``, ``slices.ci``, ``engines.{copy,decoder,encoder,jpeg,ofa}``), the MIG manager's
``nvidia.com/mig.config.state``, our three labels (the device-plugin key, the policy, and
``nvidia.com/mig.config``) owned by gpushare in ``managedFields``, and kubelet's capacity of
each ``nvidia.com/mig-<profile>`` resource.  The simulator's GFD (``miglabels``) writes the
first part; the attributes NVIDIA's tables here do not carry (SMs, engines) are added with
the H100's figures, so that every key the real GFD writes is there, with a value as long.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.records.nodes import (
    CONFIG_LABEL,
    FIELD_MANAGER,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    POLICY_LABEL,
)
from gpushare_testing.agents import Sharing
from gpushare_testing.bodies import Body, gpu_node
from gpushare_testing.bodyparts import managed_entry, owned_fields
from gpushare_testing.miglabels import MigNode, mig_gfd_labels
from gpushare_testing.migmanager import GpuMig
from gpushare_testing.migtables import load_tables

H100: Final = "NVIDIA-H100-80GB-HBM3"
H100_MEMORY_MIB: Final = 81559
GPUS: Final = 8
MIG_POOL: Final = "mig"
MIG_POLICY: Final = "mig-mixed"
# Every GPU: one 3g.40gb, one 2g.20gb and one 1g.10gb (7 of 8 memory slices, 6 of 7 compute).
DEVICES: Final[Mapping[str, int]] = {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}
# NVML's attributes of the H100's MIG devices that the exported tables leave out:
# (multiprocessors, copy, decoder, encoder, jpeg, ofa engines).
_ATTRIBUTES: Final[Mapping[str, tuple[int, int, int, int, int, int]]] = {
    "1g.10gb": (16, 1, 1, 0, 1, 0),
    "2g.20gb": (32, 2, 2, 0, 2, 0),
    "3g.40gb": (60, 3, 3, 0, 3, 0),
}
_ENGINES: Final = ("multiprocessors", "engines.copy", "engines.decoder", "engines.encoder",
                   "engines.jpeg", "engines.ofa")  # fmt: skip
CONFIG_KEY: Final = f"{MIG_POLICY}-mig-0a1b2c"  # the device-plugin key a MIG policy renders to
AT: Final = "2025-04-02T08:00:00Z"


def mig_config_name() -> str:
    """The mig-parted config name gpushare gives this layout (what the label says)."""
    layout = migconfigs.MigLayout.from_mapping(DEVICES)
    return migconfigs.layout_name(policy_name=MIG_POLICY, layout=layout)


def mixed_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """GFD's whole label set for the layout under ``mixed``, as the simulator writes it, plus
    the attribute labels real GFD adds."""
    layout = tuple(GpuMig(enabled=True, devices=tuple(DEVICES)) for _ in range(GPUS))
    node = MigNode(
        product=H100,
        memory_mib=H100_MEMORY_MIB,
        layout=layout,
        model=load_tables()[H100],
        default_strategy="mixed",
    )
    sharing = Sharing(strategy="none", replicas=1, mig_strategy="mixed")
    result = mig_gfd_labels(labels, sharing=sharing, node=node)
    for profile, values in _ATTRIBUTES.items():
        for suffix, value in zip(_ENGINES, values, strict=True):
            result[f"nvidia.com/mig-{profile}.{suffix}"] = str(value)
    return result


def mig_node(index: int) -> Body:
    """Node ``index`` of the MIG pool, Verified on the mixed layout."""
    base = gpu_node(
        name=f"gpu-mig-{index:05d}",
        pool=MIG_POOL,
        product=H100,
        gpus=GPUS,
        memory_mib=H100_MEMORY_MIB,
        mig_strategy="mixed",
        mig_preset=False,
    )
    metadata = base["metadata"]
    gfd = mixed_labels(metadata["labels"])
    ours = {CONFIG_LABEL: CONFIG_KEY, POLICY_LABEL: MIG_POLICY, MIG_CONFIG_LABEL: mig_config_name()}
    state = {MIG_STATE_LABEL: "success"}
    labels = gfd | ours | state
    managers = [_gfd_owning(entry, gfd, metadata["labels"]) for entry in metadata["managedFields"]]
    managers += [_applied(ours), managed_entry("nvidia-mig-manager", AT, _labels_of(state))]
    status = _with_mig_resources(base["status"])
    return base | {
        "metadata": metadata | {"labels": labels, "managedFields": managers},
        "status": status,
    }


def _labels_of(labels: Mapping[str, str]) -> Body:
    return {"metadata": {"labels": dict(labels)}}


def _applied(labels: Mapping[str, str]) -> Body:
    """Our server-side apply's entry: gpushare owns its three labels."""
    entry = managed_entry(FIELD_MANAGER, AT, _labels_of(labels))
    return entry | {"operation": "Apply"}


def _gfd_owning(entry: Body, gfd: Mapping[str, str], before: Mapping[str, str]) -> Body:
    """GFD's entry owning its labels after the MIG pass (NFD writes them as GFD's manager)."""
    if entry.get("manager") != "gpu-feature-discovery":
        return entry
    owned = {k: v for k, v in gfd.items() if k not in before or k.startswith("nvidia.com/")}
    return entry | {"fieldsV1": owned_fields(_labels_of(owned))}


def _with_mig_resources(status: Body) -> Body:
    """kubelet's view under ``mixed``: no whole GPUs, each profile's devices instead."""
    mig = {f"nvidia.com/mig-{p}": str(n * GPUS) for p, n in DEVICES.items()}
    capacity = status["capacity"] | {"nvidia.com/gpu": "0"} | mig
    allocatable = status["allocatable"] | {"nvidia.com/gpu": "0"} | mig
    return status | {"capacity": capacity, "allocatable": allocatable}


def mig_policy_body() -> dict[str, Any]:
    """The MIG policy that governs the MIG pool (mixed, the layout above)."""
    return {
        "apiVersion": "gpushare.dev/v1alpha1",
        "kind": "GPUSharingPolicy",
        "metadata": {"name": MIG_POLICY, "uid": "0000-mig0", "generation": 1},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": MIG_POOL}},
            "priority": 500,
            "strategy": "MIG",
            "mig": {"devices": dict(DEVICES), "migStrategy": "mixed"},
            "rollout": {"maxUnavailable": "10%", "podPolicy": "Evict"},
        },
    }
