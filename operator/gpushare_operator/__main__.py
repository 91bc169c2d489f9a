"""``python -m gpushare_operator``: the operator's command line."""

from gpushare_operator.app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
