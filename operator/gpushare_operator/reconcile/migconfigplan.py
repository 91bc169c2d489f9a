"""The mig-parted ConfigMap as it should be: every MIG policy's layouts, and old ones a while.

gpushare owns the whole file (``config.yaml``): it holds ``all-disabled`` and one content-hashed
name per layout in use.  A layout is never edited in place (a new layout is a new name, so a
node-label change, which is what makes the MIG manager act), and a name is dropped only once
no node has named it for the grace period.  A file that gpushare did not render (someone
else's, or broken), or that another field manager owns, is never overwritten: MIG policies say
so instead.  With no MIG policy and no ConfigMap, nothing is written at all.
"""

from __future__ import annotations

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import backends
from gpushare_operator.core.api.models import FIELD_MANAGER
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.mig.migconfigs import MigLayout
from gpushare_operator.core.workqueue import MIG_CONFIG
from gpushare_operator.reconcile.memory import WriteMemory
from gpushare_operator.reconcile.plans import ConfigPlan


class MigConfigPlanner:
    """Pure: reads the cache and what ``Reconciler.learn`` recorded of earlier plans."""

    def __init__(self, cache: ClusterCache, *, grace_period: float, memory: WriteMemory) -> None:
        self.cache = cache
        self.grace_period = grace_period
        self._memory = memory

    def wanted(self) -> dict[str, MigLayout]:
        """The layouts of every usable MIG policy, by name (a deleted one's until it lets go)."""
        wanted: dict[str, MigLayout] = {}
        for policy in self.cache.policies.values():
            wanted.update(backends.of(policy).renders(policy).layouts)
        return wanted

    def foreign(self) -> dict[str, str]:
        """config.yaml -> why it is not ours to write; {} when it is."""
        state = self.cache.mig_config
        others = sorted(state.owners - {FIELD_MANAGER})
        if state.text is not None and others and FIELD_MANAGER not in state.owners:
            return {migconfigs.CONFIGMAP_KEY: f"owned by field manager {', '.join(others)}"}
        if state.text is not None and state.layouts is None:
            return {migconfigs.CONFIGMAP_KEY: "not a mig-parted config gpushare renders"}
        return {}

    def plan(self) -> ConfigPlan:
        cache, memory = self.cache, self._memory
        state = cache.mig_config
        if not state.synced:
            return ConfigPlan(None, memory.mig_foreign, memory.mig_unused_since, target=MIG_CONFIG)
        foreign = self.foreign()
        wanted = self.wanted()
        if foreign or (not wanted and not state.present):
            return ConfigPlan(None, foreign, {}, target=MIG_CONFIG)
        now = cache.clock()
        unused: dict[str, float] = {}
        recheck: float | None = None
        for name, layout in (state.layouts or {}).items():
            if layout is None or name in wanted:
                continue
            if state.label_counts.get(name):
                wanted[name] = layout  # a node still names it
                continue
            since = unused[name] = memory.mig_unused_since.get(name, now)
            expires = since + self.grace_period
            if now < expires:
                wanted[name] = layout
                recheck = expires if recheck is None else min(recheck, expires)
        text = migconfigs.render_text(wanted)
        sent = cache.in_flight.get(("configmap", MIG_CONFIG))
        data = {migconfigs.CONFIGMAP_KEY: text}
        shown = state.text == text or sent == data
        return ConfigPlan(
            None if shown else data,
            foreign_keys=foreign,
            unused_since=unused,
            recheck_at=recheck,
            target=MIG_CONFIG,
        )
