"""The worker lifecycle table (pyalk/worker/state.py): every transition it
allows is accepted, every other raises, and a stop while NEW waits for run()."""

from __future__ import annotations

import itertools
import math
import threading

import pytest

from pyalk.worker.deadline import STOP_MARGIN, StopDeadline
from pyalk.worker.state import TRANSITIONS, IllegalTransition, Lifecycle, WorkerState
from tests.helpers import until

S = WorkerState


def recorder() -> tuple[Lifecycle, list[tuple[S, S]]]:
    seen: list[tuple[S, S]] = []
    return Lifecycle(lambda old, new: seen.append((old, new))), seen


def at(state: S) -> Lifecycle:
    """A lifecycle brought to ``state`` along the table."""
    path = {
        S.NEW: [], S.STARTING: [S.STARTING], S.RUNNING: [S.STARTING, S.RUNNING],
        S.DRAINING: [S.STARTING, S.RUNNING, S.DRAINING], S.FORCED: [S.STARTING, S.RUNNING, S.FORCED],
        S.FLUSHING: [S.STARTING, S.RUNNING, S.DRAINING, S.FLUSHING],
        S.STOPPED: [S.STARTING, S.RUNNING, S.DRAINING, S.FLUSHING, S.STOPPED],
    }[state]
    life, _ = recorder()
    for step in path:
        life.advance(step)
    assert life.state is state
    return life


@pytest.mark.parametrize(("old", "new"), list(itertools.product(S, S)))
def test_only_the_tables_transitions_are_allowed(old, new):
    life = at(old)
    if new in TRANSITIONS[old]:
        life.advance(new)
        assert life.state is new
    else:
        with pytest.raises(IllegalTransition, match=f"from {old.value} to {new.value}"):
            life.advance(new)
        assert life.state is old


def test_every_state_but_stopped_leads_to_stopped():
    for state in S:
        reachable, frontier = {state}, [state]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()] - reachable:
                reachable.add(nxt)
                frontier.append(nxt)
        assert S.STOPPED in reachable
    assert TRANSITIONS[S.STOPPED] == frozenset()


def test_a_stop_while_new_is_applied_on_starting():
    life, seen = recorder()
    life.request_stop(force=False)
    life.request_stop(force=True)  # the stronger request wins
    life.request_stop(force=False)
    assert life.state is S.NEW and life.stopping() and seen == []
    life.advance(S.STARTING)
    assert seen == [(S.NEW, S.STARTING), (S.STARTING, S.FORCED)]
    assert life.begin_running() is False


def test_stop_requests_past_their_state_are_ignored():
    life, seen = recorder()
    life.advance(S.STARTING)
    assert life.begin_running() is True
    life.request_stop(force=False)
    life.request_stop(force=False)
    life.request_stop(force=True)
    life.request_stop(force=True)
    assert [new for _, new in seen] == [S.STARTING, S.RUNNING, S.DRAINING, S.FORCED]


def test_a_stop_begins_the_deadline_before_any_thread_sees_the_worker_stopping():
    # The transition hook runs after the state is set, from the thread that
    # stopped: a hook that began the deadline left a window in which another
    # thread saw DRAINING and an infinite deadline (the threaded shutdown
    # then called Thread.join(inf), which raises OverflowError).
    deadline = StopDeadline(grace_period=30.0)
    hook_may_end = threading.Event()
    life = Lifecycle(lambda old, new: hook_may_end.wait(10) if new is S.DRAINING else None, deadline=deadline)
    life.advance(S.STARTING)
    assert life.begin_running() and math.isinf(deadline.left())
    stopper = threading.Thread(target=life.request_stop, kwargs={"force": False})
    stopper.start()
    until(lambda: life.state is S.DRAINING, "the stop's transition")  # its hook still waits
    assert deadline.grace_left() <= 30.0 and deadline.left() <= 30.0 + STOP_MARGIN
    hook_may_end.set()
    stopper.join()
