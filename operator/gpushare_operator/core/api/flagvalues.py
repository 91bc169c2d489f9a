"""Command-line values the operator and the kubectl plugin both take (argparse ``type=``
callables): one reading of each, so that ``--max-unavailable 10%`` or ``--write-qps`` means
the same to the plugin's plan as to the operator it forecasts."""

from __future__ import annotations

import argparse

from gpushare_operator.core.api.models import RolloutSpec


def seconds(text: str) -> float:
    """A duration: zero or more seconds."""
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def rate(text: str) -> float:
    """A rate or a period that must be above zero (writes per second, Lease timings)."""
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def max_unavailable(text: str) -> int | str:
    """A node count or a percentage, checked by the same model as ``rollout.maxUnavailable``."""
    value: int | str = int(text) if text.isdigit() else text
    try:
        return RolloutSpec.model_validate({"maxUnavailable": value}).maxUnavailable
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a node count (>= 1) nor a percentage"
        ) from None
