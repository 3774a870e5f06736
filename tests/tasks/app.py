"""A user's task module, as docs/tasks.md describes one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyalk

#: What the tasks were called with, in this process.
calls: list[tuple[str, Any]] = []

tasks = pyalk.Tasks(queue="emails")


@dataclass
class Address:
    email: str
    name: str = ""


@tasks.task(max_attempts=5)
def send_email(to: Address, subject: str, retry_count: int = 0) -> None:
    calls.append(("send_email", (to, subject, retry_count)))


@tasks.task(name="typed", priority=3, delay=600)
def typed(n: int, x: float, flag: bool, tags: list[str], meta: dict[str, int], note: str | None = None,
          anything=None) -> None:  # anything: no annotation, passed as it is
    calls.append(("typed", (n, x, flag, tags, meta, note, anything)))


@tasks.task
def flaky() -> None:
    raise ValueError("not now")


async_tasks = pyalk.Tasks(queue="mixed")


@async_tasks.task
async def hello(name: str) -> None:
    calls.append(("hello", name))


@async_tasks.task
def plain(name: str) -> None:
    calls.append(("plain", name))


sums = pyalk.Tasks(queue="sums")


@sums.task
def add(a: int, b: int) -> dict[str, int]:
    """A task whose return value becomes its job's result."""
    return {"sum": a + b}
