"""What a planned change would leave on each node, and how long its rollout would take.

Pure pieces of ``kubectl gpushare plan`` (``kubectl.forecast`` runs them against the
operator's own state and planner):

- ``standing_of``: a node's standing under a decision, read off the very status the operator
  would publish (``nodephases.render_status``), so that the plan's capacity (and for MIG its
  layout and slots by resource, ``kubectl.miglayouts``) is what the GPUNodeState will show,
  by construction;
- ``settled_body``: the node as NVIDIA's agents leave it once a config is in force (config
  manager, device plugin and GPU Feature Discovery done: labels and allocatable agree), which
  is what lets the operator's rollout bookkeeping be replayed batch after batch;
- ``pool_of``: which pool a node is in, for grouping;
- ``RolloutPace``: the seconds a batch takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpushare_operator.core.api import defaults
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.core.labelling.rewrittenlabels import base_product
from gpushare_operator.core.phases import nodephases
from gpushare_operator.core.records.nodes import (
    CONFIG_LABEL,
    GFD_TIMESTAMP,
    GPU_PRODUCT,
    GPU_REPLICAS,
    GPU_RESOURCE,
    GPU_SHARING,
    POLICY_LABEL,
    SHARED_RESOURCE,
    NodeRecord,
)
from gpushare_operator.core.records.policies import CompiledPolicy
from gpushare_operator.kubectl import miglayouts
from gpushare_operator.kubectl.miglayouts import Slots

GOVERNED: Final = "Governed"
UNSUPPORTED: Final = "Unsupported"
UNMANAGED: Final = "Unmanaged"

# TimeSlicing and MPS under backend DRA compile here as under an operator run with
# --dra-sharing: the plugin cannot read the operator's flags, but admission decides (the chart's
# ValidatingAdmissionPolicy refuses such a policy, a plan's dry run too, while the flag is off),
# and one that got past it anyway says so in its status (Ready=False DRASharingDisabled).
DRA_SHARING: Final = True

# Where clusters say which pool a node belongs to: this project's examples, then GKE, EKS,
# AKS and Karpenter.  A node with none of them is grouped by its GPU product.
POOL_LABELS: Final = (
    "pool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "karpenter.sh/nodepool",
)
NO_POOL: Final = "-"

# Per node of a rollout the operator writes its labels once and its GPUNodeState twice
# (Applied, then Verified): the writes a batch spends at the write rate.
WRITES_PER_NODE: Final = 3
DEFAULT_VERIFY_SECONDS: Final = 60.0


@dataclass(frozen=True, slots=True)
class NodeStanding:
    """What a node's GPUNodeState says about its configuration (not its progress)."""

    policy: str | None
    config_key: str | None
    standing: str  # GOVERNED, UNSUPPORTED or UNMANAGED
    capacity: int  # slots advertised: GPUs x replicas; 0 when not governed
    gpus: int
    resource: str  # the extended resource its pods request
    why: str | None = None  # why the policy cannot work there, when Unsupported
    reason: str | None = None  # the reason of that, when Unsupported (MIGLayoutDoesNotFit)
    slots: Slots = ()  # what it advertises, by resource (a MIG layout offers several)
    mig_config: str | None = None  # the mig-parted config its nvidia.com/mig.config names
    layout: str | None = None  # that config's layout per GPU: ``1x 3g.40gb + 1x 2g.20gb``

    def as_dict(self) -> dict[str, Any]:
        out = {
            "policy": self.policy,
            "configKey": self.config_key,
            "standing": self.standing,
            "capacity": self.capacity,
            "gpus": self.gpus,
            "resource": self.resource,
            "slots": dict(self.slots),
            "migConfig": self.mig_config,
            "layout": self.layout,
            "why": self.why,
            "reason": self.reason,
        }
        return {key: value for key, value in out.items() if value is not None}


