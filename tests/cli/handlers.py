"""Handlers the CLI tests run through ``pyalk worker module:function``."""

from __future__ import annotations

from typing import Any

#: What the handlers saw, in this process (in-process CLI runs).
seen: list[Any] = []


class Unfixable(Exception):
    pass


def record(job: Any) -> None:
    if job.payload == "unfixable":
        raise Unfixable("cannot")
    if job.payload == "flaky":
        raise ValueError("try again")
    seen.append(job.payload)


async def record_async(job: Any) -> None:
    seen.append(job.payload)


not_callable = 42
