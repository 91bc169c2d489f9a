"""The dashboard's panels drawn from a Prometheus into one PNG, with matplotlib: every panel's
queries over a time range (``query_range``), one small chart per panel, laid out by row.

``make dashboard-preview`` runs tests/integration/test_prometheus_alerts.py with
``GPUSHARE_DASHBOARD_PREVIEW`` set to the picture's path: the test's scenario, against its real
Prometheus, is what the picture shows.  ``python -m gpushare_testing.dashboardpreview --url URL``
draws the last minutes of any Prometheus that scrapes a gpushare operator.

matplotlib is the ``bench`` extra's (``make dashboard-preview`` installs it); nothing else here
needs it.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpushare_testing import prometheus as prom
from gpushare_testing.paths import ROOT

COLUMNS = 4


def _legend(template: str, labels: Mapping[str, str]) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)
    return text.strip() or "value"


def _panels(board: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [p for p in board["panels"] if p.get("targets")]


def render(
    server: prom.PrometheusAPI,
    board: Mapping[str, Any],
    *,
    start: float,
    end: float,
    out: Path,
    variables: Mapping[str, str] | None = None,
    rate_interval: str = "10s",
) -> list[str]:
    """Draw ``board``'s panels over [start, end] into ``out``; the titles of panels whose
    queries returned nothing (drawn, empty, with a note)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    values = {"job": ".*", "policy": ".*", **(variables or {})}
    panels = _panels(board)
    rows = -(-len(panels) // COLUMNS)
    figure, axes = plt.subplots(rows, COLUMNS, figsize=(COLUMNS * 5, rows * 2.8), squeeze=False)
    step = max(1.0, (end - start) / 300)
    empty = []
    for index, panel in enumerate(panels):
        axis = axes[index // COLUMNS][index % COLUMNS]
        drawn = 0
        for target in panel["targets"]:
            expr = prom.grafana_expanded(
                target["expr"], rate_interval=rate_interval, variables=values
            )
            for series in server.query_range(expr, start=start, end=end, step=step):
                points = [(float(t) - start, float(v)) for t, v in series["values"]]
                points = [(t, v) for t, v in points if v == v]  # NaN: no data then
                if not points:
                    continue
                xs, ys = zip(*points, strict=True)
                label = _legend(target.get("legendFormat", ""), series["metric"])
                axis.plot(xs, ys, label=label[:40], linewidth=1.2)
                drawn += 1
        axis.set_title(panel["title"], fontsize=9)
        axis.tick_params(labelsize=7)
        axis.set_xlabel("seconds into the range", fontsize=7)
        axis.ticklabel_format(axis="y", useOffset=False, style="plain")
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        if unit and unit != "short":
            axis.set_ylabel(unit, fontsize=7)
        if drawn:
            if drawn <= 8:
                axis.legend(fontsize=6, loc="upper left")
        else:
            empty.append(panel["title"])
            axis.text(0.5, 0.5, "no data", ha="center", va="center", transform=axis.transAxes)
    for index in range(len(panels), rows * COLUMNS):
        axes[index // COLUMNS][index % COLUMNS].axis("off")
    figure.suptitle(f"{board['title']} ({end - start:.0f} s, from a real Prometheus)")
    figure.tight_layout(rect=(0, 0, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)
    plt.close(figure)
    return empty


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the Prometheus, e.g. http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=15)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/images/dashboard-preview.png")
    args = parser.parse_args(argv)
    board = json.loads(prom.DASHBOARD.read_text())
    end = time.time()
    empty = render(
        prom.PrometheusAPI(args.url), board, start=end - 60 * args.minutes, end=end, out=args.out
    )
    print(f"{args.out}: {len(_panels(board))} panels, {len(empty)} without data {empty}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
