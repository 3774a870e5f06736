"""Completed jobs, results and headers (docs/contract.md#flow-control-and-operations,
docs/queue.md "Completed jobs and results"), checked through alk.* alone."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.conftest import pin_clock
from tests.helpers import one, raises_lk
from tests.sql.test_queue import MAX, MIN, NOW, claim, enqueue, job


@pytest.fixture
def clocked(db: psycopg.Connection) -> psycopg.Connection:
    pin_clock(db, NOW)
    return db


def keep(db: psycopg.Connection, seconds: int, queue: str = "q") -> bool:
    return one(db, "SELECT alk.set_queue_retention(%s, %s)", queue, seconds)


def purge_at(db: psycopg.Connection, job_id: int) -> int | None:
    return one(db, "SELECT purge_at FROM alk.jobs WHERE id = %s", job_id)


def claimed(db: psycopg.Connection, queue: str = "q", **options: Any) -> dict[str, Any]:
    """One job enqueued and claimed by w1."""
    enqueue(db, queue, **options)
    [row] = claim(db, 1, queue=queue)
    return row


# the setting -----------------------------------------------------------------


def test_retention_defaults_to_zero_and_says_whether_it_changed(clocked):
    db = clocked
    assert one(db, "SELECT alk.queue_retention('q')") == 0
    assert keep(db, 60) is True
    assert keep(db, 60) is False
    assert one(db, "SELECT alk.queue_retention('q')") == 60
    assert one(db, "SELECT alk.queue_retention('other')") == 0
    assert keep(db, 0) is True
    assert keep(db, 0) is False
    # 0 is the default: no row left behind for the ack to find.
    assert one(db, "SELECT count(*) FROM alk.queue_settings") == 0


@pytest.mark.parametrize("seconds", [-1, MIN, None])
def test_negative_or_null_retention_is_refused(clocked, seconds):
    with raises_lk("LK002", "completed_s must be >= 0"):
        keep(clocked, seconds)
    assert one(clocked, "SELECT count(*) FROM alk.queue_settings") == 0


@pytest.mark.parametrize("queue", ["", "alk:outbox:x", None])
def test_retention_names_follow_the_queue_rule(clocked, queue):
    with raises_lk("LK001"):
        keep(clocked, 60, queue)
    with raises_lk("LK001"):
        one(clocked, "SELECT alk.queue_retention(%s)", queue)


# ack -----------------------------------------------------------------------------


def test_without_retention_ack_deletes_and_drops_the_result(clocked):
    row = claimed(clocked)
    assert one(clocked, "SELECT alk.ack(%s, 'w1', %s, 'q', '{\"ok\": 1}')", row["id"], row["attempts"]) is True
    assert job(clocked, row["id"]) is None


def test_with_retention_ack_keeps_the_job_completed_with_its_result(clocked):
    db = clocked
    keep(db, 3600)
    row = claimed(db)
    pin_clock(db, NOW + 7)
    assert one(db, "SELECT alk.ack(job_id => %s, worker_id => 'w1', attempt => %s, result => '{\"sent\": [1, 2]}')",
               row["id"], row["attempts"]) is True
    done = job(db, row["id"])
    assert done is not None
    assert done["state"] == "completed"
    assert done["completed_at"] == NOW + 7
    assert done["result"] == {"sent": [1, 2]}
    # Who ran it and when: the last claim's worker, claim and lease stay.
    assert (done["worker_id"], done["claimed_at"], done["attempts"]) == ("w1", NOW, 1)
    assert done["claim_expires_at"] == row["claim_expires_at"]
    assert done["died_at"] is None and done["last_error"] is None
    assert purge_at(db, row["id"]) == NOW + 7 + 3600
    # Settled once: the token is no longer valid.
    assert one(db, "SELECT alk.ack(%s, 'w1', %s)", row["id"], row["attempts"]) is False


def test_a_json_null_result_is_kept_apart_from_no_result(clocked):
    db = clocked
    keep(db, 60)
    first, second = claimed(db), claimed(db)
    one(db, "SELECT alk.ack(%s, 'w1', %s, result => 'null'::jsonb)", first["id"], first["attempts"])
    one(db, "SELECT alk.ack(%s, 'w1', %s)", second["id"], second["attempts"])
    assert one(db, "SELECT result IS NULL FROM alk.jobs WHERE id = %s", first["id"]) is False
    assert one(db, "SELECT jsonb_typeof(result) FROM alk.jobs WHERE id = %s", first["id"]) == "null"
    assert one(db, "SELECT result IS NULL FROM alk.jobs WHERE id = %s", second["id"]) is True


def test_ack_is_still_refused_without_a_valid_claim(clocked):
    db = clocked
    keep(db, 60)
    row = claimed(db, visibility_timeout_s=10)
    assert one(db, "SELECT alk.ack(%s, 'w2', %s)", row["id"], row["attempts"]) is False
    assert one(db, "SELECT alk.ack(%s, 'w1', %s)", row["id"], row["attempts"] + 1) is False
    assert one(db, "SELECT alk.ack(%s, 'w1', %s, 'other')", row["id"], row["attempts"]) is False
    pin_clock(db, NOW + 11)  # lapsed
    assert one(db, "SELECT alk.ack(%s, 'w1', %s)", row["id"], row["attempts"]) is False
    assert job(db, row["id"])["state"] == "processing"


def test_ack_batch_keeps_the_jobs_of_retention_queues_and_deletes_the_others(clocked):
    db = clocked
    keep(db, 60, "kept")
    kept = [claimed(db, "kept") for _ in range(2)]
    gone = claimed(db, "gone")
    ids = [kept[0]["id"], gone["id"], kept[1]["id"], kept[0]["id"]]  # a repeated id: its first entry only
    assert one(db, "SELECT alk.ack_batch(%s, 'w1')", ids) == 3
    assert [job(db, row["id"], "kept")["state"] for row in kept] == ["completed", "completed"]
    assert job(db, gone["id"], "gone") is None
    assert one(db, "SELECT sum(acked) FROM alk.queue_counts") == 3


def test_settle_stores_results_of_acks_and_reports_them_acked(clocked):
    db = clocked
    keep(db, 60)
    acked, retried, failed = (claimed(db) for _ in range(3))
    rows = db.execute(
        "SELECT job_id, state FROM alk.settle(%s, 'w1', %s, ARRAY['ack', 'retry', 'fail'], ARRAY[NULL, 'e', 'f'],"
        " NULL, 'q', ARRAY['{\"n\": 1}', '{\"n\": 2}', '{\"n\": 3}']::jsonb[])",
        [[acked["id"], retried["id"], failed["id"]], [1, 1, 1]],
    ).fetchall()
    assert rows == [(acked["id"], "acked"), (retried["id"], "pending"), (failed["id"], "dead")]
    assert job(db, acked["id"])["result"] == {"n": 1}
    # A result belongs to an ack: a retry or fail ignores it.
    assert job(db, retried["id"])["result"] is None and job(db, failed["id"])["result"] is None


def test_settle_all_acks_and_settle_and_claim_keep_results(clocked):
    db = clocked
    keep(db, 60)
    first, second = claimed(db), claimed(db)
    enqueue(db)
    states = db.execute("SELECT state FROM alk.settle(%s, 'w1', results => ARRAY['1', NULL]::jsonb[])",
                        [[first["id"], first["id"]]]).fetchall()
    assert states == [("acked",), (None,)]
    rows = db.execute(
        "SELECT kind, id, state FROM alk.settle_and_claim('q', 'w1', 1, %s, NULL, NULL, NULL, NULL,"
        " ARRAY['\"done\"']::jsonb[])", [[second["id"]]]).fetchall()
    assert rows[0] == ("settled", second["id"], "acked") and rows[1][0] == "claimed"
    assert (job(db, first["id"])["result"], job(db, second["id"])["result"]) == (1, "done")


def test_misaligned_results_are_refused(clocked):
    row = claimed(clocked)
    with raises_lk("LK002", "2 results"):
        clocked.execute("SELECT * FROM alk.settle(%s, 'w1', results => ARRAY['1', '2']::jsonb[])", [[row["id"]]])


def test_settle_without_retention_deletes_whatever_the_results(clocked):
    row = claimed(clocked)
    states = clocked.execute("SELECT state FROM alk.settle(%s, 'w1', results => ARRAY['1']::jsonb[])",
                             [[row["id"]]]).fetchall()
    assert states == [("acked",)] and job(clocked, row["id"]) is None


# what a completed job is -------------------------------------------------------


def test_a_completed_job_is_never_claimed_cancelled_or_requeued(clocked):
    db = clocked
    keep(db, 60)
    row = claimed(db, visibility_timeout_s=1)
    one(db, "SELECT alk.ack(%s, 'w1', %s)", row["id"], row["attempts"])
    pin_clock(db, NOW + 100)  # its old lease long lapsed
    assert claim(db, 10) == []
    assert one(db, "SELECT alk.next_claim_at('q')") is None
    assert one(db, "SELECT alk.cancel('q', %s)", row["id"]) is False
    assert one(db, "SELECT alk.requeue_dead('q')") == 0
    assert one(db, "SELECT alk.requeue_dead('q', %s)", [row["id"]]) == 0
    assert one(db, "SELECT alk.release_jobs(%s, 'w1', NULL)", [row["id"]]) == 0
    assert one(db, "SELECT alk.heartbeat(%s, 'w1')", row["id"]) is False
    assert job(db, row["id"])["state"] == "completed"


def test_a_completed_job_frees_its_dedup_key(clocked):
    db = clocked
    keep(db, 60)
    row = claimed(db, dedup_key="k")
    assert enqueue(db, dedup_key="k") == row["id"]  # held while processing
    one(db, "SELECT alk.ack(%s, 'w1', %s)", row["id"], row["attempts"])
    again = enqueue(db, dedup_key="k")
    assert again != row["id"]
    assert enqueue(db, dedup_key="k") == again
    assert db.execute("SELECT * FROM alk.enqueue_batch('q', ARRAY['1', '2']::jsonb[], dedup_keys => ARRAY['k', 'k'])"
                      ).fetchall() == [(again,), (again,)]


def test_a_dead_job_behind_a_completed_one_can_be_requeued(clocked):
    db = clocked
    keep(db, 60)
    dead = enqueue(db, dedup_key="k", max_attempts=0)
    claim(db)  # buries it
    done = claimed(db, dedup_key="k")
    one(db, "SELECT alk.ack(%s, 'w1', %s)", done["id"], done["attempts"])
    assert one(db, "SELECT alk.requeue_dead('q')") == 1
    assert job(db, dead)["state"] == "pending"


def test_readers_show_completed_jobs(clocked):
    db = clocked
    keep(db, 60)
    row = claimed(db)
    enqueue(db)
    one(db, "SELECT alk.ack(%s, 'w1', %s, result => '[1]')", row["id"], row["attempts"])
    listed = db.execute("SELECT id, result, completed_at FROM alk.list_jobs('q', 'completed')").fetchall()
    assert listed == [(row["id"], [1], NOW)]
    browsed = db.execute("SELECT id, state FROM alk.browse_jobs('q', 'completed')").fetchall()
    assert browsed == [(row["id"], "completed")]
    stats = db.execute("SELECT pending, processing, dead, completed, estimated FROM alk.queue_stats('q')").fetchone()
    assert stats == (1, 0, 0, 1, False)


def test_queue_stats_lists_a_queue_holding_only_completed_jobs_and_estimates_past_the_limit(clocked):
    db = clocked
    keep(db, 60, "only")
    for _ in range(3):
        row = claimed(db, "only")
        one(db, "SELECT alk.ack(%s, 'w1', %s)", row["id"], row["attempts"])
    assert db.execute("SELECT queue, pending, completed FROM alk.queue_stats()").fetchall() == [("only", 0, 3)]
    completed, estimated = db.execute("SELECT completed, estimated FROM alk.queue_stats('only', 1)").fetchone()
    assert completed >= 2 and estimated is True


def test_a_later_setting_leaves_completed_jobs_their_own_retention(clocked):
    db = clocked
    keep(db, 100)
    row = claimed(db)
    one(db, "SELECT alk.ack(%s, 'w1', %s)", row["id"], row["attempts"])
    keep(db, 0)
    assert job(db, row["id"])["state"] == "completed"
    assert purge_at(db, row["id"]) == NOW + 100


# the sweep -----------------------------------------------------------------------


def test_sweep_purges_completed_jobs_at_their_retention_and_counts_them(clocked):
    db = clocked
    keep(db, 60)
    row = claimed(db)
    one(db, "SELECT alk.ack(%s, 'w1', %s)", row["id"], row["attempts"])
    pin_clock(db, NOW + 59)
    assert one(db, "SELECT alk.sweep_expired('q')") == 0
    pin_clock(db, NOW + 60)  # completed_at <= now - retention
    assert one(db, "SELECT alk.sweep_expired('q')") == 1
    assert job(db, row["id"]) is None


@pytest.mark.parametrize(
    ("at", "retention", "expected_purge_at", "sweep_at", "purged"),
    [
        (MAX - 5, 10, None, MAX, 0),  # now + retention past the maximum: never
        (NOW, MAX, None, MAX, 0),
        (MAX - 10, 10, MAX, MAX, 1),  # exactly the maximum
        (MIN, 10, MIN, MIN, 1),  # sat(now - retention) never drops below MIN: due at once
        (MIN + 5, 1, MIN + 6, MIN + 6, 1),
    ],
)
def test_completed_retention_saturates(db, at, retention, expected_purge_at, sweep_at, purged):
    pin_clock(db, at)
    keep(db, retention)
    row = claimed(db)
    assert one(db, "SELECT alk.ack(%s, 'w1', %s)", row["id"], row["attempts"]) is True
    assert job(db, row["id"])["completed_at"] == at
    assert purge_at(db, row["id"]) == expected_purge_at
    pin_clock(db, sweep_at)
    assert one(db, "SELECT alk.sweep_expired('q')") == purged


# headers -------------------------------------------------------------------------


def test_headers_travel_with_the_job(clocked):
    db = clocked
    headers = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    job_id = enqueue(db, headers=headers)
    assert job(db, job_id)["headers"] == {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    [row] = claim(db)
    assert row["headers"]["traceparent"].startswith("00-")
    assert job(db, enqueue(db))["headers"] is None


def test_batch_headers_go_to_every_job_of_the_batch(clocked):
    db = clocked
    for keys in (None, ["a", None]):
        ids = [r[0] for r in db.execute(
            "SELECT * FROM alk.enqueue_batch('q', ARRAY['1', '2']::jsonb[], dedup_keys => %s,"
            " headers => '{\"c\": 1}')", [keys]).fetchall()]
        assert [job(db, i)["headers"] for i in ids] == [{"c": 1}, {"c": 1}]


def test_outbox_enqueue_forms_store_headers(clocked):
    db = clocked
    one_id = one(db, "SELECT alk.outbox_enqueue('b', '1', headers => '{\"h\": 1}')")
    batch = [r[0] for r in db.execute(
        "SELECT * FROM alk.outbox_enqueue_batch('b', ARRAY['2']::jsonb[], headers => '{\"h\": 2}')").fetchall()]
    got = [one(db, "SELECT headers FROM alk.outbox_get_job('b', %s)", i) for i in [one_id, *batch]]
    assert got == [{"h": 1}, {"h": 2}]


@pytest.mark.parametrize("headers", ["[]", "1", '"x"', "null", "true"])
@pytest.mark.parametrize(
    "call",
    [
        "SELECT alk.enqueue('q', '1', headers => %s::jsonb)",
        "SELECT alk.enqueue('q', '1', dedup_key => 'k', headers => %s::jsonb)",
        "SELECT * FROM alk.enqueue_batch('q', ARRAY['1']::jsonb[], headers => %s::jsonb)",
        "SELECT * FROM alk.enqueue_batch('q', ARRAY['1']::jsonb[], dedup_keys => ARRAY['k'], headers => %s::jsonb)",
        "SELECT * FROM alk.enqueue_batch('q', ARRAY[]::jsonb[], headers => %s::jsonb)",
        "SELECT alk.outbox_enqueue('b', '1', headers => %s::jsonb)",
        "SELECT * FROM alk.outbox_enqueue_batch('b', ARRAY['1']::jsonb[], headers => %s::jsonb)",
    ],
)
def test_headers_that_are_not_an_object_are_refused(clocked, call, headers):
    with raises_lk("LK002", "headers must be a JSON object or NULL"):
        clocked.execute(call, [headers]).fetchall()
    assert one(clocked, "SELECT count(*) FROM alk.jobs") == 0


# the old call forms --------------------------------------------------------------


def test_every_earlier_call_form_still_resolves(clocked):
    db = clocked
    first = one(db, "SELECT alk.enqueue('q', '1', NULL, NULL, 0, 3, NULL, 300, 5, NULL, 'k')")
    second = one(db, "SELECT alk.enqueue(queue => 'q', payload => '2', dedup_key => 'k2')")
    ids = db.execute("SELECT * FROM alk.enqueue_batch('q', ARRAY['3']::jsonb[], NULL, NULL, 0, 3, NULL, 300, 5,"
                     " NULL, NULL)").fetchall()
    one(db, "SELECT alk.outbox_enqueue('b', '1', NULL, NULL, 0, 5, NULL, 60, 5, NULL, NULL)")
    db.execute("SELECT * FROM alk.outbox_enqueue_batch('b', ARRAY['1']::jsonb[], NULL, NULL, 0, 5, NULL, 60, 5, NULL)")
    rows = claim(db, 3)
    assert {r["id"] for r in rows} == {first, second, ids[0][0]}
    assert one(db, "SELECT alk.ack(%s, 'w1', %s, 'q')", rows[0]["id"], rows[0]["attempts"]) is True
    assert db.execute("SELECT state FROM alk.settle(%s, 'w1', %s, NULL, NULL, NULL, 'q')",
                      [[rows[1]["id"]], [rows[1]["attempts"]]]).fetchall() == [("acked",)]
    settled = db.execute("SELECT kind, state FROM alk.settle_and_claim('q', 'w1', 0, %s, %s, NULL, NULL, NULL)",
                         [[rows[2]["id"]], [rows[2]["attempts"]]]).fetchall()
    assert settled == [("settled", "acked")]
