"""The simulated MIG manager: one run per change of a node's ``nvidia.com/mig.config``.

The decisions are ``migmanager``'s; this module does the writes in the order the real manager
(NVIDIA/mig-parted ``pkg/mig/reconfigure/reconfigure.go``) makes them, as field manager
``nvidia-mig-manager``, and plays the parts of the node around it: the device-plugin and GFD
pods that go while their deploy labels are paused and come back after, the GPU's clients
(pods bound to the node that request an ``nvidia.com/`` resource and are not finished), and
the optional reboot (the node ``Ready=Unknown``, then ``Ready`` again).

Like the real manager's informer, a run starts for a change of the label's value only (the
value a node was created with counts as applied), an empty value starts nothing, and a change
during a run is taken once the run is over (the latest value only).  A ``failed`` run is not
retried until the label changes again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from gpushare_testing.migmanager import (
    CONFIG_LABEL,
    DEPLOY_LABELS,
    STATE_LABEL,
    GpuMig,
    Target,
    apply_layout,
    mode_changes,
    paused_labels,
    restored_labels,
    select_target,
)
from gpushare_testing.migtables import GpuModel
from gpushare_testing.nodeagents import NodeAgents
from gpushare_testing.podadmission import pod_requests
from gpushare_testing.rawclient import MERGE_PATCH, ApiError, JsonObject, RawClient

__all__ = ["MIG_MANAGER", "MigAgent", "MigHost", "pci_device_id"]

logger = logging.getLogger(__name__)

MIG_MANAGER = "nvidia-mig-manager"
_STRATEGIC = "application/strategic-merge-patch+json"
# PCI device ids (NVML's PciInfo.PciDeviceId) for mig-parted's device-filter; go-nvml's mocks.
_DEVICE_IDS = {
    "NVIDIA-A100-SXM4-40GB": "0x20B010DE",
    "NVIDIA-A100-SXM4-80GB": "0x20B210DE",
    "NVIDIA-A30-PCIE-24GB": "0x20B710DE",
    "NVIDIA-H100-80GB-HBM3": "0x233010DE",
    "NVIDIA-H200-141GB-HBM3e": "0x233510DE",
    "NVIDIA-B200-180GB-HBM3e": "0x290110DE",
}


def pci_device_id(product: str) -> str:
    return _DEVICE_IDS.get(product, "0x000010DE")


class MigHost(Protocol):
    """What the MIG manager needs of the simulator."""

    client: RawClient

    def mig_node(self, name: str) -> tuple[JsonObject, NodeAgents] | None: ...

    def mig_config_text(self) -> str | None: ...

    def mig_model(self, product: str) -> GpuModel | None: ...

    def plugin_view(self) -> Mapping[str, str]: ...

    def mark(self, name: str) -> None: ...

    async def patch_node(
        self,
        name: str,
        body: JsonObject,
        *,
        as_: str,
        status: bool = False,
        content_type: str = MERGE_PATCH,
    ) -> JsonObject: ...


class MigAgent:
    """The MIG managers of the simulator's nodes."""

    def __init__(self, host: MigHost, *, apply_seconds: float, reboot_seconds: float) -> None:
        self._host = host
        self._apply_seconds = apply_seconds
        self._reboot_seconds = reboot_seconds
        self._seen: dict[str, str | None] = {}  # the label value last seen per node
        self._done: dict[str, str | None] = {}  # the value last run (or applied at creation)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.runs: dict[str, list[tuple[str, str]]] = {}  # node -> (config, final state)
        self.failures: dict[str, str] = {}  # node -> why its last run failed
        self.reboots: dict[str, int] = {}
        self._injected: dict[str, str] = {}  # node -> the error its next change meets

    def fail_next(self, name: str, reason: str = "injected NVML error") -> None:
        """The node's next MIG change fails when it applies (after ``pending`` and the pause),
        as an NVML or driver error would: a test's way to a ``failed`` the operator cannot
        foresee."""
        self._injected[name] = reason

    @property
    def idle(self) -> bool:
        return not self._tasks and all(
            self._seen[n] == self._done.get(n) or not self._seen[n] for n in self._seen
        )

    def add(self, name: str, label: str | None) -> None:
        """A node created with this label: its manager took it as applied before we look."""
        self._seen[name] = self._done[name] = label

    def drop(self, name: str) -> None:
        self._seen.pop(name, None)
        self._done.pop(name, None)
        if (task := self._tasks.pop(name, None)) is not None:
            task.cancel()

    def see(self, name: str, labels: Mapping[str, str]) -> None:
        """The manager's informer saw the node; a new non-empty value starts a run."""
        if name not in self._seen:
            return
        label = labels.get(CONFIG_LABEL) or None
        if label == self._seen[name]:
            return
        self._seen[name] = label
        if label and name not in self._tasks:
            self._tasks[name] = asyncio.create_task(self._loop(name), name=f"mig-manager-{name}")

    def tasks(self) -> list[asyncio.Task[None]]:
        return list(self._tasks.values())

    async def _loop(self, name: str) -> None:
        try:
            while (label := self._seen.get(name)) and label != self._done.get(name):
                self._done[name] = label
                try:
                    state = await self._run(name, label)
                except (ApiError, OSError, TimeoutError) as exc:
                    logger.warning("simulated MIG manager on %s failed: %s", name, exc)
                    state = "error"
                self.runs.setdefault(name, []).append((label, state))
        finally:
            self._tasks.pop(name, None)
            self._host.mark(name)

    async def _run(self, name: str, selected: str, *, rebooted: bool = False) -> str:
        found = self._host.mig_node(name)
        if found is None:
            return "gone"
        node, agents = found
        labels = dict(node["metadata"].get("labels") or {})
        target = select_target(
            text=self._host.mig_config_text(),
            selected=selected,
            current=agents.mig.layout,
            device_id=pci_device_id(agents.mig.product),
        )
        if isinstance(target, str):
            return await self._finish(name, labels, agents, "failed", target)
        if target.layout == agents.mig.layout and not target.reason:
            return await self._finish(name, labels, agents, "success", "")
        await self._labels(name, {STATE_LABEL: "pending"})
        await self._labels(name, paused_labels(labels))
        agents.stop_plugin()  # the DaemonSet pods leave the node; GFD's labels stay
        self._host.mark(name)
        await asyncio.sleep(self._apply_seconds)
        if clients := await self._clients(name):
            reason = f"the GPUs are in use by {len(clients)} pod(s): {', '.join(clients[:3])}"
            return await self._finish(name, labels, agents, "failed", reason)
        if injected := self._injected.pop(name, None):
            return await self._finish(name, labels, agents, "failed", injected)
        if (
            self._reboot_seconds > 0
            and not rebooted
            and mode_changes(target.layout, agents.mig.layout)
        ):
            await self._labels(name, {STATE_LABEL: "rebooting"})
            await self._reboot(name, agents, target)
            return await self._run(name, selected, rebooted=True)
        model = self._host.mig_model(agents.mig.product)
        layout, reason = apply_layout(target=target, current=agents.mig.layout, model=model)
        agents.set_mig_layout(layout)
        return await self._finish(name, labels, agents, "failed" if reason else "success", reason)

    async def _finish(
        self, name: str, labels: Mapping[str, str], agents: NodeAgents, state: str, reason: str
    ) -> str:
        """reconfigure.go ``setState``: the deploy labels back first, then the state."""
        restored = restored_labels(labels)
        await self._labels(name, restored)
        # The labels bring the device-plugin pod back, unless its label is false (backend DRA:
        # gpushare turned it off, and the manager keeps a false as it found it).
        if agents.outage and restored.get(DEPLOY_LABELS[0]) == "true":
            agents.start_plugin(now=time.monotonic(), view=self._host.plugin_view())
            self._host.mark(name)
        await self._labels(name, {STATE_LABEL: state})
        if reason:
            self.failures[name] = reason
            logger.info("simulated MIG manager on %s: %s (%s)", name, state, reason)
        else:
            self.failures.pop(name, None)
        return state

    async def _labels(self, name: str, labels: Mapping[str, str]) -> None:
        found = self._host.mig_node(name)
        current = (found[0]["metadata"].get("labels") or {}) if found else {}
        changed = {k: v for k, v in labels.items() if current.get(k) != v}
        if changed:
            await self._host.patch_node(name, {"metadata": {"labels": changed}}, as_=MIG_MANAGER)

    async def _clients(self, name: str) -> list[str]:
        """Pods on the node that hold (or may hold) GPU devices: not finished, asking for any
        ``nvidia.com/`` resource, or holding any ResourceClaim (harsher than reality: a claim
        may hold no GPU).  A pod being deleted still runs until kubelet stops it."""
        params = {"fieldSelector": f"spec.nodeName={name}"}
        status, body = await self._host.client.get("/api/v1/pods", params=params)
        if status != 200:
            raise ApiError(method="LIST", path="/api/v1/pods", status=status, body=body)
        clients = []
        for pod in body.get("items") or []:
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            requests = pod_requests(pod.get("spec") or {})
            claims = (pod.get("spec") or {}).get("resourceClaims")
            if claims or any(k.startswith("nvidia.com/") and v > 0 for k, v in requests.items()):
                meta = pod["metadata"]
                clients.append(f"{meta.get('namespace')}/{meta.get('name')}")
        return sorted(clients)

    async def _reboot(self, name: str, agents: NodeAgents, target: Target) -> None:
        """The node goes away and comes back with the MIG mode changed (no instance yet)."""
        self.reboots[name] = self.reboots.get(name, 0) + 1
        await self._ready(name, ready=False)
        await asyncio.sleep(self._reboot_seconds)
        modes = tuple(
            GpuMig(enabled=want.enabled) if want.enabled != have.enabled else have
            for want, have in zip(target.layout, agents.mig.layout, strict=True)
        )
        agents.set_mig_layout(modes)
        await self._ready(name, ready=True)

    async def _ready(self, name: str, *, ready: bool) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        condition: dict[str, Any] = {"type": "Ready", "lastTransitionTime": now}
        if ready:
            condition |= {"status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now}
            condition["message"] = "kubelet is posting ready status"
        else:  # the node lifecycle controller's verdict on a kubelet that stopped posting
            condition |= {"status": "Unknown", "reason": "NodeStatusUnknown"}
            condition["message"] = "Kubelet stopped posting node status."
        body = {"status": {"conditions": [condition]}}
        who = "kubelet" if ready else "kube-controller-manager"
        await self._host.patch_node(name, body, as_=who, status=True, content_type=_STRATEGIC)
