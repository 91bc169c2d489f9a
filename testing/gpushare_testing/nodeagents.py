"""The NVIDIA agents of one node as a state machine: config manager, device plugin, GFD.

Pure like ``agents``: the caller passes the clock (``now``, monotonic seconds) and the config
manager's view of the ConfigMap, feeds the label it observes, and asks for the node's desired
status and labels and for the next moment something is due.  ``GpuClusterSimulator`` does the
I/O and the waiting.  The rules and their sources are in ``docs/simulator.md``; in short:

- The config manager reacts only to a change of the ``nvidia.com/device-plugin.config`` label.
  It links the key the label names and signals the plugin; when the key is already linked it
  does nothing.  A key missing from its view is an error: it exits, and kubelet restarts it
  with back-off; on each restart it reads the label anew.
- The device plugin restarts on that signal: kubelet shows its resources as unhealthy
  (capacity kept, allocatable 0) for ``restart_window`` seconds, then the new ones.  It reads
  the linked key's content when it starts; a config it refuses makes it crash-loop with
  back-off (allocatable stays 0) until a start finds a config it accepts.
- GFD relabels once the plugin is back with the same config (it refuses what the plugin
  refuses); each pass is counted so that the caller can stamp ``gfd.timestamp``.
- A GPU that fails its health check (``lose_gpus``) stays in capacity and leaves allocatable,
  with every device the plugin made of it (``replicas`` of them), until ``restore_gpus``:
  a plugin restart does not bring it back.  GFD's labels do not change.
- A device-plugin outage (``stop_plugin``: its pod gone, the config manager with it) leaves
  capacity and zeroes allocatable until ``start_plugin``; label changes meanwhile are read when
  the pod starts again, as its init container does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from gpushare_testing.agents import (
    MISSING,
    NO_SHARING,
    Sharing,
    backoff_delay,
    parse_device_plugin_config,
    resolve_config_key,
)
from gpushare_testing.bodyparts import GPU_RESOURCE, SHARED_GPU_RESOURCE
from gpushare_testing.miglabels import (
    MigNode,
    mig_gfd_labels,
    mig_plugin_resources,
    stale_gfd_labels,
    strategy_of,
)
from gpushare_testing.migmanager import Layout, disabled

__all__ = ["NodeAgents", "Timing"]

_UNSEEN: Final = object()  # the config manager has not read the label yet
_UNLINKED: Final = object()  # config.yaml links to nothing known (forces the first restart)


@dataclass(frozen=True, slots=True)
class Timing:
    """How long the agents take; every one is ON by default (0 switches it off)."""

    restart_window: float = 2.0
    backoff_initial: float = 0.5
    backoff_cap: float = 8.0


@dataclass(slots=True)
class NodeAgents:
    """The agents of one node.  ``view`` arguments are the config manager's ConfigMap data."""

    gpus: int
    timing: Timing = field(default_factory=Timing)
    label: object = _UNSEEN
    linked: object = _UNLINKED  # a key, None (the empty config) or _UNLINKED
    sharing: Sharing = NO_SHARING  # what the plugin last came up with
    capacity: dict[str, str | None] = field(default_factory=dict)
    registered: set[str] = field(default_factory=set)
    plugin_up: bool = True
    plugin_start_at: float | None = None  # the plugin is down; it (re)starts then
    plugin_failures: int = 0  # refused starts since the last good one
    cm_restart_at: float | None = None  # the config manager crash-loops; restarts then
    cm_failures: list[float] = field(default_factory=list)  # since the last good run
    gfd_sharing: Sharing = NO_SHARING
    gfd_passes: int = 0
    restarts: int = 0  # plugin starts that came up with a config after a signal
    lost: int = 0  # GPUs the plugin reports unhealthy (failed health check), until restored
    outage: bool = False  # the device-plugin pod is gone, its config manager with it
    mig: MigNode = field(default_factory=lambda: MigNode(product="", memory_mib=0, layout=()))
    gfd_mig: MigNode | None = None  # the GPUs as GFD last saw them (None: as ``mig``)

    def __post_init__(self) -> None:
        if len(self.mig.layout) != self.gpus:  # every GPU starts with MIG disabled
            self.mig = replace(self.mig, layout=disabled(self.gpus))

    @classmethod
    def start(
        cls,
        *,
        gpus: int,
        capacity: Mapping[str, str],
        label: str | None,
        view: Mapping[str, str],
        timing: Timing,
        now: float,
        mig: MigNode | None = None,
    ) -> NodeAgents:
        """The agents of a node just registered, unshared, as ``bodies.gpu_node`` makes it.

        The config-manager init container linked the label's key before the plugin started; if
        that key's config is unshared, the plugin already runs it.  Otherwise (or when the key
        is missing) the first label read goes through the ordinary path, restart included.
        """
        agents = cls(gpus=gpus, timing=timing, mig=mig or MigNode("", 0, ()))
        agents.capacity = {
            r: capacity[r]
            for r in capacity
            if r in (GPU_RESOURCE, SHARED_GPU_RESOURCE) or r.startswith("nvidia.com/mig-")
        }
        agents.registered = set(agents.capacity)
        key = resolve_config_key(label, view)
        text = "" if key is None or key is MISSING else view[str(key)]
        sharing = None if key is MISSING else parse_device_plugin_config(text)
        if sharing is not None and _unshared(sharing):
            agents.label, agents.linked = label, key
        else:
            agents.see_label(label, now=now, view=view)
        return agents

    # -- inputs ------------------------------------------------------------------------------

    def see_label(self, label: str | None, *, now: float, view: Mapping[str, str]) -> None:
        """The config manager's informer saw the node with this config label."""
        if label == self.label:
            return  # config-manager only acts on a change of the label value
        self.label = label
        if self.cm_restart_at is None and not self.outage:
            self._config_manager_run(now=now, view=view)
        # else: it is crash-looping (or gone); it reads the label when kubelet restarts it

    def advance(self, *, now: float, view: Mapping[str, str]) -> None:
        """Run every timer due at ``now`` (back-off restarts, the end of a plugin restart)."""
        while True:
            due = [t for t in (self.cm_restart_at, self.plugin_start_at) if t is not None]
            if not due or min(due) > now:
                return
            if self.cm_restart_at is not None and self.cm_restart_at <= now:
                self.cm_restart_at = None
                self._config_manager_run(now=now, view=view)
            elif self.plugin_start_at is not None and self.plugin_start_at <= now:
                self._plugin_start(now=now, view=view)

    def lose_gpus(self, count: int) -> None:
        """``count`` more GPUs fail their health check (an XID error, a GPU fallen off the bus)."""
        self.lost = min(self.gpus, self.lost + count)

    def set_mig_layout(self, layout: Layout) -> None:
        """The MIG manager changed the GPUs: the plugin and GFD see it when they next start."""
        self.mig = replace(self.mig, layout=layout)

    def gfd_labels(self, labels: Mapping[str, str]) -> dict[str, str | None]:
        """The label patch of one GFD pass: what changed, and the stale labels removed."""
        wanted = mig_gfd_labels(labels, sharing=self.gfd_sharing, node=self.gfd_mig or self.mig)
        patch: dict[str, str | None] = {k: v for k, v in wanted.items() if labels.get(k) != v}
        patch |= dict.fromkeys(stale_gfd_labels(labels, wanted))
        return patch

    def restore_gpus(self) -> None:
        """The failed GPUs are healthy again (replaced, or the node rebooted)."""
        self.lost = 0

    def stop_plugin(self) -> None:
        """The device-plugin pod goes away (evicted, deleted, its node's runtime stuck): no
        timer of its containers runs until it is back."""
        self.outage = True
        self.plugin_up = False
        self.plugin_start_at = None
        self.cm_restart_at = None

    def start_plugin(self, *, now: float, view: Mapping[str, str]) -> None:
        """The pod is back: its config manager links what the label names now, and the plugin
        starts with that config (after the usual restart window)."""
        if not self.outage:
            return
        self.outage = False
        self.cm_failures.clear()
        self.plugin_failures = 0
        self.linked = _UNLINKED  # a new pod: nothing linked yet, so the plugin starts anew
        self._config_manager_run(now=now, view=view)

    # -- outputs -----------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        due = [t for t in (self.cm_restart_at, self.plugin_start_at) if t is not None]
        return min(due) if due else None

    def settled(self, view: Mapping[str, str]) -> bool:
        """Nothing will change without an outside event: no pending timer would succeed.

        A crash loop whose next run would fail again with this view is settled; it retries for
        ever (as the real one does), but only a new label or ConfigMap can make it succeed.
        """
        if self.plugin_start_at is not None and (
            self.plugin_failures == 0 or self._start_resources(view) is not None
        ):
            return False
        if self.cm_restart_at is not None:
            label = self.label if isinstance(self.label, str) else None
            if resolve_config_key(label, view) is not MISSING:
                return False
        return True

    def status(self) -> dict[str, dict[str, str | None]]:
        """The capacity and allocatable kubelet shows for the GPU resources."""
        if self.plugin_up:
            return {"capacity": dict(self.capacity), "allocatable": self._healthy()}
        # Plugin gone (restarting or crash-looping): kubelet's device manager marks its
        # devices unhealthy, which keeps them in capacity and takes them out of allocatable.
        down = {k: (None if v is None else "0") for k, v in self.capacity.items()}
        return {"capacity": dict(self.capacity), "allocatable": down}

    def _healthy(self) -> dict[str, str | None]:
        """Allocatable with the plugin up: kubelet's device manager counts healthy devices only,
        and each device of a failed GPU (one per replica) is unhealthy."""
        allocatable = dict(self.capacity)
        if self.lost and self.mig.mig_enabled and strategy_of(self.sharing, self.mig) != "none":
            served = mig_plugin_resources(
                sharing=self.sharing, node=self.mig, registered=self.registered, lost=self.lost
            )
            return {k: (served or {}).get(k, v) for k, v in allocatable.items()}
        resource = self.sharing.advertised
        count = allocatable.get(resource)
        if self.lost and count is not None:
            healthy = int(count) - self.lost * self.sharing.replicas
            allocatable[resource] = str(max(0, healthy))
        return allocatable

    # -- the agents --------------------------------------------------------------------------

    def _config_manager_run(self, *, now: float, view: Mapping[str, str]) -> None:
        label = self.label if isinstance(self.label, str) else None
        key = resolve_config_key(label, view)
        if key is MISSING:
            self.cm_failures.append(now)
            delay = backoff_delay(
                len(self.cm_failures),
                initial=self.timing.backoff_initial,
                cap=self.timing.backoff_cap,
            )
            self.cm_restart_at = now + delay
            return
        self.cm_failures.clear()
        if key == self.linked:
            return  # "Already configured. Skipping update..."
        self.linked = key
        if self.plugin_failures:
            return  # crash-looping plugin: its next back-off start reads the new link
        # SIGHUP: the plugin stops its servers and starts again with the linked config.
        self.plugin_up = False
        self.plugin_start_at = now + self.timing.restart_window

    def _linked_config(self, view: Mapping[str, str]) -> Sharing | None:
        if self.linked is None:
            return NO_SHARING
        if not isinstance(self.linked, str) or self.linked not in view:
            return None  # a dangling link: the plugin cannot read its config file
        return parse_device_plugin_config(view[self.linked])

    def _start_resources(self, view: Mapping[str, str]) -> dict[str, str | None] | None:
        """What the plugin would serve if it started now; ``None``: it would exit."""
        sharing = self._linked_config(view)
        if sharing is None:
            return None
        return mig_plugin_resources(sharing=sharing, node=self.mig, registered=self.registered)

    def _plugin_start(self, *, now: float, view: Mapping[str, str]) -> None:
        sharing = self._linked_config(view)
        resources = self._start_resources(view)
        if sharing is not None and resources is None and not self.plugin_failures:
            # The plugin refuses these MIG devices; GFD, a pod of its own, labels them anyway.
            self.gfd_sharing, self.gfd_mig = sharing, self.mig
            self.gfd_passes += 1
        if resources is None or sharing is None:
            self.plugin_failures += 1
            delay = backoff_delay(
                self.plugin_failures,
                initial=self.timing.backoff_initial,
                cap=self.timing.backoff_cap,
            )
            self.plugin_start_at = now + max(delay, self.timing.restart_window)
            return
        self.plugin_start_at = None
        self.plugin_failures = 0
        self.plugin_up = True
        self.sharing = sharing
        self.capacity = resources
        self.registered |= {k for k, v in self.capacity.items() if v is not None}
        self.restarts += 1
        # GFD's own config manager follows the same label; it relabels once it is back.
        self.gfd_sharing, self.gfd_mig = sharing, self.mig
        self.gfd_passes += 1


def _unshared(sharing: Sharing) -> bool:
    """A config the plugin runs exactly as it runs none: no sharing, and no MIG strategy that
    could change what it serves."""
    return sharing == NO_SHARING and not sharing.replicated
