"""Backend DRA's usage: the ResourceClaims holding ``gpu.nvidia.com`` devices, slim.

A DRA node's allocations are the devices allocated claims hold in its pool (NVIDIA's kubelet
plugin names each node's pool after the node), whichever way the claim was made: a pod's
ResourceClaimTemplate, or the claim kube-scheduler makes for a classic ``nvidia.com/gpu``
request served through a DeviceClass (KEP 5004).  Nothing else of a claim is read.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_operator.core.dra.driver import DRIVER, MIG_RESOURCE_PREFIX, MIG_TYPE, Device


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """An allocated ResourceClaim, slim: the ``gpu.nvidia.com`` devices it holds, as (pool,
    device) pairs (NVIDIA's kubelet plugin names each node's pool after the node), and the uids
    of the pods it is reserved for.  Nothing else of a claim is read."""

    uid: str
    # pool, device, pool, device, …: the pairs laid flat, sorted by pair (a tuple per pair
    # would cost 56 B a device; most claims hold one).  Read through ``devices``.
    flat: tuple[str, ...]
    pods: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, uid: str, devices: Iterable[tuple[str, str]], pods: Iterable[str] = ()
    ) -> ClaimRecord:
        pairs = sorted(set(devices))
        return cls(uid=uid, flat=tuple(s for pair in pairs for s in pair), pods=tuple(pods))

    @property
    def devices(self) -> list[tuple[str, str]]:
        """The (pool, device) pairs."""
        flat = self.flat
        return list(zip(flat[0::2], flat[1::2], strict=True))

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(self.flat[0::2])


def claim_record(obj: Mapping[str, Any]) -> ClaimRecord | None:
    """The record of a claim holding ``gpu.nvidia.com`` devices; None for one that holds none
    (not allocated yet, or another driver's): it counts for nothing."""
    status = obj.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
    devices = {
        # A pool is a node's name and a device's name repeats on every node: one string
        # each, shared by every claim (a claim's own strings are its uid and its pods').
        (sys.intern(str(r["pool"])), sys.intern(str(r["device"])))
        for r in results
        if isinstance(r, Mapping)
        and r.get("driver") == DRIVER
        and r.get("pool")
        and r.get("device")
    }
    if not devices:
        return None
    pods = sorted(
        {
            str(r["uid"])
            for r in status.get("reservedFor") or ()
            if isinstance(r, Mapping) and r.get("resource") == "pods" and r.get("uid")
        }
    )
    uid = str((obj.get("metadata") or {}).get("uid"))
    return ClaimRecord.of(uid, devices, pods)


def held_on(node: str, claims: Iterable[ClaimRecord]) -> tuple[frozenset[str], int]:
    """The devices the claims hold on ``node`` (each once: an admin-access claim may share
    one), and how many pods they are reserved for: a DRA node's allocations and holders."""
    devices: set[str] = set()
    pods: set[str] = set()
    for claim in claims:
        flat = claim.flat
        mine = [flat[i + 1] for i in range(0, len(flat), 2) if flat[i] == node]
        if mine:
            devices.update(mine)
            pods.update(claim.pods)
    return frozenset(devices), len(pods)


def by_resource(
    held: Iterable[str], devices: Iterable[Device], *, resources: tuple[str, ...]
) -> dict[str, int]:
    """Held devices per resource of a policy: a MIG device under its profile's
    ``nvidia.com/mig-<profile>`` where the policy advertises that, anything else under the
    policy's first resource (a full GPU under ``nvidia.com/gpu``)."""
    profiles = {d.name: d.profile for d in devices if d.type == MIG_TYPE}
    counts = dict.fromkeys(resources, 0)
    for name in held:
        resource = f"{MIG_RESOURCE_PREFIX}{profiles[name]}" if name in profiles else None
        if resource not in counts:
            resource = resources[0]
        counts[resource] += 1
    return counts
