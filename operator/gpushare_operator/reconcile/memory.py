"""What the write path has learned from its own plans and writes, in this process.

Only ``Reconciler.learn`` changes it; the planners read it.  None of it is a promise to the
cluster: a new leader starts without it and learns it again from its first plans and writes
(a refused label write, an older CRD that drops status fields, the ConfigMap's namespace
missing), at the cost of one write each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpushare_operator.core.statusdiff import Path


@dataclass
class WriteMemory:
    # node -> when its held-back Pending status ends (see Timings.pending_hold); only nodes
    # whose last plan held one back.
    held: dict[str, float] = field(default_factory=dict)
    # node -> why its labels cannot be written (a 403 after an RBAC change, a 422): shown in
    # its status until a label write succeeds.
    node_problems: dict[str, str] = field(default_factory=dict)
    # Why the device-plugin ConfigMap cannot be written (its namespace missing, say); shown on
    # every policy until a write succeeds.
    config_error: str | None = None
    # Status fields the installed CRDs drop, per kind ("nodestate", "policy"): left out of
    # renders, so that an older schema costs a condition, not a rewrite loop.  A path enters
    # only once it was dropped twice in a row (``suspected`` holds the first time).
    pruned: dict[str, frozenset[Path]] = field(default_factory=dict)
    suspected: dict[str, frozenset[Path]] = field(default_factory=dict)
    # The last status rendered per policy, written or not: what /metrics reports.
    rendered_policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    # ConfigMap keys shaped like ours that another field manager owns: key -> its managers.
    foreign_keys: dict[str, str] = field(default_factory=dict)
    # Our ConfigMap keys that no node names, and since when (their grace period runs).
    unused_since: dict[str, float] = field(default_factory=dict)
    # The mig-parted ConfigMap's: our layout names no node names, and since when; and who
    # else owns (or broke) config.yaml, which is then left alone.
    mig_unused_since: dict[str, float] = field(default_factory=dict)
    mig_foreign: dict[str, str] = field(default_factory=dict)
    mig_config_error: str | None = None  # why it cannot be written; on every MIG policy
    # node -> the other field managers that own our labels on it too: our release apply gave
    # up our ownership and the labels stayed.  Reported on the node; it holds no finalizer and
    # counts against no budget.  A new leader learns it again from its first release apply.
    release_blocked: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # podPolicy Evict, per pod uid: when we last had an eviction of it accepted (not asked
    # again while its watch event is on its way), and the node it was evicted from (counted
    # done once it is gone).  A new leader asks again; the API server answers the same.
    evicted: dict[str, tuple[float, str]] = field(default_factory=dict)
    # pod uid -> (refusals in a row, not to be asked again before): a PodDisruptionBudget
    # answered 429; the next attempt backs off.
    eviction_refused: dict[str, tuple[int, float]] = field(default_factory=dict)
    # pod uid -> the PodDisruptionBudgets (namespace/name) its last refusal named.
    eviction_blockers: dict[str, tuple[str, ...]] = field(default_factory=dict)
