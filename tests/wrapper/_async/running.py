"""Running a worker beside other work in a test: the work runs in a thread,
and the worker stops when it ends."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pyalk import AsyncWorker


def in_thread(fn: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


async def run_beside(worker: AsyncWorker, produce: Callable[[], None]) -> None:
    """Run the worker while ``produce`` runs in a thread; stop it when
    ``produce`` ends, and raise what ``produce`` raised."""
    failures: list[BaseException] = []

    def guarded() -> None:
        try:
            produce()
        except BaseException as error:
            failures.append(error)
        finally:
            worker.stop()

    thread = in_thread(guarded)
    await worker.run()
    thread.join()
    assert not failures, failures
