"""The concurrency primitives the worker (and the lock's renewal, the
listener, the settlement batcher) is written against, twice: an asyncio form
(``Async*``) and a threaded form with the same names minus ``Async``.

pyalk/_async/worker/ uses only these (plus plain ``await``), so
tools/unasync.py turns it into pyalk/_sync/worker/ by its ordinary rules:
``AsyncEvent`` becomes :class:`Event`, ``AsyncRuntime.spawn`` becomes
:meth:`Runtime.spawn`, and so on. Every difference between the two workers
lives here, side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import os
import queue
import select
import signal
import socket
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from psycopg import AsyncConnection, Connection, Notify

SIGNALS = (signal.SIGINT, signal.SIGTERM)

T = TypeVar("T")

#: Calls :meth:`AsyncRuntime.within` gave up on, kept referenced while they unwind.
_given_up: set[asyncio.Task[Any]] = set()


# events ----------------------------------------------------------------------


class AsyncEvent:
    """An asyncio event whose :meth:`set` may be called from any thread."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def _bind(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.get_ident()

    def set(self) -> None:
        if self._loop is not None and threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self._event.set)
        else:
            # Not yet waited on (no waiter to wake), or on the loop's thread.
            self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until set or ``timeout`` seconds; whether it is set."""
        self._bind()
        if self._event.is_set():
            return True
        if timeout is not None and timeout <= 0:
            return False
        try:
            # Not wait_for: on 3.11 it wraps the wait in a task of its own,
            # a loop iteration more between set() and the waiter (a wake-up's
            # latency pays it twice: listener to claim loop, claim loop to runner).
            async with asyncio.timeout(timeout):
                await self._event.wait()
        except TimeoutError:
            return False
        return True


class Event(threading.Event):
    """The threaded form: :meth:`threading.Event.wait` already takes a timeout
    and returns whether the event is set. :meth:`fileno` adds a socket that
    is readable while the event is set, so a wait on another socket (the
    listener's) can end when it is set: a thread cannot be cancelled. A
    socket pair rather than a pipe: ``select`` takes only sockets on Windows."""

    def __init__(self) -> None:
        super().__init__()
        self._pair: tuple[socket.socket, socket.socket] | None = None
        self._pair_pid = 0  # the process that opened the pair: a forked child opens its own
        self._pair_lock = threading.Lock()  # the pair holds a byte exactly while the event is set

    def fileno(self) -> int:
        """A descriptor that is readable while the event is set (opened on
        first use, closed with the event)."""
        with self._pair_lock:
            if self._pair is None or self._pair_pid != os.getpid():
                reader, writer = socket.socketpair()
                reader.setblocking(False)
                writer.setblocking(False)
                self._pair, self._pair_pid = (reader, writer), os.getpid()
                # Not at interpreter exit: a stop sent from an exit handler must still find it open.
                weakref.finalize(self, _close_pair, reader, writer).atexit = False
                if self.is_set():
                    writer.send(b"x")
            return self._pair[0].fileno()

    def set(self) -> None:
        with self._pair_lock:
            was_set = self.is_set()
            super().set()  # first: whatever happens to the pair, the flag is set
            pair = self._own_pair()
            if not was_set and pair is not None:
                with contextlib.suppress(OSError):
                    pair[1].send(b"x")

    def clear(self) -> None:
        with self._pair_lock:
            pair = self._own_pair()
            if self.is_set() and pair is not None:
                with contextlib.suppress(OSError):
                    pair[0].recv(1)
            super().clear()

    def _own_pair(self) -> tuple[socket.socket, socket.socket] | None:
        """The pair, if this process opened it (a forked child's copy is its parent's)."""
        return self._pair if self._pair_pid == os.getpid() else None


def _close_pair(reader: socket.socket, writer: socket.socket) -> None:
    reader.close()
    writer.close()


def _wait_readable(fds: list[int], timeout: float) -> None:
    """Until one of ``fds`` is readable, ``timeout`` seconds at most. poll()
    where there is one: select() refuses descriptors past FD_SETSIZE (1024),
    which a busy process's sockets reach."""
    if hasattr(select, "poll"):
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(math.ceil(timeout * 1000))
    else:
        select.select(fds, [], [], timeout)


# background tasks ----------------------------------------------------------


class AsyncTask:
    """A background loop running as an asyncio task."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task

    def cancel(self) -> None:
        self._task.cancel()

    def done(self) -> bool:
        return self._task.done()

    async def join(self, timeout: float | None = None) -> bool:
        """Wait for the task to end (``timeout`` seconds at most); whether it
        has. Its exception, if any, is left to :meth:`result`."""
        if not self._task.done():
            await asyncio.wait({self._task}, timeout=timeout)
        return self._task.done()

    def exception(self) -> BaseException | None:
        if not self._task.done() or self._task.cancelled():
            return None
        return self._task.exception()


class Task:
    """A background loop running in a daemon thread. A thread cannot be
    cancelled: :meth:`cancel` is a no-op and loops watch their stop event."""

    def __init__(self, thread: threading.Thread) -> None:
        self._thread = thread
        self._error: BaseException | None = None

    def cancel(self) -> None:
        pass

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def exception(self) -> BaseException | None:
        return self._error


class AsyncRuntime:
    """How the async worker starts loops, checks handlers and traps signals."""

    #: What a handler's cancelled task raises in it (a cancelled job, issue 26).
    CANCELLED: type[BaseException] = asyncio.CancelledError

    @staticmethod
    def current() -> asyncio.Task[Any] | None:
        """The task running the caller: what :meth:`interrupt` cancels."""
        return asyncio.current_task()

    @staticmethod
    def interrupt(task: asyncio.Task[Any] | None) -> None:
        """Cancel ``task`` (a runner inside its handler): CANCELLED is raised where the handler waits."""
        if task is not None:
            task.cancel()

    @staticmethod
    def resume(task: asyncio.Task[Any] | None) -> None:
        """The interrupted runner goes on: withdraw the cancel request it took."""
        if task is not None:
            task.uncancel()

    @staticmethod
    def spawn(fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any, name: str) -> AsyncTask:
        return AsyncTask(asyncio.get_running_loop().create_task(fn(*args), name=name))

    @staticmethod
    async def sleep(seconds: float) -> None:
        await asyncio.sleep(seconds)

    @staticmethod
    async def yield_now() -> None:
        """Let the other tasks of the loop run (a task is never preempted)."""
        await asyncio.sleep(0)

    @staticmethod
    async def notifies(conn: AsyncConnection, stop: AsyncEvent, timeout: float) -> AsyncIterator[Notify]:
        """The notifications ``conn`` receives within ``timeout`` seconds (a
        stop cancels the task that waits)."""
        async for notify in conn.notifies(timeout=timeout):
            yield notify

    @staticmethod
    async def within(seconds: float, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """``await fn(*args)``, for ``seconds`` at most (none: not even
        started); past them :class:`TimeoutError`, and the call is cancelled
        and left to unwind on its own (a statement in flight is cancelled in
        the server first, which can take longer than the caller has)."""
        if seconds <= 0:
            raise TimeoutError(f"no time left for {getattr(fn, '__name__', fn)}")
        task = asyncio.get_running_loop().create_task(fn(*args))
        try:
            done, _ = await asyncio.wait({task}, timeout=seconds)
        except BaseException:
            task.cancel()
            raise
        if not done:
            task.cancel()
            _given_up.add(task)
            task.add_done_callback(_given_up.discard)
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} took more than {seconds:.2f}s")
        return task.result()

    @staticmethod
    def check_handler(handler: Callable[..., Any]) -> None:
        call = getattr(handler, "__call__", None)  # noqa: B004 - an async __call__ counts
        if not (inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)):
            raise TypeError(
                f"AsyncWorker needs an async handler (async def), got {handler!r}; "
                "use pyalk.Worker for a blocking function (it runs handlers in threads)"
            )


class _NeverRaised(BaseException):
    """A thread is never cancelled: Runtime.CANCELLED is nothing anyone raises."""


class Runtime:
    """How the threaded worker starts loops, checks handlers and traps signals."""

    #: A blocking handler is never interrupted; it polls ``job.cancelled``.
    CANCELLED: type[BaseException] = _NeverRaised

    @staticmethod
    def current() -> None:
        return None

    @staticmethod
    def interrupt(task: None) -> None:
        pass

    @staticmethod
    def resume(task: None) -> None:
        pass

    @staticmethod
    def spawn(fn: Callable[..., Any], *args: Any, name: str) -> Task:
        task: Task

        def run() -> None:
            try:
                fn(*args)
            except BaseException as error:  # kept for exception(), as a task keeps it
                task._error = error
                raise

        thread = threading.Thread(target=run, name=name, daemon=True)
        task = Task(thread)
        thread.start()
        return task

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)

    @staticmethod
    def within(seconds: float, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, for ``seconds`` at most (none: not even started);
        past them :class:`TimeoutError`. A thread cannot be stopped: the call
        runs on a daemon thread of its own, left to finish unseen (its result
        discarded) once the caller stops waiting."""
        if seconds <= 0:
            raise TimeoutError(f"no time left for {getattr(fn, '__name__', fn)}")
        outcome: list[Any] = []

        def call() -> None:
            try:
                outcome.append((True, fn(*args)))
            except BaseException as error:
                outcome.append((False, error))

        thread = threading.Thread(target=call, name="pyalk-worker-within", daemon=True)
        thread.start()
        # Infinite (no deadline yet) is no timeout: join() cannot take it.
        thread.join(None if math.isinf(seconds) else seconds)
        if not outcome:
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} took more than {seconds:.2f}s")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    @staticmethod
    def notifies(conn: Connection, stop: Event, timeout: float) -> Iterator[Notify]:
        """The notifications ``conn`` receives within ``timeout`` seconds, or
        until ``stop`` is set: the wait is on the connection's socket and the
        stop's together, so a stop ends it at once (psycopg's own wait would
        run out its timeout first)."""
        yield from conn.notifies(timeout=0)  # any kept from an earlier call, or already readable
        if stop.is_set():
            return
        _wait_readable([conn.fileno(), stop.fileno()], timeout)
        if not stop.is_set():
            yield from conn.notifies(timeout=0)

    @staticmethod
    def yield_now() -> None:
        """Offer the GIL to the worker's other threads. The interpreter
        would hand it over only after a switch interval (5 ms), and the claim
        loop and the settler take it several times per round trip: a claim
        sent at half a buffer arrived after the buffer ran dry. The runners
        call this every few jobs, not per job (a time.sleep(0) per job was
        30% of a runner's time)."""
        time.sleep(0)

    @staticmethod
    def check_handler(handler: Callable[..., Any]) -> None:
        call = getattr(handler, "__call__", None)  # noqa: B004
        if not callable(handler):
            raise TypeError(f"Worker needs a callable handler, got {handler!r}")
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call):
            raise TypeError(
                f"Worker runs handlers in threads and needs a plain function, got the coroutine function "
                f"{handler!r}; use pyalk.AsyncWorker for async def handlers"
            )


