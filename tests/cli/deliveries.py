"""Delivery functions the CLI tests run through ``pyalk relay outbox module:function``."""

from __future__ import annotations

from typing import Any

#: What the deliveries saw, in this process (in-process CLI runs).
delivered: list[Any] = []


def deliver(message: Any) -> None:
    if message.payload == "down":
        raise ConnectionError("ledger unreachable")
    delivered.append(message.payload)


async def deliver_async(message: Any) -> None:
    delivered.append(message.payload)
