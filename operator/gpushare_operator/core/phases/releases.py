"""A node no policy governs any more: our labels go, then the release is watched.

The release counts against the budget of the policy the node leaves until GPU Feature Discovery
and kubelet show the node unshared again, as seen after our labels went (what the node showed
before may look unshared already), or until a timeout: a node that never settles, say one with a
bad GPU, is reported and stops counting.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpushare_operator.core import migphases
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.decisions import Labels, NodeDecision, Published
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.records.nodes import (
    CONFIG_LABEL,
    GFD_TIMESTAMP,
    GPU_RESOURCE,
    MIG_CONFIG_LABEL,
    POLICY_LABEL,
    NodeRecord,
)

UNCONFIRMED = "ReleaseNotConfirmed"
# A node that shows unshared when our labels go may not have restarted yet; GFD's next pass says
# it has.  When none comes this long after the release, nothing is restarting: the config
# manager never applied our key (it skips a key it already runs), or the node's agents are
# down.  The labels are then taken as they are.
QUIET_RELEASE = 10.0


def release(
    record: NodeRecord, *, published: Published, now: float, timeout: float
) -> NodeDecision:
    """No policy governs the node: our labels go, then the release is watched until the device
    plugin runs unshared again, for at most ``timeout`` (a node that never settles, say a bad
    GPU, is reported and stops counting against its policy's budget)."""
    # Only a node carrying our policy label is ours to clean; a config label set by someone else
    # without it is theirs, and SSA could not remove it anyway.
    message = "no GPUSharingPolicy selects this node"
    if record.policy_label is not None and migphases.leaving_mig(record):
        return disable_mig_first(record, published=published, now=now)
    if record.policy_label is not None:
        # It names the policy it leaves, so that a wait for its turn is published for that
        # policy, and the release, once the labels are gone, is watched against its budget.
        # Our all-disabled MIG label, if any, goes with them (the apply leaves it out).
        labels: Labels = {CONFIG_LABEL: None, POLICY_LABEL: None}
        return NodeDecision(
            None,
            NodePhase.UNMANAGED,
            "NoPolicy",
            message,
            labels,
            released_from=record.policy_label,
        )
    losing = published.policy
    since = published.since if published.phase == NodePhase.RELEASING else None
    settled = release_settled(record)
    if settled and (
        losing is None
        or published.phase == NodePhase.UNSUPPORTED  # never configured by us: nothing restarts
        or _seen_since_release(record, published)
        or (since is not None and now >= since + QUIET_RELEASE)
    ):
        return NodeDecision(None, NodePhase.UNMANAGED, "NoPolicy", message, None)
    if published.reason == UNCONFIRMED:
        # Said once, kept as it was: the node stays out of every budget until it settles.
        return NodeDecision(None, NodePhase.UNMANAGED, UNCONFIRMED, published.message, None)
    if losing is None:  # what it last said names no policy: it was never ours to release
        return NodeDecision(None, NodePhase.UNMANAGED, "NoPolicy", message, None)
    deadline = (now if since is None else since) + timeout
    seen = "; ".join(_release_disagreements(record))
    if now >= deadline:
        message = (
            f"released from GPUSharingPolicy {losing}, but the device plugin did not come back"
            f" unshared within {timeout:.0f} s: {seen}; it no longer counts against {losing}"
        )
        return NodeDecision(None, NodePhase.UNMANAGED, UNCONFIRMED, message, None)
    message = (
        f"released from GPUSharingPolicy {losing}: waiting for the device plugin to run"
        " unshared (GPU Feature Discovery and kubelet to confirm)"
    )
    recheck = deadline
    if settled:  # looks unshared already: look again when the quiet time is over
        recheck = min(deadline, (now if since is None else since) + QUIET_RELEASE)
    return NodeDecision(
        None,
        NodePhase.RELEASING,
        "Releasing",
        message,
        None,
        recheck_at=recheck,
        released_from=losing,
    )


def disable_mig_first(record: NodeRecord, *, published: Published, now: float) -> NodeDecision:
    """A released node with a MIG layout of ours: the MIG manager disables MIG first, under the
    config the node runs; our labels go once it reports success."""
    losing = record.policy_label
    if record.mig_config_label == migconfigs.ALL_DISABLED:
        message = (
            f"released from GPUSharingPolicy {losing}: waiting for the MIG manager to disable"
            f" MIG (nvidia.com/mig.config.state={record.mig_state})"
        )
        return migphases.disabling(
            record, None, published=published, now=now, message=message, released_from=losing
        )
    labels: Labels = {
        CONFIG_LABEL: record.config_label,
        POLICY_LABEL: losing,
        MIG_CONFIG_LABEL: migconfigs.ALL_DISABLED,
    }
    message = f"released from GPUSharingPolicy {losing}: disabling MIG first"
    return NodeDecision(
        None, NodePhase.PENDING, migphases.DISABLING, message, labels, released_from=losing
    )


def release_blocked(record: NodeRecord, *, owners: Sequence[str]) -> NodeDecision:
    """Our labels stay on the node after our release: other field managers own them too."""
    message = (
        f"no GPUSharingPolicy selects this node, but its {POLICY_LABEL} label is also owned by"
        f" field manager(s) {', '.join(owners)}: gpushare gave up its part and leaves them"
        " (remove the label with that manager, or by hand)"
    )
    return NodeDecision(None, NodePhase.UNMANAGED, "ReleaseBlocked", message, None)


def _seen_since_release(record: NodeRecord, published: Published) -> bool:
    """Whether GPU Feature Discovery has labelled the node since our labels went: what the
    node showed before may look unshared already (a config that never took), while the device
    plugin is still to restart on the default config.  GFD stamps every pass in whole seconds;
    the release's second is not enough.  A GFD that writes no stamp cannot tell: the labels
    are taken as they are."""
    stamp = record.labels.get(GFD_TIMESTAMP)
    if stamp is None or not stamp.isdigit():
        return True
    if published.phase != NodePhase.RELEASING or published.stamp is None:
        return False  # the release was not even recorded yet: nothing can be after it
    return int(stamp) > published.stamp


def release_settled(record: NodeRecord) -> bool:
    """Whether a released node runs the unshared config again: GFD reports no sharing and
    kubelet shows one ``nvidia.com/gpu`` per GPU (what the default config advertises)."""
    return not _release_disagreements(record)


def _release_disagreements(record: NodeRecord) -> list[str]:
    problems = []
    if record.reported_replicas not in (None, 1):
        problems.append(f"nvidia.com/gpu.replicas is {record.reported_replicas}, expected 1")
    if record.sharing_strategy not in (None, "none"):
        problems.append(f"nvidia.com/gpu.sharing-strategy is {record.sharing_strategy}")
    gpus = record.gpus
    allocatable = record.allocatable_of(GPU_RESOURCE)
    if gpus is not None and allocatable != gpus:
        problems.append(f"allocatable {GPU_RESOURCE} is {allocatable}, expected {gpus}")
    return problems
