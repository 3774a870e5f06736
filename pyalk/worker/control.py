"""A worker's part in the registry of workers, written once for both forms
(nothing here waits): how often it beats, how long its exit may spend
deregistering, the version string it registers, and the grammar of the
payloads on its control channel (sql/workers.sql, docs/contract.md#workers).
"""

from __future__ import annotations

from importlib import metadata

#: Seconds between a worker's beats (alk.worker_beat): well inside the
#: registry's 30 s silence bound, after which a worker shows as gone. A
#: worker without LISTEN (listen=False) learns of alk.request_stop at its
#: next beat, so within this.
BEAT_INTERVAL = 5.0

#: Seconds a stopping worker spends at most on alk.worker_deregister: a
#: server that does not answer in time leaves the row to show as gone and be
#: pruned, rather than hold up the exit.
DEREGISTER_WITHIN = 0.5

#: The verb of alk.request_stop's payload: drain and exit, as on SIGTERM.
STOP = "stop"
#: The verb of alk.cancel's payload (``cancel <job_id>``): a job this worker
#: holds was cancelled; tell its handler, or drop it from the buffer.
CANCEL = "cancel"


def client_version() -> str:
    """What the registry's ``version`` says of this worker: ``pyalk <version>``."""
    try:
        return f"pyalk {metadata.version('pyalk')}"
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "pyalk"


def verb(payload: str) -> str:
    """The verb of a control payload (``verb [argument]``, one space
    between): a worker acts on the verbs it knows and ignores the others."""
    return payload.partition(" ")[0]


def job_id(payload: str) -> int | None:
    """The job id argument of a ``cancel <job_id>`` payload; None when it is
    not a whole number (a payload the worker cannot read is ignored)."""
    argument = payload.partition(" ")[2]
    try:
        return int(argument)
    except ValueError:
        return None