def standing_of(record: NodeRecord, decision: nodephases.NodeDecision) -> NodeStanding:
    """The node's standing, from the status the operator would render for ``decision``."""
    status = nodephases.render_status(record=record, decision=decision, previous=None, now="")
    policy = decision.policy
    unsupported = decision.phase is NodePhase.UNSUPPORTED
    resource = GPU_RESOURCE
    if policy is not None and policy.resources and not unsupported:
        resource = policy.resources[0]
    named = status.get("policy")
    if policy is None and decision.phase is not NodePhase.RELEASING:
        named = None  # its labels are to go: the policy it leaves governs it no more
    if unsupported:
        standing = UNSUPPORTED
    elif named is None:
        standing = UNMANAGED
    else:
        standing = GOVERNED
    mig_config, layout = miglayouts.layout_of(status)
    return NodeStanding(
        policy=named,
        config_key=status.get("configKey"),
        standing=standing,
        capacity=int(status["slots"]["capacity"]),
        gpus=int(status["gpus"]),
        resource=resource,
        why=decision.message if unsupported else None,
        reason=decision.reason if unsupported else None,
        slots=miglayouts.advertised(
            record,
            status,
            resource=resource,
            governed=standing == GOVERNED,
            unsupported=unsupported,
        ),
        mig_config=mig_config,
        layout=layout,
    )


def pool_of(labels: Mapping[str, str], keys: Sequence[str] = POOL_LABELS) -> str:
    """The first of ``keys`` the node carries, else its GPU product, else ``-``."""
    for key in keys:
        value = labels.get(key)
        if value:
            return value
    return base_product(labels.get(GPU_PRODUCT)) or NO_POOL


def _bumped(version: str) -> str:
    """A resourceVersion after ``version``: the cache ignores a body older than what it holds."""
    return str(int(version) + 1) if version.isdigit() else version


def settled_body(record: NodeRecord, policy: CompiledPolicy | None) -> dict[str, Any]:
    """The Node as the NVIDIA agents leave it once ``policy``'s config (None: no sharing) is in
    force: our labels as the operator writes them, GFD's replicas and sharing-strategy labels,
    and kubelet advertising GPUs x replicas of the policy's resource (for MIG: the MIG
    manager done, and each resource of the layout, ``kubectl.miglayouts.settle``)."""
    labels = dict(record.labels)
    if policy is None or policy.sharing is None or policy.config_key is None:
        labels.pop(CONFIG_LABEL, None)
        labels.pop(POLICY_LABEL, None)
        replicas, strategy, resource = 1, "none", GPU_RESOURCE
    else:
        labels[CONFIG_LABEL] = policy.config_key
        labels[POLICY_LABEL] = policy.name
        replicas = (policy.mig.replicas if policy.mig else policy.replicas) or 1
        strategy = devconfigs.sharing_strategy_label(policy.sharing)
        resource = policy.resources[0]
    labels[GPU_REPLICAS] = str(replicas)
    labels[GPU_SHARING] = strategy
    # GFD's stamp of a pass before the change would say the agents have not relabelled since
    # (a release then looks unconfirmed): the settled node is the one after their pass.
    labels.pop(GFD_TIMESTAMP, None)
    gpus = record.gpus or 0
    resources = dict(record.allocatable)
    for advertised in (GPU_RESOURCE, SHARED_RESOURCE):
        resources.pop(advertised, None)
    if not miglayouts.settle(labels, resources, record=record, policy=policy):
        resources[resource] = str(gpus * replicas)
    return {
        "metadata": {
            "name": record.name,
            "uid": record.uid,
            "resourceVersion": _bumped(record.resource_version),
            "labels": labels,
        },
        "spec": {"taints": [dict(taint) for taint in record.taints]},
        "status": {"capacity": dict(resources), "allocatable": resources},
    }


@dataclass(frozen=True, slots=True)
class RolloutPace:
    """How long the steps of a rollout take.

    ``propagation_delay``: the operator's ``--config-propagation-delay``, waited once before a
    new config key may be put on nodes; ``write_qps``: its ``--write-qps``;
    ``verify_seconds``: from a node's label change until it is Verified (the device plugin's
    restart, then GPU Feature Discovery relabelling the node).
    """

    propagation_delay: float = defaults.CONFIG_PROPAGATION_DELAY
    write_qps: float = defaults.WRITE_QPS
    verify_seconds: float = DEFAULT_VERIFY_SECONDS

    def batch_seconds(self, nodes: int) -> float:
        """One batch: its writes at the write rate, then the wait until its nodes are Verified."""
        return nodes * WRITES_PER_NODE / self.write_qps + self.verify_seconds
