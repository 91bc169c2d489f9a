"""The budget table the in-process benchmarks print: one row a budget, its figure, its bound and
PASS or **MISS**."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

TIMES: Final = "\N{MULTIPLICATION SIGN}"
# (measure, report key, unit, budget): unit "x" is a ratio, "KiB" a tenth-precise size, any
# other a whole number of it ("" for a count); a budget of 0 reads "= 0".
Budget = tuple[str, str, str, float]


def budget_rows(report: Mapping[str, Any], budgets: Sequence[Budget]) -> list[str]:
    rows = ["| Measure | gpushare | Budget | Result |", "|---|---|---|---|"]
    for name, key, unit, budget in budgets:
        value = report[key]
        if unit == "x":
            shown, bound = f"{value:,.2f}{TIMES}", f"≤ {budget:g}{TIMES}"
        elif unit == "KiB":
            shown, bound = f"{value:,.1f} KiB", f"≤ {budget:g} KiB"
        else:
            shown = f"{value:,.0f} {unit}".rstrip()
            bound = f"≤ {budget:g} {unit}".rstrip() if budget else "= 0"
        verdict = "PASS" if value <= budget else "**MISS**"
        rows.append(f"| {name} | {shown} | {bound} | {verdict} |")
    return rows
