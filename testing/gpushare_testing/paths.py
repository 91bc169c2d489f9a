"""Where the repository's own files are: the tests install its CRDs and render its chart.

``make venv`` installs this distribution in editable mode, so the package sits in the
repository's ``testing/`` folder and the repository is two levels up.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
CHART = ROOT / "charts" / "gpushare-operator"
