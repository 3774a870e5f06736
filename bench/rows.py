"""Every benchmark row, found by importing each ``rows_*`` module by name.

The row modules import only the registry's types; this module imports the
row modules. Adding a row module is adding it to ``MODULES``.
"""

from __future__ import annotations

from types import ModuleType

from bench import (
    rows_dashboard,
    rows_e2e,
    rows_hostile,
    rows_latency,
    rows_limits,
    rows_ops,
    rows_router,
    rows_soak,
    rows_sql,
)
from bench.registry import GROUPS, Row

MODULES: tuple[ModuleType, ...] = (
    rows_sql, rows_ops, rows_limits, rows_e2e, rows_soak, rows_dashboard, rows_latency, rows_hostile, rows_router,
)


def load_rows() -> dict[str, Row]:
    """Every row by key, in report order (by group, then as each module lists them)."""
    found: dict[str, Row] = {}
    for module in MODULES:
        for r in module.ROWS:
            if r.key in found:
                raise ValueError(f"row {r.key!r} listed twice")
            found[r.key] = r
    order = list(GROUPS)
    return dict(sorted(found.items(), key=lambda item: order.index(item[1].group)))
