"""The benchmark suite runs: every queue row on a tiny N against the test
server, and the report renders. No timing assertions: numbers from a test
run mean nothing; the bench itself (python -m bench) is where they live."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bench import pg, report, rows_e2e, rows_hostile, rows_limits, rows_ops, rows_soak
from bench.cli import run_rows
from bench.peers import pyalk_worker
from bench.peers.common import ANALYZE_ENV
from bench.registry import QUICK, Context, RowResult
from bench.rows import load_rows
from bench.server import Server, install_pyalk
from tests import conftest

TINY = dataclasses.replace(
    QUICK,
    clients=(1, 2),
    enqueue_seconds=1.0,
    claim1_jobs=40,
    claim100_jobs=400,
    backlog_sizes=(200, 1_000),
    latency_samples=5,
    stale_backlog=500,
    xmin_seconds=1.0,
    stream_events=300,
    wake_samples=5,
    replay_events=500,
    memory_jobs=(100, 600),
)


@pytest.fixture
def bench_ctx(pg_server: conftest.Server) -> Iterator[Context]:
    server = Server(dsn=pg_server.dsn, embedded=False)
    try:
        yield Context(server=server, mode=TINY)
    finally:
        server.close()


def _run(ctx: Context, *keys: str) -> list[RowResult]:
    rows = load_rows()
    results = run_rows(ctx, [rows[k] for k in keys])
    for result in results:
        assert result.status in ("ok", "pending"), (result.key, result.notes, result.extra.get("traceback"))
    return results


def test_sql_rows_run_ours_and_the_floor(bench_ctx: Context, tmp_path: Path) -> None:
    results = _run(bench_ctx, "sql.enqueue_1", "sql.enqueue_batch_100", "sql.claim_1_ack", "sql.claim_100_ack_batch")
    for result in results:
        assert [rec["clients"] for rec in result.records] == [1, 2]
        for rec in result.records:
            assert rec["ours jobs/s"] > 0 and rec["floor jobs/s"] > 0
            assert rec["ours/floor"] is not None
            # The floor of the partitioned storage runs beside the plain one (issue 25).
            assert rec["rotating floor jobs/s"] > 0 and rec["ours/rotating floor"] is not None

    meta = {
        "date": "test",
        "mode": "tiny",
        "seconds": 0.0,
        "session_options": bench_ctx.session_options,
        **bench_ctx.server.describe(),
    }
    report.write_json(tmp_path / "img" / "benchmarks.json", meta, results)
    report.write_markdown(tmp_path / "benchmarks.md", meta, results, None)
    text = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    assert "| clients | ours jobs/s | floor jobs/s | ours/floor |" in text
    assert "## Targets (issues 7, 11, 15, 25, 26 and 27)" in text
    sql_target = next(t for t in report.targets(results) if t["target"].startswith("SQL path"))
    assert sql_target["measured"].startswith("worst ours/rotating floor over client counts: ")
    assert sql_target["met"] or sql_target["what limits us"].startswith("plain floor ")
    data = json.loads((tmp_path / "img" / "benchmarks.json").read_text(encoding="utf-8"))
    assert [row["key"] for row in data["rows"]] == [r.key for r in results]


def test_issue11_rows_run(bench_ctx: Context) -> None:
    settle, durable, future = _run(bench_ctx, "sql.settle_and_claim", "sql.enqueue_durable", "latency.claim_vs_future")
    assert [rec["clients"] for rec in settle.records] == [1, 2]
    assert all(rec["ours jobs/s"] > 0 and rec["floor jobs/s"] > 0 for rec in settle.records)
    assert [(rec["clients"], rec["idle worker"]) for rec in durable.records] == [
        (2, "no"),
        (2, "yes"),
        (2, "AsyncWorker"),
    ]
    assert all(rec["ours/no-notify"] is not None for rec in durable.records)
    assert durable.records[-1]["worker done/enqueued (ours, no-notify)"]  # the real worker ran on both sides
    assert "received 0 notifications" not in " ".join(durable.notes)  # the idle worker was woken
    assert [rec["metric"] for rec in future.records] == ["claim p50", "claim p99", "claim+ack p50"]
    assert all(rec["ratio"] is not None for rec in future.records)
    # Issue 11's targets for these rows are in the report's targets table, judged from this run's numbers.
    found = report.targets([settle, durable, future])
    durable_target = next(t for t in found if t["target"].startswith("durable enqueue"))
    future_target = next(t for t in found if t["target"].startswith("claim with 10^5"))
    assert durable_target["measured"].startswith("ours/no-notify at 2 clients, idle worker: no ")
    assert durable_target["met"] is all(rec["ours/no-notify"] >= 0.9 for rec in durable.records)
    assert future_target["measured"].startswith("claim p50 with / without: ")
    assert future_target["met"] is (future.records[0]["ratio"] <= 1.2)


def test_latency_and_hostile_rows_run(bench_ctx: Context) -> None:
    results = _run(
        bench_ctx, "latency.claim_vs_backlog", "latency.stale_stats", "latency.sweep_vs_dead", "hostile.held_xmin"
    )
    backlog, stale, sweep, xmin = results
    assert [rec["pending"] for rec in backlog.records] == [200, 1_000]
    assert {rec["metric"] for rec in stale.records} >= {"claim+ack p50 ms", "enqueue 1 jobs/s"}
    assert [rec["dead rows"] for rec in sweep.records] == [200, 1_000]
    assert [(rec["side"], rec["run"]) for rec in xmin.records] == [
        ("ours", "clean"),
        ("ours", "xmin held"),
        (rows_hostile.ROTATED, "clean"),
        (rows_hostile.ROTATED, "xmin held"),
        ("floor", "clean"),
        ("floor", "xmin held"),
    ]
    # alk.jobs is partitioned: its counters and size are its partitions' sums, never the parent's zeros.
    ours = [rec for rec in xmin.records if rec["side"] == "ours"]
    assert all(rec["bytes/job"] > 0 for rec in ours), ours
    assert all(rec["rotations"] == 0 for rec in ours)


def test_table_counters_sum_a_partitioned_tables_partitions(bench_ctx: Context) -> None:
    with bench_ctx.server.fresh_db("alk_bench_counters", pyalk=False, floor=False) as db, \
            pg.connect(bench_ctx, db) as conn:
        conn.execute("CREATE TABLE parted (k int) PARTITION BY LIST (k)")
        conn.execute("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES IN (1)")
        conn.execute("CREATE TABLE parted_2 PARTITION OF parted FOR VALUES IN (2)")
        conn.execute("CREATE TABLE plain (k int)")
        conn.execute("INSERT INTO parted SELECT 1 + g % 2 FROM generate_series(1, 10) g")
        conn.execute("INSERT INTO plain SELECT g FROM generate_series(1, 3) g")
        conn.execute("SELECT pg_stat_force_next_flush()" if conn.info.server_version >= 150000 else "SELECT 1")
        pg.flush_stats(conn)
        parted, plain = pg.table_counters(conn, "public.parted"), pg.table_counters(conn, "public.plain")
        sizes = [row[0] for name in ("parted_1", "parted_2", "plain")
                 for row in conn.execute("SELECT pg_total_relation_size(%s::regclass)", [name])]
    assert parted["ins"] == 10 and plain["ins"] == 3
    assert parted["bytes"] == sizes[0] + sizes[1] > 0 and plain["bytes"] == sizes[2] > 0


def test_wake_and_stream_rows_run(bench_ctx: Context) -> None:
    wake, tail = _run(bench_ctx, "latency.wake", "latency.stream_tail")
    assert wake.status == "ok" and tail.status == "ok"
    assert [rec["samples"] for rec in wake.records] == [5, 5, 5]
    assert all(rec["p50 ms"] is not None for rec in wake.records)
    metrics = [rec["metric"] for rec in tail.records]
    assert any(m.startswith("tail latency p50") for m in metrics)
    assert all(rec["pyalk"] > 0 for rec in tail.records if rec["metric"].startswith("replay"))
    target = next(t for t in report.targets([wake, tail]) if t["target"].startswith("wake"))
    assert target["measured"].startswith("p50 ")


@pytest.mark.parametrize("variant", pyalk_worker.VARIANTS)
def test_pyalk_worker_runner_processes_every_job(bench_ctx: Context, variant: str) -> None:
    result = rows_e2e.run_peer(bench_ctx, "pyalk", 50, 2, env={"ALK_BENCH_PYALK_VARIANT": variant})
    assert result.get("processed") == 50, result
    assert result["settings"]["tuning"].startswith("none")  # pyalk runs with its defaults (it listens)


def test_the_runner_takes_its_statistics_before_its_worker_when_asked(bench_ctx: Context) -> None:
    """ALK_BENCH_ANALYZE=1: the job table has been analyzed by the time the run
    ends (its worker started on planner statistics, as in production); without
    it, a fresh database's job table never is within a run this short."""

    def analyzed(env: dict[str, str]) -> int:
        database = bench_ctx.server.create_db("alk_bench_analyze")
        try:
            dsn = bench_ctx.server.dsn_for(database)
            with psycopg.connect(dsn, autocommit=True) as conn:
                install_pyalk(conn, None)
            args = [sys.executable, "-m", rows_e2e.PEERS["pyalk"], "--dsn", dsn, "--url", "-",
                    "--jobs", "30", "--concurrency", "2"]
            subprocess.run(args, check=True, capture_output=True, env=dict(os.environ, **env), timeout=120)
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = 'alk'"
                    " AND relname LIKE 'jobs%%' AND analyze_count > 0").fetchone()
            assert row is not None
            return int(row[0])
        finally:
            bench_ctx.server.drop_db(database)

    assert analyzed({ANALYZE_ENV: "1"}) > 0
    assert analyzed({ANALYZE_ENV: "0"}) == 0


