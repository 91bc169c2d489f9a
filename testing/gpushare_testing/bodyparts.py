"""Pieces shared by the body builders: stable per-name randomness, timestamps, managedFields.

Deterministic for a given name, so that building the same cluster twice gives byte-identical
bodies (see ``bodies``).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

Body = dict[str, Any]

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
EPOCH = datetime(2025, 3, 3, 8, 0, 0, tzinfo=UTC)


def name_digest(name: str, salt: str = "") -> str:
    return hashlib.sha256(f"{salt}/{name}".encode()).hexdigest()


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def uuid_of(h: str) -> str:
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"


def octet(digest: str, at: int) -> int:
    return int(digest[at : at + 2], 16)


def creation_time(key: str) -> datetime:
    """Objects of one cluster appeared over a month; pick a stable moment in it per key."""
    return EPOCH + timedelta(seconds=int(name_digest(key, "created")[:8], 16) % (30 * 86_400))


def owned_fields(value: Any) -> Body:
    """The ``fieldsV1`` set owning every field of ``value``, in the API server's notation.

    Lists of objects with a ``name``/``type``/``containerPort`` are associative (``k:`` keys),
    other lists are atomic, as in the structural-merge schema of the built-in types.
    """
    if isinstance(value, dict):
        return {f"f:{key}": owned_fields(item) for key, item in value.items()}
    if not (isinstance(value, list) and value and isinstance(value[0], dict)):
        return {}
    keyed: Body = {}
    for item in value:
        if "containerPort" in item:
            key = {"containerPort": item["containerPort"], "protocol": item["protocol"]}
        elif "name" in item or "type" in item:
            key = {"name": item["name"]} if "name" in item else {"type": item["type"]}
        else:
            return {}
        keyed[f"k:{json.dumps(key, separators=(',', ':'))}"] = {".": {}, **owned_fields(item)}
    return keyed


def managed_entry(manager: str, at: str, owned: Body, *, subresource: str = "") -> Body:
    entry: Body = {"manager": manager, "operation": "Update", "apiVersion": "v1", "time": at}
    if subresource:
        entry["subresource"] = subresource
    return entry | {"fieldsType": "FieldsV1", "fieldsV1": owned_fields(owned)}
