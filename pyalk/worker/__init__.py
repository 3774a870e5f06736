"""The parts of the worker written once, for the async and the threaded
form alike (nothing here waits): its lifecycle (:mod:`.state`), prefetch
buffer (:mod:`.buffer`), running jobs (:mod:`.in_flight`), counts and log
fields (:mod:`.tally`), errors (:mod:`.errors`) and observer protocol
(:mod:`.observer`). The workers themselves, which wait on the database, are
pyalk/_async/worker/ and its generated twin pyalk/_sync/worker/.
"""

from pyalk.worker.errors import PermanentError, Snooze
from pyalk.worker.observer import WorkerObserver
from pyalk.worker.state import WorkerState
from pyalk.worker.tally import WorkerCounts

__all__ = ["PermanentError", "Snooze", "WorkerCounts", "WorkerObserver", "WorkerState"]
