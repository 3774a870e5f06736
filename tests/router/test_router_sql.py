"""The SQL contract through the PL/Proxy router: the same calls give the
same results on one server ("single") and through routers over 2 and 4
partitions; and what only the router does (routing, the queue a job op
needs, tick's forwarding)."""

from __future__ import annotations

import hashlib
import json

import psycopg
import pytest

from pyalk.schema import router
from tests.helpers import one, raises_lk, until
from tests.router.conftest import Target


def _public(dsn: str) -> dict[str, tuple[str, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',"
            " pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)"
            " FROM pg_proc p WHERE p.pronamespace = 'alk'::regnamespace AND p.proname !~ '^_'").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


# the generated install ---------------------------------------------------------


def test_the_router_has_every_public_function_with_its_arguments_defaults_and_result(routed: Target):
    local = {name for name, route in router.ROUTES.items() if route == "local"}
    partition = {k: v for k, v in _public(routed.partitions[0]).items() if k.split("(")[0] not in local}
    routed_functions = _public(routed.dsn)
    assert {k: routed_functions[k] for k in partition} == partition
    assert set(routed_functions) - set(partition) == {"partition_of(name text)", "partition_conninfo(name text)"}


def test_a_function_without_a_routing_rule_stops_the_generation():
    mystery = router.Function("mystery", "x integer", "x integer", "bigint", False, ("x",))
    catalog = router.Catalog("0008", [mystery], {})
    with pytest.raises(router.RouterError, match=r"no routing rule for alk.mystery\(x integer\)"):
        router.router_script(catalog, ["dbname=p0"])


@pytest.mark.parametrize("count", [0, 3, 6])
def test_the_partition_count_must_be_a_power_of_two(count: int):
    with pytest.raises(router.RouterError, match="power of two"):
        router.router_install([f"dbname=p{i}" for i in range(count)])


def test_names_spread_over_the_partitions_and_land_where_partition_of_says(routed: Target, tag: str):
    with psycopg.connect(routed.dsn, autocommit=True) as db:
        places = {}
        # Names until every partition holds one (the tag is random: 16 fixed
        # names miss one of 4 partitions about once in 25 runs).
        for i in range(200):
            queue = f"{tag}-{i}"
            job_id = one(db, "SELECT alk.enqueue(%s, '{}')", queue)
            places[queue] = (job_id, one(db, "SELECT alk.partition_of(%s)", queue))
            if i >= 15 and len({part for _, part in places.values()}) == len(routed.partitions):
                break
    assert len({part for _, part in places.values()}) == len(routed.partitions)
    for queue, (_, part) in places.items():
        for i, conninfo in enumerate(routed.partitions):
            with psycopg.connect(conninfo, autocommit=True) as direct:
                here = one(direct, "SELECT count(*) FROM alk.list_jobs(%s)", queue)
            assert here == (1 if i == part else 0), (queue, i)
        assert routed.partition_of(queue) == routed.partitions[part]


def test_the_hash_is_the_first_four_bytes_of_sha256(routed: Target):
    with psycopg.connect(routed.dsn, autocommit=True) as db:
        expected = int.from_bytes(hashlib.sha256(b"emails").digest()[:4], "big", signed=True)
        assert one(db, "SELECT alk._partition_hash('emails')") == expected
        assert one(db, "SELECT alk.partition_of('emails')") == expected & (len(routed.partitions) - 1)


# queue lifecycle -----------------------------------------------------------------


def test_enqueue_claim_ack_with_fencing(db: psycopg.Connection, tag: str):
    q = f"{tag}-q"
    job_id = one(db, "SELECT alk.enqueue(%s, '{\"n\": 1}', priority => 2)", q)
    claimed = db.execute("SELECT id, attempts, payload, priority FROM alk.claim(%s, 'w1', 5)", [q]).fetchall()
    assert claimed == [(job_id, 1, {"n": 1}, 2)]
    assert one(db, "SELECT alk.ack(%s, 'w2', 1, queue => %s)", job_id, q) is False  # another worker
    assert one(db, "SELECT alk.ack(%s, 'w1', 7, queue => %s)", job_id, q) is False  # a stale token
    assert one(db, "SELECT alk.ack(%s, 'w1', 1, queue => %s)", job_id, q) is True
    assert one(db, "SELECT count(*) FROM alk.get_job(%s, %s)", q, job_id) == 0


def test_a_lapsed_claim_is_reclaimed_and_the_old_token_is_refused(db: psycopg.Connection, tag: str):
    q = f"{tag}-q"
    job_id = one(db, "SELECT alk.enqueue(%s, '{}')", q)
    assert one(db, "SELECT attempts FROM alk.claim(%s, 'w1')", q) == 1
    # A negative extend voids the lease: the job is claimable again at once.
    assert one(db, "SELECT alk.heartbeat(%s, 'w1', 1, -10, queue => %s)", job_id, q) is True
    assert one(db, "SELECT attempts FROM alk.claim(%s, 'w2')", q) == 2
    assert one(db, "SELECT alk.retry(%s, 'w1', 1, 'late', 0, queue => %s)", job_id, q) is False
    assert one(db, "SELECT alk.heartbeat(%s, 'w2', 2, 60, queue => %s)", job_id, q) is True
    assert one(db, "SELECT alk.retry(%s, 'w2', 2, 'boom', 0, queue => %s)", job_id, q) is True
    row = db.execute("SELECT state, attempts, worker_id, last_error FROM alk.get_job(%s, %s)", [q, job_id]).fetchone()
    assert row == ("pending", 2, None, None)
    assert one(db, "SELECT attempts FROM alk.claim(%s, 'w3')", q) == 3
    assert one(db, "SELECT alk.fail(%s, 'w3', 3, 'no', queue => %s)", job_id, q) is True
    row = db.execute("SELECT state, last_error FROM alk.get_job(%s, %s)", [q, job_id]).fetchone()
    assert row == ("dead", "no")


def test_enqueue_batch_ack_batch_cancel_and_sweep(db: psycopg.Connection, tag: str):
    q = f"{tag}-q"
    ids = [r[0] for r in db.execute("SELECT * FROM alk.enqueue_batch(%s, %s::jsonb[])",
                                    [q, [json.dumps({"i": i}) for i in range(5)]])]
    assert len(ids) == 5 and ids == sorted(ids)
    claimed = db.execute("SELECT id, attempts FROM alk.claim(%s, 'w', 3)", [q]).fetchall()
    assert [c[0] for c in claimed] == ids[:3]
    acked = one(db, "SELECT alk.ack_batch(%s, 'w', %s, queue => %s)",
                [c[0] for c in claimed], [c[1] for c in claimed], q)
    assert acked == 3
    assert one(db, "SELECT alk.cancel(%s, %s)", q, ids[3]) is True
    assert one(db, "SELECT alk.cancel(%s, %s)", q, ids[3]) is False
    expiring = one(db, "SELECT alk.enqueue(%s, '{}', expires => -1)", q)
    assert one(db, "SELECT alk.sweep_expired(%s)", q) == 1
    assert one(db, "SELECT state FROM alk.get_job(%s, %s)", q, expiring) == "dead"
    stats = db.execute("SELECT queue, pending, dead FROM alk.queue_stats(%s)", [q]).fetchall()
    assert stats == [(q, 1, 1)]


def test_bad_input_is_refused_as_one_server_refuses_it(db: psycopg.Connection):
    with raises_lk("LK001", "queue"):
        db.execute("SELECT alk.enqueue('', '{}')")
    with raises_lk("LK001", "queue"):
        db.execute("SELECT alk.enqueue(NULL, '{}')")
    with raises_lk("LK002", "ttl"):
        db.execute("SELECT alk.try_lock('some-lock', 'o', 0)")


def test_a_job_op_without_its_queue_is_refused_through_the_router(target: Target, db: psycopg.Connection, tag: str):
    q = f"{tag}-q"
    job_id = one(db, "SELECT alk.enqueue(%s, '{}')", q)
    one(db, "SELECT id FROM alk.claim(%s, 'w')", q)
    calls = [
        "SELECT alk.heartbeat(%s, 'w', 1, 60)",
        "SELECT alk.retry(%s, 'w', 1, 'e', 0)",
        "SELECT alk.fail(%s, 'w', 1)",
        "SELECT alk.ack_batch(ARRAY[%s]::bigint[], 'w')",
        "SELECT alk.snooze(%s, 'w', 1, 0)",
        "SELECT alk.ack(%s, 'w', 1)",
    ]
    if not target.routed:  # one server: the queue is optional
        assert one(db, calls[0], job_id) is True
        return
    for call in calls:
        with raises_lk("LK002", "queue must be given through the router"):
            db.execute(call, [job_id])
    assert one(db, "SELECT state FROM alk.get_job(%s, %s)", q, job_id) == "processing"


def test_queue_stats_of_every_queue_merge_in_name_order(db: psycopg.Connection, tag: str):
    queues = [f"{tag}-{c}" for c in "dbca"]
    for q in queues:
        db.execute("SELECT alk.enqueue(%s, '{}')", [q])
    names = [r[0] for r in db.execute("SELECT queue FROM alk.queue_stats()") if r[0].startswith(tag)]
    assert names == sorted(queues)
    all_names = [r[0] for r in db.execute("SELECT queue FROM alk.queue_stats()")]
    assert all_names == sorted(all_names)


# streams -------------------------------------------------------------------------


def test_stream_order_and_checkpoints(db: psycopg.Connection, tag: str):
    s = f"{tag}-s"
    offsets = [one(db, "SELECT alk.publish(%s, %s::jsonb)", s, json.dumps({"i": i})) for i in range(5)]
    assert offsets == [1, 2, 3, 4, 5]
    assert [r[0] for r in db.execute("SELECT * FROM alk.publish_batch(%s, ARRAY['1','2']::jsonb[])", [s])] == [6, 7]
    events = db.execute("SELECT event_offset, payload FROM alk.read_since(%s, 2, 2)", [s]).fetchall()
    assert events == [(3, {"i": 2}), (4, {"i": 3})]
    assert one(db, "SELECT alk.get_offset(%s, 'c')", s) == 0
    assert one(db, "SELECT alk.save_offset(%s, 'c', 4)", s) is True
    assert one(db, "SELECT alk.save_offset(%s, 'c', 3)", s) is False  # monotone
    assert [r[0] for r in db.execute("SELECT event_offset FROM alk.read_from_consumer(%s, 'c', 10)", [s])] == [5, 6, 7]
    assert one(db, "SELECT alk.trim_to(%s, 5)", s) == 5
    assert [r[0] for r in db.execute("SELECT event_offset FROM alk.read_since(%s, 0)", [s])] == [6, 7]


# locks ---------------------------------------------------------------------------


def test_locks_by_name(db: psycopg.Connection, tag: str):
    lock = f"{tag}-lock"
    assert one(db, "SELECT alk.try_lock(%s, 'a', 30)", lock) is True
    assert one(db, "SELECT alk.try_lock(%s, 'b', 30)", lock) is False
    assert one(db, "SELECT (alk.get_lock(%s)).owner", lock) == "a"
    assert one(db, "SELECT alk.renew_lock(%s, 'b', 30)", lock) is False
    assert one(db, "SELECT alk.renew_lock(%s, 'a', 30)", lock) is True
    assert one(db, "SELECT alk.release_lock(%s, 'a')", lock) is True
    assert one(db, "SELECT alk.try_lock(%s, 'b', 30)", lock) is True


# scheduler -----------------------------------------------------------------------

START = 1_900_000_000  # a minute boundary: tick at explicit instants, no clock pinning


def _schedules(db: psycopg.Connection, tag: str, count: int) -> list[tuple[str, str]]:
    pairs = [(f"{tag}-sched-{i}", f"{tag}-target-{i}") for i in range(count)]
    for name, queue in pairs:
        db.execute("SELECT alk.schedule(%s, '@every 1m', %s, payload => %s::jsonb)", [name, queue, json.dumps(name)])
    return pairs


def _due(db: psycopg.Connection, name: str) -> int:
    return int(one(db, "SELECT next_fire_at FROM alk.get_schedule(%s)", name))


def test_tick_fires_each_boundary_once_onto_the_partition_of_its_queue(target: Target, db: psycopg.Connection,
                                                                        tag: str):
    pairs = _schedules(db, tag, 8)
    at = max(_due(db, name) for name, _ in pairs) + 120
    fired = [r for r in db.execute("SELECT schedule_name, queue, fire_at, job_id FROM alk.tick(%s)", [at])
             if r[0].startswith(tag)]
    assert sorted({r[0] for r in fired}) == sorted(name for name, _ in pairs)
    assert [r[:3] for r in fired] == sorted(r[:3] for r in fired)
    for name, queue, fire_at, job_id in fired:
        assert dict(pairs)[name] == queue and job_id is not None
        with psycopg.connect(target.partition_of(queue), autocommit=True) as home:
            job = home.execute("SELECT payload FROM alk.get_job(%s, %s)", [queue, job_id]).fetchone()
        assert job == ({"schedule": name, "fire_at": fire_at, "payload": name},)
    # Every fired job is a pending job of its queue, and nothing is left elsewhere.
    counts = {r[0]: r[1] for r in db.execute("SELECT queue, pending FROM alk.queue_stats()")}
    for _, queue in pairs:
        assert counts[queue] == sum(1 for r in fired if r[1] == queue)
    if target.routed:
        for _, queue in pairs:
            for conninfo in target.partitions:
                if conninfo != target.partition_of(queue):
                    with psycopg.connect(conninfo, autocommit=True) as other:
                        assert one(other, "SELECT count(*) FROM alk.list_jobs(%s)", queue) == 0
    again = [r for r in db.execute("SELECT schedule_name FROM alk.tick(%s)", [at]) if r[0].startswith(tag)]
    assert again == []


def test_list_schedules_merge_in_name_order_and_unschedule_by_name(db: psycopg.Connection, tag: str):
    pairs = _schedules(db, tag, 6)
    listed = [r[0] for r in db.execute("SELECT name FROM alk.list_schedules()")]
    assert listed == sorted(listed) and {n for n, _ in pairs} <= set(listed)
    assert one(db, "SELECT (alk.get_schedule(%s)).queue", pairs[2][0]) == pairs[2][1]
    assert one(db, "SELECT alk.unschedule(%s)", pairs[2][0]) is True
    assert db.execute("SELECT * FROM alk.get_schedule(%s)", [pairs[2][0]]).fetchall() == []


def _release_lease(target: Target, owner: str) -> None:
    # The internal form is not routed: release on the lease's partition.
    with psycopg.connect(target.partition_of("alk:scheduler"), autocommit=True) as home:
        home.execute("SELECT alk._release_lock('alk:scheduler', %s)", [owner])


def test_scheduler_tick_elects_one_leader_and_forwards_what_it_fires(target: Target, db: psycopg.Connection, tag: str):
    leader, other = f"{tag}-a", f"{tag}-b"
    # Schedules whose queues live on other partitions than the schedules, and on the same.
    pairs = [(f"{tag}-s{i}", f"{tag}-q{i}") for i in range(6)]
    try:
        assert isinstance(db.execute("SELECT * FROM alk.scheduler_tick(%s, 60)", [leader]).fetchall(), list)
        for name, queue in pairs:
            db.execute("SELECT alk.schedule(%s, '* * * * * *', %s)", [name, queue])
        until(lambda: all(_due(db, name) <= one(db, "SELECT alk.now()") for name, _ in pairs), "due schedules")
        due_before = {name: _due(db, name) for name, _ in pairs}
        with raises_lk("LK004", other, leader):
            db.execute("SELECT * FROM alk.scheduler_tick(%s, 60)", [other])
        assert {name: _due(db, name) for name, _ in pairs} == due_before  # nothing fired
        assert all(one(db, "SELECT count(*) FROM alk.list_jobs(%s)", queue) == 0 for _, queue in pairs)
        fired = [r for r in db.execute("SELECT * FROM alk.scheduler_tick(%s, 60)", [leader]) if r[0].startswith(tag)]
        assert {r[0] for r in fired} == {name for name, _ in pairs}
        for name, queue, fire_at, job_id in fired:
            job = db.execute("SELECT payload FROM alk.get_job(%s, %s)", [queue, job_id]).fetchone()
            assert job == ({"schedule": name, "fire_at": fire_at, "payload": None},)
        holder = db.execute("SELECT owner FROM alk.get_lock('alk:scheduler')").fetchone()
        assert holder == (leader,)
    finally:
        for name, _ in pairs:
            db.execute("SELECT alk.unschedule(%s)", [name])
        _release_lease(target, leader)


def test_a_lapsed_scheduler_lease_hands_over(target: Target, db: psycopg.Connection, tag: str):
    first, second = f"{tag}-a", f"{tag}-b"
    try:
        db.execute("SELECT * FROM alk.scheduler_tick(%s, 1)", [first])

        def taken_over() -> bool:
            try:
                db.execute("SELECT * FROM alk.scheduler_tick(%s, 60)", [second])
            except psycopg.Error as error:
                assert error.sqlstate == "LK004", error
                return False
            return True

        until(taken_over, "the second owner to take the lapsed lease")
        with raises_lk("LK004", first, second):
            db.execute("SELECT * FROM alk.scheduler_tick(%s, 60)", [first])
    finally:
        _release_lease(target, first)
        _release_lease(target, second)


def test_a_job_a_crashed_tick_left_behind_is_forwarded_by_the_next_tick(routed: Target, tag: str):
    with psycopg.connect(routed.dsn, autocommit=True) as db:
        name, queue = next((n, q) for n, q in ((f"{tag}-s{i}", f"{tag}-q{i}") for i in range(64))
                           if routed.partition_of(n) != routed.partition_of(q))
        db.execute("SELECT alk.schedule(%s, '@every 1m', %s)", [name, queue])
        # What a router that died between the partition's tick and the forwarding leaves:
        # a fired job of queue on the schedule's partition.
        with psycopg.connect(routed.partition_of(name), autocommit=True) as source:
            one(source, "SELECT alk.enqueue(%s, '{\"left\": true}', priority => 4)", queue)
        db.execute("SELECT * FROM alk.tick(%s)", [START])
        with psycopg.connect(routed.partition_of(name), autocommit=True) as source:
            assert one(source, "SELECT count(*) FROM alk.list_jobs(%s)", queue) == 0
        moved = db.execute("SELECT payload, priority FROM alk.claim(%s, 'w', 10)", [queue]).fetchall()
        assert ({"left": True}, 4) in moved


# workers ----------------------------------------------------------------------------


def test_a_workers_row_lives_with_its_queue_and_is_reached_with_or_without_it(target: Target,
                                                                                 db: psycopg.Connection, tag: str):
    queues = [f"{tag}-q{i}" for i in range(4)]
    ids = [f"{tag}-w{i}" for i in range(4)]
    for worker_id, queue in zip(ids, queues, strict=True):
        channel = one(db, "SELECT alk.worker_register(%s, %s, 'h', 1, 2, 'v')", worker_id, queue)
        assert channel.startswith("alk_w_")
        with psycopg.connect(target.partition_of(queue), autocommit=True) as home:
            assert one(home, "SELECT queue FROM alk.workers() WHERE worker_id = %s", worker_id) == queue
    listed = [row[0] for row in db.execute("SELECT worker_id FROM alk.workers()")]
    assert [worker_id for worker_id in listed if worker_id.startswith(tag)] == ids
    assert listed == sorted(listed)  # the merge keeps one server's order

    assert one(db, "SELECT alk.worker_beat(%s, 3, %s)", ids[0], queues[0]) is False
    assert one(db, "SELECT alk.worker_beat(%s, 3)", ids[0]) is False
    assert one(db, "SELECT alk.request_stop(%s)", ids[1]) is True
    assert one(db, "SELECT alk.worker_beat(%s, 0)", ids[1]) is True
    assert one(db, "SELECT alk.worker_beat(%s, 0, %s)", ids[1], queues[1]) is True
    assert one(db, "SELECT alk.request_stop(%s, %s)", ids[2], queues[2]) is True
    assert one(db, "SELECT alk.request_stop(%s, %s)", ids[3], queues[2]) is False  # another queue: not found
    assert one(db, "SELECT alk.request_stop(%s)", f"{tag}-nobody") is False
    assert one(db, "SELECT alk.worker_beat(%s, 0)", f"{tag}-nobody") is None
    assert one(db, "SELECT alk.worker_deregister(%s)", ids[0]) is True
    assert one(db, "SELECT alk.worker_deregister(%s, %s)", ids[1], queues[1]) is True
    assert one(db, "SELECT alk.worker_beat(%s, 0)", ids[0]) is None
    stopping = {row[0]: row[1] for row in db.execute("SELECT worker_id, stopping FROM alk.workers()")
                if row[0].startswith(tag)}
    assert stopping == {ids[2]: True, ids[3]: False}


def test_rotations_through_the_router_reach_every_partition_and_keep_every_token(routed: Target, tag: str):
    # alk.rotate_jobs is routed to any partition (a worker's calls land on each
    # in turn): calls through the router rotate every partition's storage, and
    # a job claimed on a partition before its rotation still acks with its token.
    queue_on: dict[str, str] = {}
    n = 0
    while len(queue_on) < len(routed.partitions):
        queue_on.setdefault(routed.partition_of(f"{tag}-q{n}"), f"{tag}-q{n}")
        n += 1

    def rotations() -> dict[str, int]:
        found = {}
        for partition in routed.partitions:
            with psycopg.connect(partition, autocommit=True) as conn:
                found[partition] = one(conn, "SELECT rotations FROM alk.job_slots")
        return found

    with psycopg.connect(routed.dsn, autocommit=True) as db:
        claimed = {}
        for queue in queue_on.values():
            job_id = one(db, "SELECT alk.enqueue(%s, '{}')", queue)
            assert db.execute("SELECT id, attempts FROM alk.claim(%s, 'w', 1)", [queue]).fetchall() == [(job_id, 1)]
            claimed[queue] = job_id
        before = rotations()
        answers = []
        # Any partition per call: 200 calls miss one of 4 partitions with odds of (3/4)^200.
        while any(count == before[p] for p, count in rotations().items()) and len(answers) < 200:
            answers.append(one(db, "SELECT alk.rotate_jobs(0)"))
        after = rotations()
        assert all(after[p] > before[p] for p in routed.partitions), answers
        assert sum(after.values()) - sum(before.values()) == len(answers)  # each call rotated one partition
        assert set(answers) == {"rotated"}
        for queue, job_id in claimed.items():
            assert one(db, "SELECT alk.ack(%s, 'w', 2, queue => %s)", job_id, queue) is False  # never issued
            assert one(db, "SELECT alk.ack(%s, 'w', 1, queue => %s)", job_id, queue) is True
