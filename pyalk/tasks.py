"""Tasks: named functions behind a queue (docs/tasks.md).

    tasks = pyalk.Tasks(queue="emails")

    @tasks.task(max_attempts=5)
    def send_email(to: str, subject: str = "hello") -> None: ...

    job = send_email.defer(alk, to="ada@example.com")  # enqueue; job.id, job.wait() for its result
    pyalk worker myapp.tasks:tasks --queue emails     # runs every task of the queue

A task's job is an ordinary job whose payload is ``{"task": <name>, "args":
{<keyword arguments>}}``, so any producer (psql, Node) can enqueue one. The
worker side looks the name up among the tasks of its queue and converts the
arguments to the function's annotations; an unknown name or arguments that
do not fit fail the job for good (:class:`PermanentError`), since a retry
cannot fix them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from pyalk.errors import InvalidArgument
from pyalk.worker.errors import PermanentError

if TYPE_CHECKING:
    from pyalk._async.client import AsyncAlk
    from pyalk._async.outcome import AsyncDeferredJob
    from pyalk._sync.client import Alk
    from pyalk._sync.outcome import DeferredJob

P = ParamSpec("P")
R = TypeVar("R")

#: The job options a task may default and a caller may override.
OPTIONS = ("delay", "run_at", "priority", "max_attempts", "expires")


class TaskError(PermanentError):
    """A task's job cannot run: unknown task name, or a payload that does
    not fit the function. Fails the job for good (it is a PermanentError)."""


class Task(Generic[P, R]):
    """One registered function: call it directly, or :meth:`defer` it as a job."""

    def __init__(self, fn: Callable[P, R], name: str, queue: str, options: Mapping[str, int | None]) -> None:
        self.fn = fn
        self.name = name
        self.queue = queue
        _check_options(options)
        #: The job options every defer uses (``alk.enqueue``'s: delay, run_at, ...).
        self.options: dict[str, Any] = {key: value for key, value in options.items() if value is not None}
        self._signature = inspect.signature(fn)
        self._hints = typing.get_type_hints(fn)
        self.is_async = inspect.iscoroutinefunction(fn)

    def __repr__(self) -> str:
        return f"<pyalk task {self.name!r} on queue {self.queue!r}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def configure(self, *, queue: str | None = None, **options: int | None) -> Task[P, R]:
        """A copy with other job options (``delay``, ``run_at``, ``priority``,
        ``max_attempts``, ``expires``) or another queue, for one call site."""
        _check_options(options)
        return Task(self.fn, self.name, queue or self.queue, {**self.options, **options})

    def payload(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """The job payload for these arguments (``{"task": ..., "args": {...}}``),
        checked against the function's signature; for ``enqueue_batch`` or an
        enqueue inside your own transaction (``conn=``)."""
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as error:
            raise InvalidArgument(f"task {self.name!r}: {error}") from None
        arguments: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            if self._signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(value)
            elif self._signature.parameters[name].kind is inspect.Parameter.VAR_POSITIONAL:
                raise InvalidArgument(f"task {self.name!r}: *{name} cannot travel in a payload; use keywords")
            else:
                arguments[name] = value
        return {"task": self.name, "args": _to_json(arguments)}

    def defer(self, alk: Alk, /, *args: P.args, **kwargs: P.kwargs) -> DeferredJob:
        """Enqueue a job that runs this task with these arguments; the job
        (``.id``, and ``.wait(timeout)`` for what the task returned, on a
        queue that keeps completed jobs)."""
        return alk.queue(self.queue).defer(self.payload(*args, **kwargs), **self.options)

    async def defer_async(self, alk: AsyncAlk, /, *args: P.args, **kwargs: P.kwargs) -> AsyncDeferredJob:
        """:meth:`defer` for an :class:`~pyalk.AsyncAlk`."""
        return await alk.queue(self.queue).defer(self.payload(*args, **kwargs), **self.options)

    def arguments(self, args: Any) -> dict[str, Any]:
        """The keyword arguments for a job's ``args``, converted to the
        annotations; :class:`TaskError` when they do not fit."""
        if not isinstance(args, dict):
            raise TaskError(f"task {self.name!r}: args must be a JSON object, got {_kind(args)}")
        parameters = self._signature.parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        converted: dict[str, Any] = {}
        for key, value in args.items():
            parameter = parameters.get(key)
            if parameter is None or parameter.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                       inspect.Parameter.VAR_POSITIONAL):
                if not takes_any:
                    raise TaskError(f"task {self.name!r}: unexpected argument {key!r}")
                converted[key] = value
                continue
            converted[key] = convert(value, self._hints.get(key, Any), f"task {self.name!r}: argument {key!r}")
        missing = [name for name, p in parameters.items() if p.default is inspect.Parameter.empty
                   and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                   and name not in converted]
        if missing:
            raise TaskError(f"task {self.name!r}: missing argument{'s' if len(missing) > 1 else ''} "
                            + ", ".join(repr(name) for name in missing))
        return converted


class Tasks:
    """A registry of tasks; pass it to ``pyalk worker module:registry``, or
    build a worker's handler with :meth:`handler`."""

    def __init__(self, *, queue: str = "tasks") -> None:
        self.queue = queue
        self._tasks: dict[tuple[str, str], Task[Any, Any]] = {}

    def task(self, fn: Callable[P, R] | None = None, *, name: str | None = None, queue: str | None = None,
             delay: int | None = None, run_at: int | None = None, priority: int | None = None,
             max_attempts: int | None = None, expires: int | None = None) -> Any:
        """``@tasks.task`` or ``@tasks.task(name=..., queue=..., max_attempts=...)``:
        register ``fn`` as a task (its name defaults to the function's)."""
        options = {"delay": delay, "run_at": run_at, "priority": priority, "max_attempts": max_attempts,
                   "expires": expires}

        def register(function: Callable[P, R]) -> Task[P, R]:
            task = Task(function, name or function.__name__, queue or self.queue, options)
            if not task.name:
                raise ValueError("a task needs a non-empty name")
            key = (task.queue, task.name)
            if key in self._tasks:
                raise ValueError(f"task {task.name!r} is already registered on queue {task.queue!r}")
            self._tasks[key] = task
            return task

        return register(fn) if fn is not None else register

    def queues(self) -> list[str]:
        """The queues that have tasks, sorted."""
        return sorted({queue for queue, _ in self._tasks})

    def on(self, queue: str) -> dict[str, Task[Any, Any]]:
        """The tasks of ``queue`` by name."""
        return {name: task for (q, name), task in self._tasks.items() if q == queue}

    def handler(self, queue: str) -> Callable[[Any], Any]:
        """A worker handler running every task of ``queue`` by the job's task
        name: async when any of them is (sync ones then run in a thread)."""
        tasks = self.on(queue)
        if not tasks:
            raise ValueError(f"no task runs on queue {queue!r} (tasks run on: {', '.join(self.queues()) or 'none'})")

        def find(job: Any) -> tuple[Task[Any, Any], dict[str, Any]]:
            payload = job.payload
            if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
                raise TaskError(f'a task job\'s payload is {{"task": <name>, "args": {{...}}}}, got {_kind(payload)}')
            task = tasks.get(payload["task"])
            if task is None:
                raise TaskError(f"unknown task {payload['task']!r} on queue {queue!r}; "
                                f"known: {', '.join(sorted(tasks))}")
            return task, task.arguments(payload.get("args", {}))

        if not any(task.is_async for task in tasks.values()):
            def run(job: Any) -> Any:
                task, arguments = find(job)
                return task.fn(**arguments)

            return run

        async def run_async(job: Any) -> Any:
            task, arguments = find(job)
            if task.is_async:
                return await task.fn(**arguments)
            return await asyncio.to_thread(task.fn, **arguments)

        return run_async


