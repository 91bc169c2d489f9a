"""Defaults that more than one part of gpushare states, each written once.

The kubectl plugin forecasts what the operator would do, so its ``plan`` flags default to the
operator's: a plan made without flags is the plan of an operator run without flags.  The API's
own field default for a policy's rollout lives here beside the cluster-wide one, and so do the
defaults that the lower layers' signatures repeat from the operator's flags.  A default only
the operator's flags know (its ports, its namespace) stays with the flag in app.settings.
"""

from __future__ import annotations

from typing import Final

# A policy's ``rollout.maxUnavailable`` when it says none: a share of the nodes it governs.
ROLLOUT_MAX_UNAVAILABLE: Final = "10%"
# A policy's ``rollout.progressDeadlineSeconds``: a Deployment's default.
ROLLOUT_PROGRESS_DEADLINE: Final = 600
# ``--max-unavailable``, over all policies: by default the cluster lets change at once the
# share one policy may, so that a policy over every GPU node is paced the same either way.
MAX_UNAVAILABLE: Final = ROLLOUT_MAX_UNAVAILABLE

# Where the device plugin reads its configs (``--device-plugin-namespace``/``-configmap``).
DEVICE_PLUGIN_NAMESPACE: Final = "gpu-operator"
DEVICE_PLUGIN_CONFIGMAP: Final = "gpushare-device-plugin-configs"
MIG_PARTED_CONFIGMAP: Final = "gpushare-mig-parted-config"

# Seconds: the wait before a new config key is put on nodes (the kubelet's sync period plus its
# cache TTL, until the mounted ConfigMap has the key), how long an unused key is kept, and how
# long Applied may last before it is a Mismatch.
CONFIG_PROPAGATION_DELAY: Final = 75.0
CONFIG_KEY_GRACE_PERIOD: Final = 300.0
MISMATCH_TIMEOUT: Final = 300.0

# The writer: sustained API writes per second, writes in flight at once, the seconds a policy
# status may wait for its nodes to settle, and the most a failing write's back-off grows to.
WRITE_QPS: Final = 100.0
WRITE_CONCURRENCY: Final = 16
POLICY_STATUS_MAX_DELAY: Final = 60.0
WRITE_BACKOFF_CAP: Final = 300.0

# The leader Lease, in seconds: controller-runtime's defaults.
LEASE_DURATION: Final = 15.0
RENEW_DEADLINE: Final = 10.0
RETRY_PERIOD: Final = 2.0
