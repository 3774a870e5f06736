"""The claim's ordered scans merge each slot's index, whatever the statistics
say (docs/design.md, "Ordered scans merge, never sort"). A queue's statistics
are wrong most of the time: taken while a slot was empty, or drained, or full
of processing rows, they count few pending jobs, and the planner then found
it cheaper to sort the whole Append of the two slots than to merge their
ordered index scans: every claim read and sorted every pending job. This runs
on every server version the suite runs on (CI: 18 and 15)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg

from tests.helpers import one


def _scans_a_slot(node: dict[str, Any]) -> bool:
    """Whether the node reads a slot through an index in claim order (one
    ending in priority, run_at, id: jobs_claim_pending, a group's turns)."""
    return "priority_run_at_id" in str(node.get("Index Name", "")) or any(
        _scans_a_slot(c) for c in node.get("Plans", []))


def _sorted_appends(node: dict[str, Any]) -> list[str]:
    """The Sort nodes directly over an Append of slot scans whose index gives
    the order, anywhere in a JSON plan (the lapsed leases' sort has no such
    index, and a sort of the few claimed rows is not one)."""
    found = []
    children = node.get("Plans", [])
    if node.get("Node Type") == "Sort" and any(c.get("Node Type") == "Append" and _scans_a_slot(c)
                                               for c in children):
        found.append(", ".join(node.get("Sort Key", [])))
    for child in children:
        found += _sorted_appends(child)
    return found


def test_a_claim_under_statistics_from_an_empty_slot_merges_and_never_sorts_the_backlog(
    db: psycopg.Connection,
) -> None:
    # PostgreSQL 18 and later: sorts off (0036); before 18: sequential and
    # bitmap scans off (0039). Either way each slot is read through its index.
    for slot in ("alk.jobs_0", "alk.jobs_1"):
        db.execute(f"ALTER TABLE {slot} SET (autovacuum_enabled = off)")  # type: ignore[arg-type]
    db.execute("ANALYZE alk.jobs")  # column statistics of empty slots
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[5000]))")
    db.execute("VACUUM alk.jobs")  # row counts, no column statistics
    notes: list[str] = []
    db.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
    db.execute("LOAD 'auto_explain'")
    for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_level = notice",
                    "log_format = json"):
        db.execute(f"SET auto_explain.{setting}")  # type: ignore[arg-type]
    for n in (1, 100):
        assert one(db, "SELECT count(*) FROM alk.claim('q', 'w', %s)", n) == n
    assert one(db, "SELECT alk.next_claim_at('q') IS NOT NULL")
    plans = [json.loads(note.split("plan:", 1)[1]) for note in notes if "plan:" in note]
    assert any("alk.jobs" in p["Query Text"] for p in plans)  # the nested statements were seen
    sorts = [(p["Query Text"][:60], key) for p in plans for key in _sorted_appends(p["Plan"])]
    assert sorts == []


def _claim_index_reads(db: psycopg.Connection) -> int:
    """Entries of jobs_claim_pending (every slot's) this backend has read and
    not yet reported (a backend reports at most once a second, so only the
    difference between two calls counts)."""
    return int(one(db, "SELECT sum(pg_stat_get_xact_tuples_returned(i.inhrelid)) FROM pg_inherits i "
                       "WHERE i.inhparent = 'alk.jobs_claim_pending'::regclass"))


def test_under_a_held_snapshot_a_claim_reads_each_settled_entry_once(
    db: psycopg.Connection, connect: Callable[..., psycopg.Connection],
) -> None:
    db.execute("SELECT alk.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[400]))")
    holder = connect()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM alk.jobs_kept")
    # 300 settled ahead of the 100 left: their pending entries point at rows
    # no claim can see, which no scan may mark dead while the holder's
    # snapshot sees them, so every claim walks them.
    taken = db.execute("SELECT id, attempts FROM alk.claim('q', 'w', 300)").fetchall()
    assert one(db, "SELECT alk.ack_batch(%s, 'w', %s, 'q')", [t[0] for t in taken], [t[1] for t in taken]) == 300
    reads = []
    for call in ("SELECT count(*) FROM alk.claim('q', 'w', 1)", "SELECT alk.next_claim_at('q')",
                 "SELECT alk._due_pending('q', alk.now())"):
        before = _claim_index_reads(db)
        assert one(db, call)
        reads.append(_claim_index_reads(db) - before)
    # Once each (the loose scan that finds the priority's first entry), not
    # twice or three times: the scans after it start at that entry (0051).
    assert all(300 <= n < 400 for n in reads), reads


def test_due_pending_stops_at_the_first_due_priority(db: psycopg.Connection) -> None:
    # One due job in each of 50 priorities: the first priority answers, so
    # the loose scan probes no lower one (alk._pending_priorities' due_by;
    # 0052), as the EXISTS over the inline scan before it did.
    db.execute("SELECT alk.enqueue('q', '{}'::jsonb, priority => p) FROM generate_series(1, 50) p")
    before = _claim_index_reads(db)
    assert one(db, "SELECT alk._due_pending('q', alk.now())") is True
    reads = _claim_index_reads(db) - before
    assert reads < 10, reads
    before = _claim_index_reads(db)
    assert one(db, "SELECT alk.next_claim_at('q') <= alk.now()") is True  # this one reads every priority
    assert _claim_index_reads(db) - before >= 50
