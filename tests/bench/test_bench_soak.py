"""The soak rows' arithmetic, their targets as the report judges them (on
synthetic results), and the database helpers they rest on (real PostgreSQL).
The rows themselves run in quick mode in test_bench_smoke.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench import report, rows_soak
from bench.registry import QUICK, Context, RowResult
from bench.rows_soak import CHURN_TARGETS, HELD_TARGETS, PYALK, REFERENCE, Summary
from tests.bench.test_bench_report import CELL_LIMIT

CHURN_LABEL = next(label for label, kind in report.TARGETS if kind == "soak")
HELD_LABEL = next(label for label, kind in report.TARGETS if kind == "soak_held")


def test_a_summary_takes_the_best_of_the_first_three_runs() -> None:
    s = Summary((40_000.0, 50_000.0, 45_000.0, 60_000.0, 30_000.0, 35_000.0))
    assert s.best_early == 50_000  # run 4's 60,000 is not an early run
    assert (s.worst, s.worst_run) == (30_000, 5)
    assert s.worst_vs_best == 0.6
    assert s.median == 42_500
    assert Summary((10.0, 20.0)).best_early == 20  # fewer runs than EARLY_RUNS


def test_the_soak_size_comes_from_the_mode_or_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = Context(server=None, mode=QUICK)  # type: ignore[arg-type]
    monkeypatch.delenv(rows_soak.SOAK_ENV, raising=False)
    assert rows_soak.soak_size(ctx) == (2, 500)
    monkeypatch.setenv(rows_soak.SOAK_ENV, "5,50000")
    assert rows_soak.soak_size(ctx) == (5, 50_000)
    monkeypatch.setenv(rows_soak.SOAK_ENV, "0,50000")
    with pytest.raises(ValueError, match=rows_soak.SOAK_ENV):
        rows_soak.soak_size(ctx)


def soak_result(
    key: str,
    worst_vs_best: float,
    median_ratio: float | None,
    after_vs_empty: float | None = None,
    *,
    dead: int = 1_234_567,
) -> RowResult:
    """A soak row's result as rows_soak._records shapes it: pyalk's best early
    run 50,000 jobs/s, graphile-worker's median 20,000 (None: not run)."""
    ours: dict[str, Any] = {
        "system": PYALK,
        "best early": 50_000.0,
        "worst": 50_000.0 * worst_vs_best,
        "worst run": 10,
        "worst/best": worst_vs_best,
        "median": 20_000.0 * (median_ratio or 1.0),
        f"median vs {REFERENCE}": median_ratio,
        "dead tuples before worst": dead,
        "autovacuums": 12,
        "status": "ok",
    }
    if after_vs_empty is not None:
        ours.update({
            "queue MiB empty": 0.055,
            "after/empty": after_vs_empty,
            "heap MiB after vacuum": 1234.5,
            "index MiB after vacuum": 0.055 * after_vs_empty - 0.01,
        })
    ref = (
        {"system": REFERENCE, "worst/best": 0.78, "median": 20_000.0, "status": "ok"}
        if median_ratio is not None
        else {"system": REFERENCE, "status": "pending"}
    )
    return RowResult(key=key, title=key, status="ok", columns=[], records=[ours, ref])


def judged(result: RowResult) -> dict[str, Any]:
    label = CHURN_LABEL if result.key == "soak.churn" else HELD_LABEL
    return next(t for t in report.targets([result]) if t["target"] == label)


def test_the_churn_target_needs_both_no_decay_and_the_ratio() -> None:
    assert judged(soak_result("soak.churn", 0.95, 1.6))["met"] is True
    assert judged(soak_result("soak.churn", 0.9, 1.5))["met"] is True  # the bar itself meets it
    decayed = judged(soak_result("soak.churn", 0.85, 1.6))
    assert decayed["met"] is False
    assert decayed["measured"].startswith("pyalk worst/best 0.85 (run 10), graphile-worker 0.78; median 1.60x")
    assert decayed["what limits us"].startswith("run 10: 42,500 jobs/s after 1,234,567 dead tuples, 12 autovacuums")
    assert "us/job" not in decayed["what limits us"]  # the ratio was met: no cause given for it
    slow = judged(soak_result("soak.churn", 0.95, 1.49))
    assert slow["met"] is False
    assert slow["what limits us"] == "median 34 vs 50 us/job"  # 1e6 / 29,800 and 1e6 / 20,000


