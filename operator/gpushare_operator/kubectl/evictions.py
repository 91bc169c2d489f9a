"""The pods a planned change would evict from a node under ``podPolicy: Evict``, and how long.

The choice is the operator's own (``core.victims.choose``, with the resource and the number of
slots the node's new config advertises): the fewest pods whose slots must go, lowest priority
then youngest first, never a DaemonSet's or a static pod.  A node whose pods cannot be made to
fit even so (pods that are never evicted hold what the new config lacks) is ``stuck``: the
operator gives it up at once (``EvictionBlocked``, NotEvictable) and it keeps its old config.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpushare_operator.core import victims
from gpushare_operator.core.models import PodPolicy, RolloutSpec
from gpushare_operator.core.pods import PodRecord
from gpushare_operator.kubectl.disruptions import DEFAULT_GRACE_PERIOD, PodDetails


@dataclass(frozen=True, slots=True)
class NodeEvictions:
    """A node drained for its change: what goes, or why nothing can."""

    node: str
    policy: str  # the policy whose rollout drains it (for a release: the one it leaves)
    pods: tuple[PodRecord, ...]  # to evict, in the order the operator evicts them
    leaving: tuple[PodRecord, ...]  # terminating already: waited for, not evicted
    stuck: str | None  # why the node cannot be drained; None: it can
    grace_period: int | None  # the policy's eviction.gracePeriodSeconds; None: each pod's own
    timeout: str  # the policy's eviction.timeout

    @property
    def drains(self) -> bool:
        """Whether its evictions let the change go ahead (the node is no overcommit then)."""
        return self.stuck is None


def foresee(
    *,
    node: str,
    policy: str,
    spec: RolloutSpec,
    pods: Iterable[PodRecord],
    resource: str,
    capacity: int,
) -> NodeEvictions | None:
    """The node's evictions, for a change whose pods would not fit; None unless under Evict."""
    if spec.podPolicy is not PodPolicy.EVICT:
        return None
    chosen = victims.choose(pods, resource=resource, capacity=capacity)
    return NodeEvictions(
        node=node,
        policy=policy,
        pods=chosen.evict,
        leaving=chosen.leaving,
        stuck=chosen.stuck,
        grace_period=spec.eviction.gracePeriodSeconds,
        timeout=spec.eviction.timeout,
    )


def drain_seconds(
    evictions: NodeEvictions, details: Mapping[str, PodDetails], *, write_qps: float
) -> float:
    """From the taint to the last pod gone, if no budget holds an eviction back: the taint and
    one eviction per pod at the write rate (all asked for at once), then the longest grace
    period (the policy's, or each pod's own terminationGracePeriodSeconds)."""
    gone = (*evictions.pods, *evictions.leaving)
    if evictions.grace_period is not None:
        grace = evictions.grace_period if gone else 0
    else:
        grace = max(
            (_grace(details.get(pod.uid)) for pod in gone),
            default=0,
        )
    return (len(evictions.pods) + 1) / write_qps + grace


def _grace(details: PodDetails | None) -> int:
    return details.grace_period if details is not None else DEFAULT_GRACE_PERIOD