def test_every_e2e_system_runs_on_statistics_and_graphile_worker_also_without() -> None:
    systems = rows_e2e._systems()
    asked = {label: (env or {}).get(ANALYZE_ENV) for label, _runner, env in systems}
    assert asked.pop(rows_e2e.UNANALYZED) == "0"
    assert set(asked.values()) == {"1"}
    assert rows_e2e.REFERENCE in asked  # the target's reference is the one with statistics
    assert {runner for _label, runner, _env in systems} == set(rows_e2e.PEERS)


def test_memory_row_reads_the_rss_of_each_worker_form(bench_ctx: Context) -> None:
    (memory,) = _run(bench_ctx, "e2e.memory")
    assert [rec["worker"] for rec in memory.records] == list(pyalk_worker.VARIANTS)
    for rec in memory.records:
        assert rec["RSS MiB after 100"] > 0 and rec["RSS MiB after 600"] > 0 and rec["ratio"] > 0
    # The growth curve: every checkpoint read in the same worker process.
    assert memory.extra["checkpoints"] == [100, 250, 500, 600]
    for raw in memory.extra["raw"]:
        assert sorted(int(n) for n in raw["measures"]["rss_kib_after"]) == [100, 250, 500, 600]


def test_memory_row_counts_and_their_override(bench_ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    assert rows_e2e.memory_checkpoints(10_000, 1_000_000) == [10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
                                                              1_000_000]
    assert rows_e2e.memory_jobs(bench_ctx) == (100, 600)
    monkeypatch.setenv(rows_e2e.MEMORY_JOBS_ENV, "1000,30000")
    assert rows_e2e.memory_jobs(bench_ctx) == (1000, 30000)
    monkeypatch.setenv(rows_e2e.MEMORY_JOBS_ENV, "30000,1000")
    with pytest.raises(ValueError, match=rows_e2e.MEMORY_JOBS_ENV):
        rows_e2e.memory_jobs(bench_ctx)


def test_a_missing_mechanism_is_pending_not_an_error(bench_ctx: Context) -> None:
    from bench.registry import Row

    row = Row("latency.none", "latency", "t", "a", lambda ctx: RowResult("x", "x", "ok"), lambda ctx: "not yet")
    (result,) = run_rows(bench_ctx, [row])
    assert result.status == "pending" and result.notes == ["not yet"]


def test_the_e2e_target_is_judged_on_the_forms_issue_11_names() -> None:
    """Async at c=1 and c=10, threaded at c=1; the threaded worker at c=10 is shown, not judged."""

    def e2e(ratios: dict[tuple[str, int], float]) -> RowResult:
        records = [
            {"system": system, "concurrency": c, "process jobs/s": 1000.0 * ratio, "vs graphile-worker": ratio}
            for (system, c), ratio in ratios.items()
        ]
        return RowResult(key="e2e.process", title="e2e", status="ok", columns=[], records=records)

    def judged(ratios: dict[tuple[str, int], float]) -> bool | None:
        found = report.targets([e2e(ratios)])
        return next(t for t in found if t["target"].startswith("end to end"))["met"]

    named = {("pyalk (async)", 1): 1.6, ("pyalk (async)", 10): 1.5, ("pyalk (threaded)", 1): 1.7}
    assert judged({**named, ("pyalk (threaded)", 10): 1.1}) is True
    assert judged({**named, ("pyalk (async)", 10): 1.49, ("pyalk (threaded)", 10): 2.0}) is False


def test_the_durable_target_explains_each_missed_mode_by_its_own_cause() -> None:
    """A missed row with no idle worker is not explained as the real worker's CPU, nor the reverse."""

    def durable(ratios: dict[tuple[int, str], float]) -> RowResult:
        records = [
            {"clients": c, "idle worker": idle, "ours/no-notify": ratio, "ours notifies/enqueue": 0.01}
            for (c, idle), ratio in ratios.items()
        ]
        return RowResult(key="sql.enqueue_durable", title="durable", status="ok", columns=[], records=records)

    def limits(ratios: dict[tuple[int, str], float]) -> str:
        found = report.targets([durable(ratios)])
        return str(next(t for t in found if t["target"].startswith("durable enqueue"))["what limits us"])

    only_no = limits({(8, "no"): 0.85, (8, "AsyncWorker"): 1.0})
    assert only_no == report.DURABLE_CAUSES["no"]
    only_real = limits({(8, "no"): 1.0, (16, "AsyncWorker"): 0.8})
    assert only_real == report.DURABLE_CAUSES["AsyncWorker"]
    assert "AsyncWorker" not in only_no and "no idle worker" not in only_real


def test_the_soak_rows_run_in_quick_mode(bench_ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both soak rows, 2 runs of 500 jobs; graphile-worker when ALK_BENCH_NODE_MODULES has it, else pending."""
    monkeypatch.delenv(rows_soak.SOAK_ENV, raising=False)
    bench_ctx.peers_dir = os.environ.get("ALK_BENCH_NODE_MODULES")
    churn, held = _run(bench_ctx, "soak.churn", "soak.held")
    for result in (churn, held):
        assert result.status == "ok", result.notes
        assert [rec["system"] for rec in result.records] == [rows_soak.PYALK, rows_soak.REFERENCE]
        ours, ref = result.records
        assert ours["status"] == "ok" and len(ours["runs jobs/s"].split(", ")) == 2
        assert [r["run"] for r in result.extra["raw"][rows_soak.PYALK]] == [1, 2]
        # what the server ran beside each run: the WAL that run wrote, at least
        assert all(r["beside"]["wal_bytes"] > 0 for r in result.extra["raw"][rows_soak.PYALK])
        assert ours["beside worst"] is not None and ours["beside best early"] is not None
        assert 0 < ours["worst"] <= ours["median"] <= ours["best early"]
        # The ratio is of the unrounded rates, the record holds them rounded
        # to 0.1: the two agree within the last digit of the ratio.
        assert ours["worst/best"] == pytest.approx(ours["worst"] / ours["best early"], abs=1e-3)
        assert ref["status"] in ("ok", "pending")
        if ref["status"] == "ok":  # interleaved: both systems ran every run, and the ratio is theirs
            assert len(result.extra["raw"][rows_soak.REFERENCE]) == 2
            assert ours["median vs graphile-worker"] == pytest.approx(ours["median"] / ref["median"], abs=1e-3)
        else:
            assert any(note.startswith("graphile-worker: not run") for note in result.notes)
    for rec in held.records:
        if rec["status"] == "ok":
            assert rec["queue MiB empty"] > 0  # the job tables exist empty before run 1
            if rec["system"] == rows_soak.PYALK:
                # 2 runs of 500: 1,000 settled jobs, a tenth of min_jobs, so the
                # drained slot rotates as the second run's worker stops (0038)
                assert rec["at end"] <= 2 * rec["queue MiB empty"]
            else:  # held dead rows make them grow
                assert rec["queue MiB empty"] < rec["at end"]
            assert rec["after vacuum"] > 0 and rec["vacuum"]
    assert rows_soak.HOLDER_SQL in " ".join(held.notes)

    found = {t["target"]: t for t in report.targets([churn, held])}
    soak_targets = [t for label, t in found.items() if label.startswith("soak")]
    assert len(soak_targets) == 2
    assert all(t["measured"].startswith("pyalk worst/best ") for t in soak_targets)
    meta = {"date": "test", "mode": "tiny", "seconds": 0.0, "session_options": "", **bench_ctx.server.describe()}
    report.write_markdown(tmp_path / "benchmarks.md", meta, [churn, held], None)
    text = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    assert "### soak under a held snapshot (`soak.held`" in text  # in the end-to-end section
    assert text.index("## 2. End to end") < text.index("(`soak.churn`")


def test_the_backlog_soak_runs_in_quick_mode(bench_ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """soak.backlog: the held soak with 3,000 jobs scheduled a day ahead,
    which stay live (and unrun) through both runs of each system."""
    monkeypatch.delenv(rows_soak.SOAK_ENV, raising=False)
    bench_ctx.peers_dir = os.environ.get("ALK_BENCH_NODE_MODULES")
    (result,) = _run(bench_ctx, "soak.backlog")
    assert result.status == "ok", result.notes
    assert result.extra["backlog"] == rows_soak.BACKLOG["quick"]
    assert any(note.startswith("Backlog: 3,000 jobs due a day ahead") for note in result.notes)
    ours = result.records[0]
    assert ours["status"] == "ok" and len(ours["runs jobs/s"].split(", ")) == 2
    # the backlog is in the 'empty' size: the job tables hold its 3,000 rows before run 1
    assert ours["queue MiB empty"] > 0.3
    label = next(label for label, kind in report.TARGETS if kind == "soak_backlog")
    judged = next(t for t in report.targets([result]) if t["target"] == label)
    assert judged["measured"].startswith("pyalk worst/best ")


def test_a_scheduled_backlog_counts_once_in_the_statistics(bench_ctx: Context) -> None:
    """The backlog's rows are live tuples once in the statistics: a VACUUM
    before its inserts were flushed had them counted twice."""
    database = bench_ctx.server.create_db("alk_bench_backlog")
    try:
        with psycopg.connect(bench_ctx.server.dsn_for(database), autocommit=True) as conn:
            install_pyalk(conn, None)
            rows_soak.schedule_ahead(conn, rows_soak.PYALK, 3000)
            conn.execute("SELECT pg_stat_force_next_flush()")
            conn.execute("SELECT 1")  # idle between the two: flushed
            live = conn.execute("SELECT sum(n_live_tup) FROM pg_stat_user_tables"
                                " WHERE schemaname = 'alk' AND relname LIKE 'jobs%%'").fetchone()
        assert live is not None and live[0] == 3000
    finally:
        bench_ctx.server.drop_db(database)


def test_the_ops_rows_run_in_quick_mode(bench_ctx: Context) -> None:
    """Both issue 27 rows: with and without the beating registry, retention off and on, interleaved."""
    registry, retention = _run(bench_ctx, "ops.registry_cost", "ops.retention_cost")
    assert registry.status == "ok" and retention.status == "ok"
    without, beating = registry.records
    assert without["jobs/s p50"] > 0 and beating["jobs/s p50"] > 0
    assert beating["with/without p50"] is not None and beating["beats/s"] > 0  # the workers did beat
    assert len(registry.extra["ratios"]) == rows_ops.QUICK_SIZES.rounds
    assert [(p["round"], p["setup"]) for p in registry.extra["pgbench"]] == [
        (1, "without"), (1, "with"), (2, "with"), (2, "without"),
    ]
    assert [rec["hot path"] for rec in retention.records] == [title for title, _, _ in rows_ops.RETENTION_SCRIPTS]
    for rec in retention.records:
        assert rec["retention 0 jobs/s"] > 0 and rec[f"retention {rows_ops.RETENTION_S} s jobs/s"] > 0
        assert rec["on/off p50"] is not None
    (target,) = [t for t in report.targets([registry, retention]) if t["target"].startswith("100 registered")]
    assert target["measured"].startswith("with/without p50 ")
    assert target["met"] is (beating["with/without p50"] >= rows_ops.REGISTRY_TARGET)


def test_the_registry_target_is_judged_on_the_median_ratio() -> None:
    """>= 0.98 with / without meets it; below, the line says what the beats cost; no row, no target line."""

    def judged(ratio: float, spread: str | None = None) -> dict[str, object]:
        records = [
            {"setup": "empty registry", "jobs/s p50": 50_000},
            {"setup": "100 workers beating every 5 s", "jobs/s p50": round(50_000 * ratio),
             "with/without p50": ratio, "with/without min-max": spread or f"{ratio - 0.01:.3f}-{ratio + 0.01:.3f}",
             "beats/s": 20.0, "beat ms p50": 0.4, "beats' backend CPU": "0.80%", "beats' client CPU": "0.50%"},
        ]
        registry = RowResult(key="ops.registry_cost", title="registry", status="ok", columns=[], records=records)
        return next(t for t in report.targets([registry]) if t["target"].startswith("100 registered"))

    met = judged(0.985)
    assert met["met"] is True and met["what limits us"] == ""
    missed = judged(0.97)
    assert missed["met"] is False
    assert missed["measured"] == "with/without p50 0.970 (rounds 0.960-0.980)"
    assert str(missed["what limits us"]).startswith("20 durable beat commits/s")
    assert "their backend 0.80% and client 0.50% of a core" in str(missed["what limits us"])
    assert len(str(missed["what limits us"])) <= 160 and len(str(missed["measured"])) <= 160
    assert "straddling" not in str(missed["what limits us"])  # every round below 1
    noisy = judged(0.94, spread="0.694-1.223")
    assert noisy["met"] is False and str(noisy["what limits us"]).endswith("rounds 0.694-1.223, straddling 1")
    assert len(str(noisy["what limits us"])) <= 160
    assert not [t for t in report.targets([]) if t["target"].startswith("100 registered")]


def test_the_limits_rows_run_in_quick_mode(bench_ctx: Context) -> None:
    """Issue 26's rows: the blocked-groups claim (each claim must take the one job without a group, or the
    row fails), max_running = 10 vs unlimited for both drainers, the hot path on three databases."""
    groups, limited, hot = _run(bench_ctx, "limits.blocked_groups", "limits.max_running", "limits.hot_path")
    assert groups.status == limited.status == hot.status == "ok"
    grouped, plain = groups.records
    assert grouped["claim p50 ms"] > 0 and plain["claim p50 ms"] > 0 and grouped["p50 vs no groups"] > 0
    assert all(len(samples) == rows_limits.QUICK_SIZES.claim_samples for samples in groups.extra["samples_ms"].values())
    assert [rec["drained by"] for rec in limited.records] == ["pgbench claim 1 + ack", "AsyncWorker"]
    assert all(rec["limited/unlimited p50"] > 0 for rec in limited.records)
    # the worker's queue really was limited in its limited runs, and only there
    worker_runs = [r for r in limited.extra["raw"] if r["drainer"] == "AsyncWorker"]
    assert {r["limited"]: r["settings"].get("queue max_running") for r in worker_runs} == {True: 10, False: None}
    assert [rec["hot path"] for rec in hot.records] == [title for title, _, _ in rows_limits.HOT_SCRIPTS]
    assert {r["side"] for r in hot.extra["pgbench"]} == set(rows_limits.SIDES)
    found = {t["target"]: t for t in report.targets([groups, limited, hot])}
    judged = [t for label, t in found.items() if label.startswith(("claim behind", "max_running", "hot path"))]
    assert len(judged) == 3 and all(t["met"] is not None for t in judged)
    assert next(t for t in judged if t["target"].startswith("claim behind"))["measured"].endswith("groups)")
    # a run without the rows (the saved one) lists none of their targets
    assert not [t for t in report.targets([]) if t["target"].startswith(("claim behind", "max_running"))]