# arguments: JSON in, annotated types out -------------------------------------------


def convert(value: Any, annotation: Any, where: str) -> Any:
    """``value`` (decoded JSON) as ``annotation``: int, float, str, bool,
    dict, list, ``X | None``, ``list[X]``, ``dict[str, X]``, dataclasses;
    anything else (or no annotation) passes unchanged."""
    if annotation is Any or annotation is inspect.Parameter.empty:
        return value
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        for option in (o for o in options if o is not type(None)):
            try:
                return convert(value, option, where)
            except TaskError:
                continue
        raise TaskError(f"{where} must be {_name(annotation)}, got {_kind(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise TaskError(f"{where} must be {_name(annotation)}, got {_kind(value)}")
        (item,) = typing.get_args(annotation) or (Any,)
        return [convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise TaskError(f"{where} must be {_name(annotation)}, got {_kind(value)}")
        _, item = typing.get_args(annotation) or (str, Any)
        return {k: convert(v, item, f"{where}[{k!r}]") for k, v in value.items()}
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return _dataclass(value, annotation, where)
    if annotation is bool:
        if not isinstance(value, bool):
            raise TaskError(f"{where} must be bool, got {_kind(value)}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TaskError(f"{where} must be int, got {_kind(value)}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TaskError(f"{where} must be float, got {_kind(value)}")
        return float(value)
    if annotation in (str, dict, list):
        if not isinstance(value, annotation):
            raise TaskError(f"{where} must be {annotation.__name__}, got {_kind(value)}")
        return value
    return value


def _dataclass(value: Any, cls: type, where: str) -> Any:
    if not isinstance(value, dict):
        raise TaskError(f"{where} must be a {cls.__name__} object, got {_kind(value)}")
    hints = typing.get_type_hints(cls)
    fields = {field.name: field for field in dataclasses.fields(cls) if field.init}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise TaskError(f"{where}: {cls.__name__} has no field {unknown[0]!r}")
    missing = [name for name, field in fields.items() if name not in value
               and field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING]
    if missing:
        raise TaskError(f"{where}: {cls.__name__} is missing {missing[0]!r}")
    return cls(**{name: convert(v, hints.get(name, Any), f"{where}.{name}") for name, v in value.items()})


def _to_json(value: Any) -> Any:
    """Dataclass instances as objects, so a task's arguments travel as JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _to_json(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {key: _to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json(item) for item in value]
    return value


def _check_options(options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidArgument(f"unknown task option {unknown[0]!r}: options are {', '.join(OPTIONS)}")


def _kind(value: Any) -> str:
    """What a decoded JSON value is, for an error: ``str 'x'``, ``null``."""
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:39] + '…'}"


def _name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")
