"""The mig-parted ConfigMap as the operator last saw it: its layouts by name, and since when.

One ConfigMap (``gpushare-mig-parted-config``) with one key (``config.yaml``) that gpushare
owns whole; the GPU Operator's MIG manager reads it through a mounted volume, which the kubelet
refreshes only periodically, exactly as the device plugin's config manager reads its own.  So a
layout name is put on a node only once the propagation delay has passed since the name was
first seen (``seen_at``), and names are dropped only after no node has named them for the
grace period.  Fed by the ConfigMap informer and by our own write's answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.mig.migconfigs import MigLayout


class MigConfigState:
    def __init__(self, *, clock: Callable[[], float], wallclock: Callable[[], float]) -> None:
        self._clock = clock
        self._wallclock = wallclock
        self.synced = False
        self.present = False  # the ConfigMap exists
        self.text: str | None = None  # config.yaml as stored; None: absent
        self.version: int | None = None  # resourceVersion of what ``text`` shows
        # Field managers of config.yaml (from managedFields): another manager's file is left alone.
        self.owners: frozenset[str] = frozenset()
        # Name -> layout (None: all-disabled) when ``text`` is a file gpushare renders; None
        # when it is not (someone else's, or broken): then it is never overwritten.
        self.layouts: dict[str, MigLayout | None] | None = {}
        # Every name in ``layouts`` -> when it was first seen (monotonic; -inf: at startup).
        self.seen_at: dict[str, float] = {}
        self.seen_wall: dict[str, float] = {}  # the same moments on the wall clock
        # nvidia.com/mig.config value -> how many nodes carry it (kept by ClusterCache).
        self.label_counts: Counter[str] = Counter()

    def set(
        self,
        data: Mapping[str, str] | None,
        *,
        initial: bool,
        version: str | None,
        owners: Mapping[str, frozenset[str]] | None,
    ) -> bool:
        """Record the ConfigMap (None: absent); True when what it configures changed."""
        number = int(version) if version and version.isdigit() else None
        if number is not None and self.version is not None and number < self.version:
            return False  # older than our own write's answer
        self.version = number
        if owners is not None or data is None:
            self.owners = (owners or {}).get(migconfigs.CONFIGMAP_KEY, frozenset())
        text = None if data is None else data.get(migconfigs.CONFIGMAP_KEY)
        changed = text != self.text or self.present != (data is not None) or not self.synced
        self.present = data is not None
        self.text = text
        self.layouts = {} if text is None else migconfigs.parse_text(text)
        now, wall = self._clock(), self._wallclock()
        names = set(self.layouts or {})
        for name in names - set(self.seen_at):
            self.seen_at[name] = float("-inf") if initial else now
            self.seen_wall[name] = float("-inf") if initial else wall
        for name in set(self.seen_at) - names:
            del self.seen_at[name]
            self.seen_wall.pop(name, None)
        self.synced = True
        return changed

    def settle_initial(self) -> None:
        """A name present at startup that no node names may be seconds old (a leader wrote it
        and died): it waits the propagation delay from now, as device-plugin keys do."""
        now, wall = self._clock(), self._wallclock()
        for name, seen in self.seen_at.items():
            if seen == float("-inf") and not self.label_counts.get(name):
                self.seen_at[name] = now
                self.seen_wall[name] = wall

    def count(self, value: str | None, delta: int) -> None:
        if value is None:
            return
        counts = self.label_counts
        counts[value] += delta
        if counts[value] <= 0:
            del counts[value]