# the handler pool ----------------------------------------------------------


class AsyncPool:
    """Runs handler calls as asyncio tasks (the worker bounds how many)."""

    def __init__(self, size: int, name: str) -> None:
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def submit(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        task = asyncio.get_running_loop().create_task(fn(*args), name=self._name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel_all(self) -> None:
        """Cancel the handlers still running (the grace period is over)."""
        for task in self._tasks:
            task.cancel()

    async def close(self, timeout: float) -> None:
        """Wait (``timeout`` seconds at most) for cancelled handlers to unwind."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)


class Pool:
    """Runs handler calls on ``size`` daemon threads, started on demand.

    A thread cannot be cancelled: after the grace period a handler still
    running keeps its thread until it returns (the worker discards its
    outcome), and being a daemon it never holds up interpreter exit.
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if self._idle == 0 and len(self._threads) < self._size:
                thread = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1
        self._work.put((fn, args))

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            finally:
                with self._lock:
                    self._idle += 1

    def cancel_all(self) -> None:
        pass

    def close(self, timeout: float) -> None:
        """Let idle threads exit; threads still in a handler exit after it."""
        for _ in self._threads:
            self._work.put(None)


# signals -------------------------------------------------------------------


class AsyncSignals:
    """SIGINT/SIGTERM delivered to a callback on the event loop (main thread only)."""

    def __init__(self) -> None:
        self._installed: list[tuple[signal.Signals, Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self, callback: Callable[[int], None]) -> bool:
        """Route the signals to ``callback``; False where that is impossible
        (not the main thread, or a platform without loop signal handlers)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            previous = signal.getsignal(sig)
            try:
                self._loop.add_signal_handler(sig, callback, int(sig))
            except (NotImplementedError, RuntimeError, ValueError):
                self.restore()
                return False
            self._installed.append((sig, previous))
        return True

    def restore(self) -> None:
        for sig, previous in reversed(self._installed):
            if self._loop is not None:
                self._loop.remove_signal_handler(sig)
            if previous is not None:
                signal.signal(sig, previous)
        self._installed.clear()


class Signals:
    """SIGINT/SIGTERM delivered to a callback (main thread only).

    The Python-level handler only puts the signal number on a SimpleQueue
    (whose put is reentrant, so safe in a handler that interrupted any code);
    a helper thread calls the callback, which may then take locks freely.
    """

    def __init__(self) -> None:
        self._installed: list[tuple[signal.Signals, Any]] = []
        self._delivered: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def install(self, callback: Callable[[int], None]) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False

        def deliver() -> None:
            while (number := self._delivered.get()) is not None:
                callback(number)

        self._thread = threading.Thread(target=deliver, name="pyalk-worker-signals", daemon=True)
        self._thread.start()
        for sig in SIGNALS:
            previous = signal.signal(sig, lambda number, _frame: self._delivered.put(number))
            self._installed.append((sig, previous))
        return True

    def restore(self) -> None:
        for sig, previous in reversed(self._installed):
            if previous is not None:
                signal.signal(sig, previous)
        self._installed.clear()
        if self._thread is not None:
            self._delivered.put(None)
            self._thread = None
