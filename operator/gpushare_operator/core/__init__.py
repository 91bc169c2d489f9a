"""Pure domain logic: models, selectors, resolution, rendering, accounting, diffs.

No I/O, no asyncio, no kopf, no kubernetes_asyncio (enforced by import-linter), so that every
decision the operator makes can be unit-tested with plain tables and property tests.
"""
