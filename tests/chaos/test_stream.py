"""Stream subscribers SIGKILLed under concurrent publishers: no event the
server acknowledged is skipped, every run reads in offset order from its
checkpoint, and the checkpoint never moves back. Recovery is the time from a
kill to the restarted subscriber's first event."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from pyalk import Alk
from tests.chaos.harness import ROOT, jsonl_records
from tests.chaos.servers import until

PUBLISHERS = 4
EVENTS = 150  # per publisher, at least: they publish until the kills are over
EVENTS_MAX = 3000  # per publisher: a bound on the run


def spawn_subscriber(dsn: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tests.chaos.subscriber", dsn, str(log)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL)


def test_stream_subscribers_killed_under_concurrent_publishers(chaos_dsn, tmp_path, report):
    log = tmp_path / "subscriber.jsonl"
    published: list[int] = []
    guard = threading.Lock()
    stop = threading.Event()
    kills_over = threading.Event()
    checkpoints: list[int] = []

    def publish(which: int) -> None:
        with Alk(chaos_dsn) as alk:
            stream = alk.stream("s")
            for i in range(EVENTS_MAX):
                if i >= EVENTS and kills_over.is_set():
                    break
                offset = stream.publish({"p": which, "i": i}, key=f"k{which}")
                with guard:
                    published.append(offset)  # acknowledged by the server
                time.sleep(0.01)  # pacing, so the run spans the kills

    def watch_checkpoint() -> None:
        with psycopg.connect(chaos_dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute("SELECT alk.get_offset('s', 'c')").fetchone()
                checkpoints.append(int(row[0]) if row and row[0] is not None else 0)
                time.sleep(0.02)  # a sampling interval

    watcher = threading.Thread(target=watch_checkpoint, daemon=True)
    watcher.start()
    publishers = [threading.Thread(target=publish, args=(p,)) for p in range(PUBLISHERS)]
    subscriber = spawn_subscriber(chaos_dsn, log)
    for thread in publishers:
        thread.start()
    recoveries = []
    kills = 0
    try:
        for _ in range(6):
            seen = sum("offset" in line for line in jsonl_records(log))
            until(lambda seen=seen: sum("offset" in line for line in jsonl_records(log)) >= seen + 40,
                  "the subscriber to read")
            subscriber.kill()
            subscriber.wait()
            kills += 1
            killed_at = time.time()
            subscriber = spawn_subscriber(chaos_dsn, log)
            pid = subscriber.pid
            until(lambda pid=pid: any(line.get("run") == pid and "offset" in line for line in jsonl_records(log)),
                  "the restarted subscriber's first event")
            recoveries.append(round(min(line["at"] for line in jsonl_records(log)
                                        if line.get("run") == pid and "offset" in line) - killed_at, 3))
        kills_over.set()
        for thread in publishers:
            thread.join(120)
        final = max(published)
        until(lambda: any(line.get("offset") == final for line in jsonl_records(log)),
              "the subscriber to read the last event")
    finally:
        subscriber.kill()
        subscriber.wait()
        stop.set()
        watcher.join(10)

    everything = sorted(published)
    runs: dict[float, list[dict[str, Any]]] = {}
    for line in jsonl_records(log, settled=True):
        runs.setdefault(line["run"], []).append(line)
    seen_offsets: set[int] = set()
    for run in runs.values():
        checkpoint = int(run[0]["checkpoint"])
        offsets = [int(line["offset"]) for line in run[1:]]
        seen_offsets.update(offsets)
        # This run read exactly the acknowledged events after its checkpoint, in order, none skipped.
        expected = [o for o in everything if o > checkpoint][: len(offsets)]
        assert offsets == expected, f"run from checkpoint {checkpoint} skipped or reordered events"
    assert set(everything) <= seen_offsets, f"events never read: {sorted(set(everything) - seen_offsets)[:20]}"
    regressions = [(a, b) for a, b in itertools.pairwise(checkpoints) if b < a]
    assert not regressions, f"the checkpoint moved back: {regressions[:5]}"
    report.update(published=len(everything), publishers=PUBLISHERS, kills=kills,
                  events_read=sum(len(run) - 1 for run in runs.values()),
                  reread_after_kills=sum(len(run) - 1 for run in runs.values()) - len(everything),
                  skipped=0, checkpoint_regressions=0, checkpoint_samples=len(checkpoints),
                  recovery_s_max=max(recoveries), recovery_s=recoveries)
