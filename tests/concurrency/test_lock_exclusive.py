"""Lease locks under real concurrency: threads, one connection each, one
PostgreSQL. Exactly one contender wins a free (or just expired) lock, and
at no instant do two threads believe they hold it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psycopg

from pyalk import Alk, Lock
from tests.conftest import pin_clock

NOW = 1_700_000_000
CONTENDERS = 16


def _race(contenders: list[tuple[Alk, str]], name: str, ttl: int) -> list[Lock | None]:
    """Every (client, owner) calls try_lock at once (lined up on a barrier)."""
    barrier = threading.Barrier(len(contenders))

    def contend(contender: tuple[Alk, str]) -> Lock | None:
        client, owner = contender
        barrier.wait()
        return client.try_lock(name, owner, ttl)

    with ThreadPoolExecutor(len(contenders)) as pool:
        return list(pool.map(contend, contenders))


def test_exactly_one_of_16_simultaneous_contenders_wins(connect: Callable[..., psycopg.Connection]) -> None:
    conns = [connect() for _ in range(CONTENDERS)]
    contenders = [(Alk(conn), f"owner-{index}") for index, conn in enumerate(conns)]
    for conn in conns:
        pin_clock(conn, NOW)

    # A free lock.
    results = _race(contenders, "report", 60)
    winners = [lock for lock in results if lock is not None]
    assert len(winners) == 1
    holder = winners[0]
    check = conns[0].execute("SELECT owner, expires_at FROM alk.get_lock('report')").fetchone()
    assert check == (holder.owner, NOW + 60)

    # Still held one second before expiry: nobody else wins (the holder's own
    # re-acquire is a renew, so leave it out of this round).
    for conn in conns:
        pin_clock(conn, NOW + 59)
    others = [contender for contender, lock in zip(contenders, results, strict=True) if lock is None]
    assert len(others) == CONTENDERS - 1
    assert all(lock is None for lock in _race(others, "report", 60))

    # At the exact expiry second the lock is up for grabs again: one steals it.
    for conn in conns:
        pin_clock(conn, NOW + 60)
    stolen = [lock for lock in _race(others, "report", 60) if lock is not None]
    assert len(stolen) == 1
    assert stolen[0].owner != holder.owner
    assert holder.renew(60) is False
    assert holder.release() is False
    assert stolen[0].release() is True


def test_exactly_one_holder_at_any_instant(connect: Callable[..., psycopg.Connection]) -> None:
    """Threads on the real clock take, hold briefly and release one lock in a
    loop; a shared counter of believed holders must never exceed one."""
    clients = [Alk(connect()) for _ in range(8)]
    inside = 0
    most_inside = 0
    acquisitions = 0
    guard = threading.Lock()
    deadline = time.monotonic() + 3.0

    def work(index: int) -> None:
        nonlocal inside, most_inside, acquisitions
        client = clients[index]
        while time.monotonic() < deadline:
            lock = client.try_lock("critical", f"worker-{index}", 60)
            if lock is None:
                continue
            with lock:
                with guard:
                    inside += 1
                    most_inside = max(most_inside, inside)
                    acquisitions += 1
                time.sleep(0.001)
                with guard:
                    inside -= 1

    with ThreadPoolExecutor(len(clients)) as pool:
        list(pool.map(work, range(len(clients))))
    assert most_inside == 1
    assert acquisitions >= 20, acquisitions  # the test exercised real hand-overs
