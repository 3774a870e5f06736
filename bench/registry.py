"""The benchmark's shared types: modes, the context a row runs with, a row
and its result. Nothing here knows which rows exist.

A row is a function that takes a :class:`Context` and returns a
:class:`RowResult`; :func:`row` wraps it in a :class:`Row` with its key,
group and description. A row whose mechanism does not exist yet (streams,
the Python worker) carries a ``requires`` check that names what is missing,
so it shows up in the report as "pending" and runs as soon as the check
passes. The rows themselves live in the ``bench/rows_*.py`` modules, each
listing its rows in ``ROWS``; ``bench/rows.py`` collects them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from bench.server import Server

Status = Literal["ok", "pending", "error", "skipped"]


@dataclass(frozen=True)
class Mode:
    """How long each row runs. ``quick`` is for the smoke test (seconds);
    ``full`` is the real run (a few minutes on 2 cores)."""

    name: str
    clients: tuple[int, ...]
    enqueue_seconds: float  # pgbench -T for the enqueue rows
    claim1_jobs: int  # jobs drained per client count by claim 1 + ack (pgbench -t)
    claim100_jobs: int  # jobs drained per client count by claim 100 + ack_batch
    repeats: int  # measurements per (row, clients); the median is reported
    backlog_sizes: tuple[int, ...]
    latency_samples: int  # claim + ack round trips timed per backlog size
    stale_backlog: int
    xmin_seconds: float
    e2e_jobs: int
    e2e_concurrency: tuple[int, ...]
    e2e_repeats: int  # rounds of the end-to-end row (systems take turns; medians)
    #: The memory row: a worker's RSS after the first and after the last of these many jobs.
    memory_jobs: tuple[int, int]
    stream_events: int
    wake_samples: int  # fresh wake-ups timed per listener (wake and stream tail latency)
    replay_events: int  # events in the stream the replay reads end to end

    @property
    def quick(self) -> bool:
        return self.name == "quick"


QUICK = Mode(
    name="quick",
    clients=(1, 2),
    enqueue_seconds=1.0,
    claim1_jobs=400,
    claim100_jobs=4000,
    repeats=1,
    backlog_sizes=(1_000, 10_000),
    latency_samples=50,
    stale_backlog=5_000,
    xmin_seconds=2.0,
    e2e_jobs=200,
    e2e_concurrency=(1, 10),
    e2e_repeats=1,
    memory_jobs=(2_000, 20_000),
    stream_events=2_000,
    wake_samples=30,
    replay_events=5_000,
)

FULL = Mode(
    name="full",
    clients=(1, 2, 4),
    enqueue_seconds=3.0,
    claim1_jobs=6_000,
    claim100_jobs=120_000,
    repeats=2,
    backlog_sizes=(1_000, 10_000, 100_000, 1_000_000),
    latency_samples=200,
    stale_backlog=100_000,
    xmin_seconds=60.0,
    e2e_jobs=20_000,
    e2e_concurrency=(1, 10),
    e2e_repeats=5,
    memory_jobs=(10_000, 1_000_000),
    stream_events=50_000,
    wake_samples=300,
    replay_events=100_000,
)

MODES = {"quick": QUICK, "full": FULL}


class Progress:
    """What a row reports while it runs. The CLI passes a rich-backed one;
    tests and library callers get this silent default."""

    def start(self, description: str, total: float | None = None) -> None:  # pragma: no cover - trivial
        pass

    def advance(self, amount: float = 1.0) -> None:  # pragma: no cover - trivial
        pass

    def note(self, message: str) -> None:  # pragma: no cover - trivial
        pass


@dataclass
class Context:
    server: Server
    mode: Mode
    progress: Progress = field(default_factory=Progress)
    #: Extra libpq options for the measured sessions (PGOPTIONS syntax).
    session_options: str = "-c synchronous_commit=off"
    #: Where peer runners find their tools (node_modules of graphile-worker).
    peers_dir: str | None = None
    #: The Python that runs peer runners (it must have procrastinate and pgqueuer).
    peers_python: str | None = None


@dataclass
class RowResult:
    key: str
    title: str
    status: Status
    #: What the row measures, in one or two sentences (goes into the report).
    about: str = ""
    columns: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Anything else worth keeping in the JSON (plans, raw pgbench output).
    extra: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


RowFn = Callable[[Context], RowResult]


@dataclass(frozen=True)
class Row:
    key: str
    group: str
    title: str
    about: str
    fn: RowFn
    #: Returns None when the row can run, else why not (shown as "pending").
    requires: Callable[[Context], str | None] | None = None
    #: Rows that run in --quick mode (the smoke test runs these).
    in_quick: bool = True

    def missing(self, ctx: Context) -> str | None:
        return self.requires(ctx) if self.requires else None


GROUPS = {
    "sql": "1. SQL level (pgbench): ours vs the bare-SQL floor",
    "e2e": "2. End to end in Python: pyalk's worker vs peers",
    "latency": "3. Latency and scale",
    "hostile": "4. Hostile conditions",
    "scale": "5. Scale out (PL/Proxy router)",
    "dashboard": "6. Dashboard (issue 15)",
}


def row(
    key: str,
    group: str,
    title: str,
    about: str,
    *,
    requires: Callable[[Context], str | None] | None = None,
    in_quick: bool = True,
) -> Callable[[RowFn], Row]:
    """Decorate a row function: it becomes the :class:`Row` that describes it."""
    if group not in GROUPS:
        raise ValueError(f"unknown group {group!r}")

    def describe(fn: RowFn) -> Row:
        return Row(key, group, title, about, fn, requires, in_quick)

    return describe