def test_the_held_target_has_a_lower_decay_bar_and_a_size_bar() -> None:
    assert CHURN_TARGETS.worst_vs_best == 0.9 and HELD_TARGETS.worst_vs_best == 0.8
    assert judged(soak_result("soak.held", 0.85, 1.6, 1.9))["met"] is True  # 0.85 fails churn's bar, not this one
    assert judged(soak_result("soak.held", 0.79, 1.6, 1.9))["met"] is False
    bloated = judged(soak_result("soak.held", 0.85, 1.6, 2.5))
    assert bloated["met"] is False
    assert bloated["measured"].endswith("size after vacuum 2.5x empty")
    assert bloated["what limits us"].startswith("after vacuum heap 1234.5 + indexes ")


def test_without_graphile_worker_only_the_decay_is_judged() -> None:
    alone = judged(soak_result("soak.churn", 0.95, None))
    assert alone["met"] is None and "graphile-worker not run" in alone["measured"]
    assert judged(soak_result("soak.churn", 0.5, None))["met"] is False


def test_every_soak_cell_fits_the_docs_table() -> None:
    """The worst case: every part missed, large numbers."""
    found = judged(soak_result("soak.held", 0.21, 0.61, 4321.0, dead=123_456_789))
    assert found["what limits us"].count(";") == 2  # decay, ratio and size each named
    for cell in (found["measured"], found["what limits us"], found["target"]):
        assert len(cell) < CELL_LIMIT, cell


def test_a_soak_target_is_listed_only_when_its_row_ran(tmp_path: Path) -> None:
    """A saved run from before the soak rows renders as it did; a soak row
    that did not run shows as not run."""
    labels = [t["target"] for t in report.targets([])]
    assert CHURN_LABEL not in labels and HELD_LABEL not in labels
    pending = RowResult("soak.held", "held", "pending", notes=["pyalk's worker is not importable"])
    (found,) = [t for t in report.targets([pending]) if t["target"] == HELD_LABEL]
    assert found["measured"].startswith("not run (pending: pyalk's worker")
    assert found["met"] is None
    assert CHURN_LABEL not in [t["target"] for t in report.targets([pending])]


# -- the database helpers ----------------------------------------------------------


@pytest.fixture
def leaves(monkeypatch: pytest.MonkeyPatch) -> str:
    """A system whose job tables are test tables: a plain one and a partitioned one."""
    monkeypatch.setitem(rows_soak.QUEUE_TABLES, "test", ("public.plain", "public.parted", "public.missing"))
    return "test"


def _make_tables(db: psycopg.Connection[Any]) -> None:
    db.execute("CREATE TABLE plain (id int PRIMARY KEY) WITH (autovacuum_enabled = off)")
    db.execute("CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id)")
    for name, low in (("parted_a", 0), ("parted_b", 1000)):
        db.execute(
            f"CREATE TABLE {name} PARTITION OF parted FOR VALUES FROM ({low}) TO ({low + 1000})"
            " WITH (autovacuum_enabled = off)"
        )
    db.execute("INSERT INTO plain SELECT generate_series(1, 500)")
    db.execute("INSERT INTO parted SELECT generate_series(0, 1999)")


def test_queue_sizes_count_every_partition_and_skip_missing_tables(db: psycopg.Connection[Any], leaves: str) -> None:
    _make_tables(db)
    sizes = rows_soak.queue_sizes(db, leaves)
    row = db.execute(
        "SELECT sum(pg_table_size(r)), sum(pg_indexes_size(r)) FROM unnest(%s::regclass[]) AS r",
        [["plain", "parted_a", "parted_b"]],
    ).fetchone()
    assert row is not None
    assert (sizes["heap"], sizes["indexes"]) == (row[0], row[1])
    assert sizes["total"] == sizes["heap"] + sizes["indexes"] > 0


def test_the_autovacuum_wait_ignores_a_manual_vacuum_and_keeps_its_deadline(
    db: psycopg.Connection[Any], leaves: str
) -> None:
    _make_tables(db)
    db.execute("DELETE FROM plain")
    db.execute("DELETE FROM parted WHERE id < 1000")  # parted_b keeps its rows: nothing to wait for there
    db.execute("SELECT pg_stat_force_next_flush()")
    db.execute("SELECT 1")  # this backend's counters reach shared memory when it goes idle
    dead = {name: n for name, n, _vacuums in rows_soak._leaf_stats(db, leaves)}
    assert dead == {"parted_a": 1000, "parted_b": 0, "plain": 500}
    db.execute("VACUUM plain")  # a manual vacuum is not the autovacuum the row waits for
    db.execute("SELECT pg_stat_force_next_flush()")
    db.execute("SELECT 1")
    started = time.monotonic()
    seen = rows_soak.wait_for_autovacuum({leaves: db}, deadline=started + 1.0, poll=0.1)
    assert 1.0 <= time.monotonic() - started < 10
    # plain has no dead tuples left after its VACUUM; autovacuum is off for parted_a, so it never comes
    assert seen == {leaves: {"parted_a": None}}
