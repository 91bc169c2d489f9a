"""``kubectl gpushare`` run as users run it (a child process), and the RBAC a user needs for it.

Shared by the plugin's integration tests (what it predicts, and what it may send): a test
module importing another would run that one's set-up code, so what they share lives here.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

PLUGIN: Final = (sys.executable, "-m", "gpushare_operator.kubectl.cli")

# The least a user needs for ``plan``: gets and lists only (no watch: the plugin falls back to
# paged lists), and the verbs of the dry runs (a dry run needs the verb it tries).
PLUGIN_ROLE: Final[dict[str, Any]] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "rules": [
        {"apiGroups": [""], "resources": ["nodes", "pods", "configmaps"], "verbs": ["get", "list"]},
        {
            "apiGroups": ["gpushare.dev"],
            "resources": ["gpusharingpolicies", "gpunodestates"],
            "verbs": ["get", "list"],
        },
        {  # read only where a policy or a node is on backend DRA
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices", "resourceclaims", "deviceclasses"],
            "verbs": ["get", "list"],
        },
        {
            "apiGroups": ["gpushare.dev"],
            "resources": ["gpusharingpolicies"],
            "verbs": ["create", "update", "delete"],
        },
    ],
}


@dataclass
class Run:
    """One run of the plugin: its exit status and what it printed."""

    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


async def plugin(kubeconfig: Path | None, *args: str, env: Mapping[str, str] | None = None) -> Run:
    """The plugin in a child process, without blocking the loop the simulator runs on."""
    flags = ["--kubeconfig", str(kubeconfig)] if kubeconfig is not None else []
    proc = await asyncio.create_subprocess_exec(
        *PLUGIN,
        *args,
        *flags,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await proc.communicate()
    return Run(int(proc.returncode or 0), out.decode(), err.decode())
