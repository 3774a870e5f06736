"""The pg_cron recipe of docs/schedule.md, end to end: pg_cron calls
``alk.scheduler_tick('pg_cron', 90)`` every minute in the test database, takes
the scheduler's lease, and a schedule fires without any application process.

It needs a server with the pg_cron extension installed and preloaded
(``shared_preload_libraries = 'pg_cron'``); anywhere else it skips, saying
which of the two is missing. CI's PostgreSQL 15 leg provides both (Debian's
postgresql-15-cron). pg_cron's unit is the minute, so this test takes up to
two minutes.
"""

from __future__ import annotations

import secrets
import time

import psycopg
import pytest

from tests.conftest import Server

# Two minute boundaries: the schedule's first boundary, and pg_cron's first
# run at or after it, lie within this from the registration.
DEADLINE = 150.0
# The command of the recipe in docs/schedule.md.
RECIPE = "SELECT count(*) FROM alk.scheduler_tick('pg_cron', 90)"


def _skip_unless_pg_cron(admin: psycopg.Connection) -> None:
    if admin.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_cron'").fetchone() is None:
        pytest.skip("the server has no pg_cron extension (e.g. Debian's postgresql-<version>-cron package)")
    preload = admin.execute("SELECT current_setting('shared_preload_libraries')").fetchone()
    if preload is None or "pg_cron" not in preload[0]:
        pytest.skip("pg_cron is installed but not preloaded: it needs shared_preload_libraries = 'pg_cron'")


def test_pg_cron_drives_tick(pg_server: Server, db: psycopg.Connection) -> None:
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        _skip_unless_pg_cron(admin)
        row = admin.execute("SELECT current_setting('cron.database_name', true)").fetchone()
        cron_database = (row[0] if row else None) or "postgres"
    test_database = db.info.dbname
    job_name = f"pyalk-test-tick-{secrets.token_hex(4)}"

    with psycopg.connect(pg_server.dsn_for(cron_database), autocommit=True) as cron:
        cron.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        row = cron.execute(
            "SELECT cron.schedule_in_database(%s, '* * * * *', %s, %s)",
            [job_name, RECIPE, test_database],
        ).fetchone()
        assert row is not None
        job_id = row[0]
        try:
            registered = db.execute("SELECT alk.schedule('every-minute', '* * * * *', 'from-pg-cron')").fetchone()
            assert registered is not None and registered[0] % 60 == 0
            deadline = time.monotonic() + DEADLINE
            fired = None
            while time.monotonic() < deadline:
                fired = db.execute(
                    "SELECT payload FROM alk.jobs WHERE queue = 'from-pg-cron' ORDER BY id LIMIT 1").fetchone()
                if fired is not None:
                    break
                failed = cron.execute(
                    "SELECT return_message FROM cron.job_run_details WHERE jobid = %s AND status = 'failed' LIMIT 1",
                    [job_id]).fetchone()
                if failed is not None:
                    pytest.fail(f"pg_cron ran the tick and it failed: {failed[0]!r} ('connection failed': pg_cron "
                                "connects over TCP to cron.host, default localhost; on a server without TCP set "
                                "cron.host to its socket directory, or cron.use_background_workers = on)")
                time.sleep(0.5)  # pg_cron runs once a minute: a polling interval, not a synchronisation
            if fired is None:
                pytest.fail(f"pg_cron did not run the tick within {DEADLINE:.0f}s: is its launcher running in "
                            f"database {cron_database!r} (cron.database_name)?")
            assert fired[0] == {"schedule": "every-minute", "fire_at": registered[0], "payload": None}
            lease = db.execute("SELECT owner FROM alk.get_lock('alk:scheduler')").fetchone()
            assert lease == ("pg_cron",)  # pg_cron leads: it went through the election
        finally:
            cron.execute("SELECT cron.unschedule(%s)", [job_id])


def test_the_recipe_is_the_one_docs_schedule_md_gives() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "schedule.md").read_text()
    assert f"cron.schedule('pyalk-tick', '* * * * *', '{RECIPE.replace(chr(39), chr(39) * 2)}')" in page
