"""The threaded runtime's waits a stop must end (pyalk/runtime.py): a thread
cannot be cancelled, so the listener waits on its socket and on the stop's
together, and a stop ends that wait at once rather than at the end of
its slice (a threaded worker's run() returned up to a slice late)."""

from __future__ import annotations

import os
import resource
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import Notify

from pyalk.runtime import Event, Runtime, _wait_readable
from tests.helpers import until

#: Longer than any test here may take: a wait that runs it out has failed.
LONG = 60.0


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_an_events_descriptor_is_readable_exactly_while_it_is_set():
    event = Event()
    fd = event.fileno()
    assert not readable(fd)
    event.set()
    event.set()  # one byte, not two: one clear() empties it
    assert readable(fd)
    event.clear()
    assert not readable(fd)
    event.clear()
    assert not readable(fd)
    event.set()
    assert readable(fd) and event.wait(0)


def test_an_event_set_before_its_descriptor_is_asked_for_is_readable():
    event = Event()
    event.set()
    assert readable(event.fileno())
    assert event.fileno() == event.fileno()


def in_wait(thread: threading.Thread) -> Callable[[], bool]:
    """Whether ``thread`` is blocked in Runtime.notifies' wait on its sockets."""

    def check() -> bool:
        frame = sys._current_frames().get(thread.ident or -1)
        while frame is not None:
            if frame.f_code is _wait_readable.__code__:
                return True
            frame = frame.f_back
        return False

    return check


def waiting(conn: psycopg.Connection, stop: Event) -> tuple[threading.Thread, list[Notify], list[float]]:
    """A thread in one Runtime.notifies call of LONG seconds, once it is
    blocked on its sockets; what it got, and how long the call took."""
    got: list[Notify] = []
    took: list[float] = []

    def run() -> None:
        start = time.monotonic()
        notifies: Iterator[Notify] = Runtime.notifies(conn, stop, LONG)
        got.extend(notifies)
        took.append(time.monotonic() - start)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    until(in_wait(thread), "the wait to block on its sockets")
    return thread, got, took


def test_a_stop_ends_a_wait_for_notifications_at_once(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN pyalk_wait")
        stop = Event()
        thread, got, took = waiting(conn, stop)
        stop.set()
        thread.join(LONG / 2)
        assert not thread.is_alive(), "the stop did not end the wait"
        assert got == [] and took[0] < LONG / 2


def test_a_wait_for_notifications_yields_one_sent_while_it_waits(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as sender:
        conn.execute("LISTEN pyalk_wait")
        thread, got, _took = waiting(conn, Event())
        sender.execute("NOTIFY pyalk_wait, 'hello'")
        thread.join(LONG / 2)
        assert not thread.is_alive(), "the notification did not end the wait"
        assert [(n.channel, n.payload) for n in got] == [("pyalk_wait", "hello")]


def test_a_wait_yields_a_notification_that_came_before_it_without_blocking(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as sender:
        conn.execute("LISTEN pyalk_wait")
        sender.execute("NOTIFY pyalk_wait, 'early'")
        conn.execute("SELECT 1")  # the notification arrives with this answer, kept by psycopg
        start = time.monotonic()
        notifies = Runtime.notifies(conn, Event(), LONG)
        assert next(notifies).payload == "early"
        assert time.monotonic() - start < LONG / 2, "it waited before yielding the notification in hand"
        notifies.close()


def test_a_stop_ends_a_wait_on_a_socket_past_select_s_limit(dsn):
    """select() refuses a descriptor past FD_SETSIZE (1024), which a busy
    process's sockets reach: the wait must not use it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the open file limit ({hard}) keeps descriptors below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if soft != resource.RLIM_INFINITY else soft, hard))
    fillers = []
    try:
        while not fillers or fillers[-1].fileno() < 1100:
            fillers.append(open(__file__, "rb"))  # noqa: SIM115 - held open on purpose, closed below
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.fileno() > 1024
            conn.execute("LISTEN pyalk_wait")
            stop = Event()
            assert stop.fileno() > 1024
            thread, got, took = waiting(conn, stop)
            stop.set()
            thread.join(LONG / 2)
            assert not thread.is_alive(), "the stop did not end the wait"
            assert got == [] and took[0] < LONG / 2
    finally:
        for filler in fillers:
            filler.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_stop_sent_from_an_exit_handler_still_sets_the_event():
    """An exit handler registered before the event opened its socket pair
    runs after the pair's finalizer would have at exit: the pair stays open
    until the event goes, so set() still works."""
    script = (
        "import atexit\n"
        "from pyalk.runtime import Event\n"
        "def at_exit():\n"
        "    event.set()\n"
        "    print('set', event.is_set(), readable(event.fileno()))\n"
        "atexit.register(at_exit)\n"
        "import select\n"
        "def readable(fd):\n"
        "    return bool(select.select([fd], [], [], 0)[0])\n"
        "event = Event()\n"
        "event.fileno()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=LONG, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "set True True", done.stderr


def test_a_forked_child_setting_the_event_leaves_the_parents_descriptor_alone():
    event = Event()
    fd = event.fileno()
    pid = os.fork()
    if pid == 0:  # the child: its own flag, and a pair of its own if it asks
        ok = False
        try:
            event.set()
            ok = event.is_set() and readable(event.fileno()) and event.fileno() != fd
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not event.is_set()
    assert not readable(fd), "the child's set() reached the parent's descriptor"
    event.set()
    assert readable(fd)
