"""The device-plugin ConfigMap as it should be: every policy's key, and old keys for a while.

A key is never edited in place, and deleted only once no node has named it for the grace
period (a node's config manager may still read it); keys shaped like ours that another field
manager owns are never planned, compared or deleted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpushare_operator.cache.cluster import ClusterCache
from gpushare_operator.core import backends
from gpushare_operator.core.api.models import FIELD_MANAGER
from gpushare_operator.core.deviceplugin import devconfigs
from gpushare_operator.reconcile.memory import WriteMemory
from gpushare_operator.reconcile.plans import ConfigPlan

# Keys this operator renders: `default`, `<policy>-<ts|mps><replicas>-<6 hex>`, `<policy>-excl-<6
# hex>` and `<policy>-mig[<replicas>]-<6 hex>`; a MIG key left out would be rewritten every time.
OUR_KEY = re.compile(r"^(default|([a-z0-9.-]+-)?(ts\d+|mps\d+|excl|mig\d*)-[0-9a-f]{6})$")


@dataclass(frozen=True, slots=True)
class Desired:
    data: dict[str, str]  # every key the ConfigMap should hold
    unused_since: dict[str, float]  # our keys no node names, and since when
    recheck_at: float | None  # the first of their grace periods ends then


class ConfigPlanner:
    """Pure: reads the cache and what ``Reconciler.learn`` recorded of earlier plans."""

    def __init__(self, cache: ClusterCache, *, grace_period: float, memory: WriteMemory) -> None:
        self.cache = cache
        self.grace_period = grace_period
        self._memory = memory

    def desired(self, *, foreign: Mapping[str, str] | None = None) -> Desired:
        """Every key the ConfigMap should hold; ``foreign``: the keys others own (by default
        those the last plan found)."""
        cache = self.cache
        foreign = self._memory.foreign_keys if foreign is None else foreign
        wanted = {devconfigs.DEFAULT_KEY: devconfigs.render_default_text()}
        for policy in cache.policies.values():
            wanted.update(backends.of(policy).renders(policy).config)
        now = cache.clock()
        known = self._memory.unused_since
        unused: dict[str, float] = {}
        recheck: float | None = None
        for key, text in (cache.config_data or {}).items():
            if key in wanted or not OUR_KEY.match(key) or key in foreign:
                continue
            if cache.config_label_counts.get(key):
                wanted[key] = text  # a node still names it
                continue
            since = unused[key] = known.get(key, now)
            expires = since + self.grace_period
            if now < expires:
                wanted[key] = text
                recheck = expires if recheck is None else min(recheck, expires)
        return Desired(wanted, unused, recheck)

    def _foreign(self, data: Mapping[str, str]) -> dict[str, str]:
        """Keys shaped like ours that only other field managers own: key -> managers."""
        owners = self.cache.config_owners
        return {
            key: ", ".join(sorted(owners[key]))
            for key in data
            if key in owners and FIELD_MANAGER not in owners[key] and OUR_KEY.match(key)
        }

    def plan(self) -> ConfigPlan:
        """The ConfigMap data to apply (None when the cluster already shows it), and what
        planning saw: the foreign keys and the unused keys' clocks."""
        cache = self.cache
        if not cache.config_synced:
            memory = self._memory
            return ConfigPlan(None, memory.foreign_keys, memory.unused_since)
        data = cache.config_data or {}
        foreign = self._foreign(data)
        desired = self.desired(foreign=foreign)
        wanted = {k: v for k, v in desired.data.items() if k not in foreign}
        actual = {k: v for k, v in data.items() if OUR_KEY.match(k) and k not in foreign}
        shown = cache.config_data is not None and wanted == actual
        sent = cache.in_flight.get(("configmap", "")) == wanted
        return ConfigPlan(
            None if shown or sent else wanted,
            foreign_keys=foreign,
            unused_since=desired.unused_since,
            recheck_at=desired.recheck_at,
        )
