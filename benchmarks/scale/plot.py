"""One PNG: RSS and CPU over time for both variants, phases marked.

matplotlib is imported here only (and with the non-interactive Agg backend), so that the rest of
the benchmark, and its smoke test, run without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

COLORS = {"gpushare": "tab:blue", "kopf-native": "tab:orange"}


def draw(results: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """RSS (MiB) on top, CPU (cores busy, from the cumulative CPU series) below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rss_ax, cpu_ax) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for variant, result in results.items():
        series = (result.get("series") or {}).get(variant) or []
        if not series:
            continue
        t = [row[0] for row in series]
        rss = [row[1] for row in series]
        cores = [0.0] + [
            (series[i][2] - series[i - 1][2]) / max(series[i][0] - series[i - 1][0], 1e-6)
            for i in range(1, len(series))
        ]
        color = COLORS.get(variant)
        rss_ax.plot(t, rss, label=variant, color=color)
        cpu_ax.plot(t, cores, label=variant, color=color, linewidth=0.8)
        for at, what in result.get("marks") or []:
            for ax in (rss_ax, cpu_ax):
                ax.axvline(at, color=color, alpha=0.25, linestyle="--")
            rss_ax.annotate(what, (at, 0), rotation=90, fontsize=7, color=color, va="bottom")
    rss_ax.axhline(200, color="red", alpha=0.4, linestyle=":", label="budget 200 MiB")
    rss_ax.set_ylabel("RSS (MiB)")
    rss_ax.legend(loc="upper left")
    cpu_ax.set_ylabel("CPU (cores)")
    cpu_ax.set_xlabel("seconds since the variant started")
    cpu_ax.legend(loc="upper left")
    fig.suptitle("gpushare vs kopf-native: RSS and CPU through the scale benchmark")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
