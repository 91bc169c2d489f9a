"""The device-plugin ConfigMap as it should be: every policy's key, and old keys for a while.

A key is never edited in place, and deleted only once no node has named it for the grace
period (a node's config manager may still read it); keys shaped like ours that another field
manager owns are never planned, compared or deleted.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from gpushare_operator.cache.state import ClusterState
from gpushare_operator.core import devconfigs
from gpushare_operator.core.models import FIELD_MANAGER

# Keys this operator renders: `default` and `<policy>-<ts|mps><replicas>-<6 hex>`.
OUR_KEY = re.compile(r"^(default|([a-z0-9.-]+-)?(ts\d+|mps\d+|excl)-[0-9a-f]{6})$")

Recheck = Callable[[float | None, str, str], None]


class ConfigPlanner:
    def __init__(self, state: ClusterState, *, grace_period: float, recheck: Recheck) -> None:
        self.state = state
        self.grace_period = grace_period
        self._recheck = recheck
        self._unused_since: dict[str, float] = {}
        # ConfigMap keys shaped like ours that another field manager owns: key -> manager.
        # Never fought over: left out of what we plan and of what we compare.
        self.foreign_keys: dict[str, str] = {}

    def desired(self) -> dict[str, str]:
        state = self.state
        wanted = {devconfigs.DEFAULT_KEY: devconfigs.render_default_text()}
        for policy in state.policies.values():
            if policy.config_key and policy.config_text:
                wanted[policy.config_key] = policy.config_text
        now = state.clock()
        for key in set(self._unused_since) - set(state.config_data or {}):
            del self._unused_since[key]  # gone from the ConfigMap: nothing left to time
        for key, text in (state.config_data or {}).items():
            if key in wanted or not OUR_KEY.match(key) or key in self.foreign_keys:
                self._unused_since.pop(key, None)
                continue
            if state.config_label_counts.get(key):
                self._unused_since.pop(key, None)
                wanted[key] = text  # a node still names it
                continue
            since = self._unused_since.setdefault(key, now)
            expires = since + self.grace_period
            if now < expires:
                wanted[key] = text
                self._recheck(expires, "config", "")
        return wanted

    def _foreign(self, data: Mapping[str, str]) -> dict[str, str]:
        """Keys shaped like ours that only other field managers own: key -> managers."""
        owners = self.state.config_owners
        return {
            key: ", ".join(sorted(owners[key]))
            for key in data
            if key in owners and FIELD_MANAGER not in owners[key] and OUR_KEY.match(key)
        }

    def plan(self) -> dict[str, str] | None:
        """The ConfigMap data to apply, or None when the cluster already shows it."""
        if not self.state.config_synced:
            return None
        data = self.state.config_data or {}
        self.foreign_keys = self._foreign(data)
        wanted = {k: v for k, v in self.desired().items() if k not in self.foreign_keys}
        actual = {k: v for k, v in data.items() if OUR_KEY.match(k) and k not in self.foreign_keys}
        if self.state.config_data is not None and wanted == actual:
            return None
        if self.state.in_flight.get(("configmap", "")) == wanted:
            return None
        return wanted
