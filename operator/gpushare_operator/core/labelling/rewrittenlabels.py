"""Labels that gpushare's own configuration makes change, and so must never decide governance.

Once a node carries a device-plugin config, NVIDIA's agents relabel it: GPU Feature Discovery
writes the replicas and sharing strategy it now sees, sets ``mps.capable`` under MPS, stamps
every pass with a timestamp, and appends ``-SHARED`` to ``nvidia.com/gpu.product`` while
time-slicing or MPS is in force with ``renameByDefault: false`` (the GPU Operator's
time-slicing documentation shows ``Tesla-T4`` becoming ``Tesla-T4-SHARED``); gpushare writes the
config and policy labels itself.  A selector on any of these would make a policy's own effect
move the node to another policy, which restarts the device plugin, which undoes the effect: a
loop per node.  So they are refused in selectors, and the product is matched on its base name.
"""

from __future__ import annotations

from typing import Final

GPU_PRODUCT: Final = "nvidia.com/gpu.product"
SHARED_SUFFIX: Final = "-SHARED"
# Under the single MIG strategy GFD names the MIG device: <product>-MIG-<profile>
# (k8s-device-plugin internal/lm/mig-strategy.go), with -SHARED after it when time-sliced.
MIG_INFIX: Final = "-MIG-"

# key -> why a selector may not use it (said in admission errors and conditions).
REWRITTEN_LABELS: Final = {
    "nvidia.com/gpu.replicas": (
        "GPU Feature Discovery sets it to the replicas of the config gpushare applies"
    ),
    "nvidia.com/gpu.sharing-strategy": (
        "GPU Feature Discovery sets it to the sharing strategy of the config gpushare applies"
    ),
    "nvidia.com/mps.capable": (
        "GPU Feature Discovery sets it while an MPS config that gpushare applies is in force"
    ),
    "nvidia.com/gfd.timestamp": "GPU Feature Discovery rewrites it on every labelling pass",
    "nvidia.com/mig.strategy": (
        "GPU Feature Discovery sets it to the MIG strategy of the config gpushare applies"
    ),
    "nvidia.com/mig.config": "gpushare writes it to apply a MIG policy's layout",
    "nvidia.com/mig.config.state": "the MIG manager rewrites it on every layout change",
    "nvidia.com/device-plugin.config": "gpushare writes it to apply a policy's config",
    "gpushare.dev/policy": "gpushare writes it to record which policy governs the node",
    "gpushare.dev/dra-driver": "gpushare writes it on the nodes of a policy of backend DRA",
    "nvidia.com/gpu.deploy.device-plugin": (
        "gpushare sets it to false on the nodes of a policy of backend DRA"
    ),
    "gpushare.dev/slot-memory-mib": (
        "gpushare writes it to say what the node's slots enforce under the config it applies"
    ),
    "gpushare.dev/slot-isolation": (
        "gpushare writes it to say what the node's slots enforce under the config it applies"
    ),
    "gpushare.dev/slot-resource": (
        "gpushare writes it to say what the node's slots enforce under the config it applies"
    ),
}

SHARED_PRODUCT_WHY: Final = (
    "GPU Feature Discovery appends -SHARED to nvidia.com/gpu.product while time-slicing or MPS"
    " is in force, and gpushare matches the product on its base name; select the base name"
)


def rewritten_key_error(key: str) -> str | None:
    """Why a selector may not name ``key``; None when it may."""
    why = REWRITTEN_LABELS.get(key)
    if why is None:
        return None
    return (
        f"a selector on label {key} is refused: {why}, so the policy's own effect would move"
        " the node to another policy"
    )


def shared_product_error(key: str, value: str) -> str | None:
    """Why a selector value for the product label is refused; None when it is fine."""
    if key == GPU_PRODUCT and value.endswith(SHARED_SUFFIX):
        return f"a selector value {value!r} for {GPU_PRODUCT} is refused: {SHARED_PRODUCT_WHY}"
    return None


def base_product(product: str | None) -> str | None:
    """The product name without GFD's sharing suffix and MIG device name."""
    if product is None:
        return None
    if product.endswith(SHARED_SUFFIX):
        product = product[: -len(SHARED_SUFFIX)]
    base, infix, _ = product.partition(MIG_INFIX)
    return base if infix and base else product


def mig_profile_of(product: str | None) -> str | None:
    """The MIG profile GFD names in the product under the single strategy; None otherwise."""
    if product is None:
        return None
    if product.endswith(SHARED_SUFFIX):
        product = product[: -len(SHARED_SUFFIX)]
    base, infix, profile = product.partition(MIG_INFIX)
    return profile if infix and base and profile else None
