"""The one work queue of the write path, with the semantics of client-go's workqueue.

Contract (every point is a unit test in ``tests/unit/test_workqueue.py``):

- **De-duplication.** A key (``(kind, name)``) is queued at most once, however often it is
  marked; ``len`` counts distinct keys waiting.
- **Single flight.** ``get`` hands a key out and marks it *processing*; until ``done`` it is
  never handed out again.  A key marked while processing is not lost: ``done`` queues it again.
- **Delayed adds.** ``add_after`` queues a key once its time has come (a timer, e.g. the end of
  a propagation wait); an earlier timer for the same key wins, so repeated re-plans asking for
  the same deadline keep one entry.  ``next_due`` says when the next timer fires.
- **Per-key back-off.** ``failed`` queues the key again after an exponential delay with full
  jitter: ``uniform(0, min(cap, base * 2**failures))`` (at least ``base``), growing from about
  5 ms to a cap of minutes; ``succeeded`` resets it.  A key that keeps failing thus asks for
  fewer and fewer writes, and cannot starve the others through the shared token bucket.
- **Waiting since.** ``waiting_since`` is when a key was first marked since it was last done
  with nothing pending: a held-back write (a policy status waiting for its nodes) is bounded by
  it.
- **Order.** Within a kind, keys come out first-marked first; ``get(kind)`` takes one kind,
  ``take(key)`` one key, and ``postpone`` holds a queued key back until a time.

It is pure (a clock and a random source are passed in, no asyncio).  The cache marks what its
events affect; everything else that acts on the queue is the write loop's one switch on a
write's outcome (``kube.writeloop``).  Everything about a key goes with ``forget``.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Collection, Iterable
from typing import Final

from gpushare_operator.core.api import defaults

Key = tuple[str, str]  # (kind, name)

NODE: Final = "node"
POLICY: Final = "policy"
CONFIG: Final = "config"
CONFIG_KEY: Final = (CONFIG, "")
MIG_CONFIG: Final = "mig"  # the name of the mig-parted ConfigMap's key (kind CONFIG)
MIG_CONFIG_KEY: Final = (CONFIG, MIG_CONFIG)
DEVICE_CLASSES: Final = "deviceclasses"  # our DeviceClasses, all at once (kind CONFIG)
DEVICE_CLASSES_KEY: Final = (CONFIG, DEVICE_CLASSES)

DEFAULT_BASE: Final = 0.005


class WorkQueue:
    def __init__(
        self,
        *,
        clock: Callable[[], float],
        rng: random.Random | None = None,
        base: float = DEFAULT_BASE,
        cap: float = defaults.WRITE_BACKOFF_CAP,
    ) -> None:
        self._clock = clock
        self._rng = rng or random.Random()
        self.base = base
        self.cap = cap
        # kind -> names waiting to be handed out, first marked first.  A key here is never in
        # _processing: marking a key that is being written goes to _again instead.
        self._queued: dict[str, dict[str, None]] = {}
        # Keys handed out (get, take) and not yet done.  Never in _queued.
        self._processing: set[Key] = set()
        # Keys marked while processing: always a subset of _processing; done() queues them.
        self._again: set[Key] = set()
        # A heap of (when, kind, name).  It may hold superseded entries; the live timer of a key
        # is the entry equal to _due[key], and every key in _due has its entry here.
        self._timers: list[tuple[float, str, str]] = []
        # The earliest live timer per key.
        self._due: dict[Key, float] = {}
        # Keys taken out of the queue until a time (a held-back write): each has a timer in
        # _due.  Other timers (a deadline to look at again) are no work yet.
        self._postponed: set[Key] = set()
        # Failed writes in a row per key; absent once a write of the key succeeded.
        self._failures: dict[Key, int] = {}
        # When the key was first marked since it was last done with nothing pending; only ever
        # held for a pending key (queued, processing, or on a timer).
        self._since: dict[Key, float] = {}
        # Called on every mark, so that a sleeping write loop looks again.
        self._wake: Callable[[], None] = lambda: None

    def set_waker(self, wake: Callable[[], None]) -> None:
        """Installed by the writer, so that marking something wakes it."""
        self._wake = wake

    # -- marking (the cache's side) ----------------------------------------------------------

    def add(self, key: Key) -> None:
        self._since.setdefault(key, self._clock())
        if key in self._processing:
            self._again.add(key)
        else:
            self._queued.setdefault(key[0], {})[key[1]] = None
        self._wake()

    def node(self, name: str) -> None:
        self.add((NODE, name))

    def many_nodes(self, names: Iterable[str]) -> None:
        for name in names:
            self.add((NODE, name))

    def first(self, kind: str, names: Collection[str]) -> None:
        """Queue ``names`` ahead of everything else of ``kind`` (nodes a rollout has just
        admitted go before status-only work).  One rebuild of the kind's queue per call."""
        if not names:
            return
        now = self._clock()
        ahead: dict[str, None] = {}
        for name in names:
            key = (kind, name)
            self._since.setdefault(key, now)
            if key in self._processing:
                self._again.add(key)
            else:
                ahead[name] = None
        rest = self._queued.get(kind, {})
        self._queued[kind] = ahead | {name: None for name in rest if name not in ahead}
        self._wake()

    def policy(self, name: str) -> None:
        self.add((POLICY, name))

    def many_policies(self, names: Iterable[str]) -> None:
        for name in names:
            self.add((POLICY, name))

    def config(self) -> None:
        """Both ConfigMaps and our DeviceClasses: what changes the device-plugin keys in use (a
        policy, a node's label) can change the MIG layouts and the DRA classes in use too."""
        self.add(CONFIG_KEY)
        self.add(MIG_CONFIG_KEY)
        self.add(DEVICE_CLASSES_KEY)

    # -- timers and back-off -------------------------------------------------------------------

    def add_after(self, key: Key, delay: float) -> None:
        """Queue ``key`` in ``delay`` seconds (at once if ``delay <= 0``)."""
        if delay <= 0:
            self.add(key)
            return
        when = self._clock() + delay
        if self._due.get(key, float("inf")) <= when:
            return  # an earlier timer already covers it
        self._due[key] = when
        heapq.heappush(self._timers, (when, *key))
        self._wake()

    def add_at(self, key: Key, when: float) -> None:
        """Queue ``key`` at ``when`` on the queue's clock."""
        self.add_after(key, when - self._clock())

    def failed(self, key: Key) -> float:
        """The write of ``key`` failed: queue it again after its back-off; return the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        ceiling = min(self.cap, self.base * 2.0**failures)
        delay = max(self.base, self._rng.uniform(0.0, ceiling))
        self.add_after(key, delay)
        return delay

    def succeeded(self, key: Key) -> None:
        """The write of ``key`` worked: its back-off starts again from the bottom."""
        self._failures.pop(key, None)

    def failures(self, key: Key) -> int:
        return self._failures.get(key, 0)

    def next_due(self) -> float | None:
        """Move the timers whose time has come into the queue; return when the next fires."""
        now = self._clock()
        timers = self._timers
        while timers and timers[0][0] <= now:
            when, kind, name = heapq.heappop(timers)
            key = (kind, name)
            if self._due.get(key) == when:
                del self._due[key]
                self._postponed.discard(key)
                self.add(key)
        while timers and self._due.get((timers[0][1], timers[0][2])) != timers[0][0]:
            heapq.heappop(timers)  # superseded by an earlier timer for the same key
        return timers[0][0] if timers else None

    # -- taking work (the writer's side) ------------------------------------------------------

    def get(self, kind: str) -> str | None:
        """The next queued name of ``kind``, now processing; None when there is none."""
        names = self._queued.get(kind)
        if not names:
            return None
        name = next(iter(names))
        del names[name]
        self._processing.add((kind, name))
        return name

    def take(self, key: Key) -> bool:
        """Hand out ``key`` itself if it is queued (now processing); False if it is not."""
        names = self._queued.get(key[0])
        if names is None or key[1] not in names:
            return False
        del names[key[1]]
        self._processing.add(key)
        return True

    def postpone(self, key: Key, when: float) -> None:
        """Take a queued ``key`` out of the queue until ``when`` (a held-back write); its
        waiting time keeps counting from when it was first marked."""
        self._queued.get(key[0], {}).pop(key[1], None)
        self.add_at(key, when)
        if key in self._due:
            self._postponed.add(key)

    def done(self, key: Key) -> None:
        """Processing of ``key`` ended; queue it again if it was marked meanwhile (its wait
        then starts now: what it waited for before was just written)."""
        self._processing.discard(key)
        if key in self._again:
            self._again.discard(key)
            self._queued.setdefault(key[0], {})[key[1]] = None
            self._since[key] = self._clock()
            self._wake()
        elif not self.pending(key):
            self._since.pop(key, None)

    def forget(self, key: Key) -> None:
        """Drop everything about ``key`` (its object is gone)."""
        self._queued.get(key[0], {}).pop(key[1], None)
        self._again.discard(key)
        self._due.pop(key, None)
        self._failures.pop(key, None)
        self._since.pop(key, None)

    # -- reading -------------------------------------------------------------------------------

    def pending(self, key: Key) -> bool:
        """Queued, processing, marked again, or waiting on a timer."""
        return key[1] in self._queued.get(key[0], {}) or key in self._processing or key in self._due

    @property
    def nodes(self) -> Collection[str]:
        """Node names queued now (a live view)."""
        return self._queued.get(NODE, {}).keys()

    @property
    def policies(self) -> Collection[str]:
        return self._queued.get(POLICY, {}).keys()

    @property
    def configmap(self) -> bool:
        return self.is_queued(CONFIG_KEY)

    def timers(self, kind: str) -> int:
        """Keys of ``kind`` waiting on a timer."""
        return sum(1 for k in self._due if k[0] == kind)

    def postponed(self, kind: str) -> int:
        """Keys of ``kind`` held back until a time: work waiting, unlike a plain timer."""
        return sum(1 for k in self._postponed if k[0] == kind)

    def retrying(self) -> int:
        """Keys whose last write failed and that wait for their back-off."""
        return len(self._failures)

    def queued(self, kind: str) -> int:
        return len(self._queued.get(kind, ()))

    def is_queued(self, key: Key) -> bool:
        return key[1] in self._queued.get(key[0], {})

    def processing(self, kind: str) -> set[str]:
        return {name for k, name in self._processing if k == kind}

    def waiting_since(self, key: Key) -> float | None:
        return self._since.get(key)

    def __len__(self) -> int:
        return sum(len(names) for names in self._queued.values())

    def __bool__(self) -> bool:
        return any(self._queued.values())

    def sizes(self) -> dict[str, int]:
        """Entries per internal structure: the soak test holds these to their baseline."""
        return {
            "queued": len(self),
            "processing": len(self._processing),
            "again": len(self._again),
            "timers": len(self._due),
            "failures": len(self._failures),
            "since": len(self._since),
        }
