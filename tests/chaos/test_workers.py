"""Worker processes killed, stalled and outlived: SIGKILL (threaded and async
workers), handlers longer than the visibility timeout, SIGSTOP past the lease
then SIGCONT, repeated kills. Every phase drains the queue and checks the
ledger (tests/chaos/harness.py: nothing lost, nothing started twice under a
valid lease); recovery times are reported, not asserted."""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.chaos.harness import check, enqueue, first_start_after, live_jobs, read_ledger, worker_summary
from tests.chaos.servers import until


@pytest.mark.parametrize("handler", ["work", "work_async"])
def test_sigkill_mid_run(chaos_dsn, ledger, spawn, report, handler):
    ids = enqueue(chaos_dsn, 200, seconds=0.05, visibility=2)
    victim = spawn(chaos_dsn, "victim", "--concurrency", "4", handler=handler)
    spawn(chaos_dsn, "survivor", "--concurrency", "4", handler=handler)
    until(lambda: sum(s.worker == "victim" for s in read_ledger(ledger)) >= 20, "the victim to start 20 jobs")
    victim.kill()
    killed_at = time.time()
    spawn(chaos_dsn, "replacement", "--concurrency", "4", handler=handler)
    until(lambda: live_jobs(chaos_dsn) == 0, "the queue to drain", deadline=120)
    figures = check(ledger, ids, chaos_dsn)
    reruns = [s for s in read_ledger(ledger) if s.attempt > 1]
    assert reruns, "the victim held jobs when it was killed: they must run again"
    figures["recovery_s"] = round(min(s.start for s in reruns) - killed_at, 3)  # kill -> first orphan rerun
    report.update(figures)
    assert figures["recovery_s"] < 60


def test_handlers_longer_than_the_visibility_timeout_keep_their_lease(chaos_dsn, ledger, spawn, report):
    ids = enqueue(chaos_dsn, 16, seconds=5.0, visibility=2)
    began = time.monotonic()
    for name in ("a", "b"):
        spawn(chaos_dsn, name, "--concurrency", "8")
    until(lambda: live_jobs(chaos_dsn) == 0, "the queue to drain", deadline=120)
    figures = check(ledger, ids, chaos_dsn)
    assert figures["reruns"] == 0, "a heartbeat failed to keep a 5 s job's 2 s lease"
    figures["elapsed_s"] = round(time.monotonic() - began, 2)
    report.update(figures)


def test_sigstop_past_the_lease_then_sigcont_its_late_acks_are_refused(chaos_dsn, ledger, spawn, report):
    ids = enqueue(chaos_dsn, 12, seconds=2.0, visibility=2)
    stalled = spawn(chaos_dsn, "stalled", "--concurrency", "4")
    until(lambda: sum(s.worker == "stalled" for s in read_ledger(ledger)) >= 4, "the first worker to start 4 jobs")
    stalled.signal(signal.SIGSTOP)
    held = [s for s in read_ledger(ledger) if s.worker == "stalled"]
    other = spawn(chaos_dsn, "other", "--concurrency", "4")
    until(lambda: {s.id for s in read_ledger(ledger) if s.worker == "other"} >= {s.id for s in held},
          "the other worker to run the stalled worker's jobs")
    stalled.signal(signal.SIGCONT)
    until(lambda: live_jobs(chaos_dsn) == 0, "the queue to drain", deadline=120)
    assert stalled.stop() == 0 and other.stop() == 0
    figures = check(ledger, ids, chaos_dsn)
    summary = worker_summary(stalled)
    lost = int(re.search(r"(\d+) lost", summary).group(1))  # type: ignore[union-attr]
    # Every job it held ran elsewhere under a later claim; its outcome for them cannot settle.
    assert lost >= 1, f"the stalled worker's late acks were not refused: {summary}"
    reruns = [s for s in read_ledger(ledger) if s.worker == "other" and s.id in {h.id for h in held}]
    lease_end = max(s.expires for s in held)
    figures.update(stalled_summary=summary, refused=lost,
                   recovery_s=round(min(s.start for s in reruns) - lease_end, 3))  # lease end -> rerun
    report.update(figures)


#: Workers killed, one after another, in test_repeated_kills.
ROUNDS = 8


@pytest.mark.slow
def test_repeated_kills(chaos_dsn, ledger, spawn, report):
    # A killed worker's claimed jobs, started or still in its buffer, spent
    # an attempt each: a job one worker after another claimed and lost may
    # spend one per kill. With more attempts than kills, none may die; a job
    # that did would have spent an attempt without a kill.
    ids = enqueue(chaos_dsn, 400, seconds=0.03, visibility=2, max_attempts=ROUNDS + 1)
    workers = [spawn(chaos_dsn, f"w{i}", "--concurrency", "4") for i in range(3)]
    kills, recoveries = 0, []
    for round_ in range(ROUNDS):
        done_before = len(read_ledger(ledger))
        until(lambda done_before=done_before: len(read_ledger(ledger)) >= done_before + 15, "progress between kills")
        victim = workers[round_ % 3]
        victim.kill()
        kills += 1
        killed_at = time.time()
        workers[round_ % 3] = spawn(chaos_dsn, f"w{round_ % 3}-{round_}", "--concurrency", "4")
        until(lambda killed_at=killed_at: first_start_after(ledger, killed_at) is not None,
              "work to go on after a kill")
        recoveries.append(first_start_after(ledger, killed_at))
        if live_jobs(chaos_dsn) == 0:
            break
    until(lambda: live_jobs(chaos_dsn) == 0, "the queue to drain", deadline=120)
    figures = check(ledger, ids, chaos_dsn)
    figures.update(kills=kills, recovery_s_max=max(recoveries), recovery_s=recoveries)
    report.update(figures)
