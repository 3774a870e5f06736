"""The stream: bindings of alk.publish, alk.read_since and the consumer
checkpoints, plus :class:`AsyncSubscription`, an iterator that replays from a
consumer's checkpoint and then tails the stream with LISTEN/NOTIFY.

Every rule (offsets, commit order, monotone checkpoints, extents, trims) is in
sql/stream.sql (docs/contract.md#streams); this module encodes arguments, decodes rows and
waits for wake-ups.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from time import monotonic
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import AsyncConnection

from pyalk import _codec
from pyalk._async.executor import raise_translated
from pyalk._async.listener import AsyncListener
from pyalk.backoff import Backoff
from pyalk.errors import InvalidArgument
from pyalk.values import STREAM_EVENT_COLUMNS, StreamEvent, stream_event_from_row

if TYPE_CHECKING:
    from pyalk._async.executor import AsyncExecutor

logger = logging.getLogger("pyalk.stream")

_PUBLISH = "SELECT alk.publish(stream => %(stream)s, payload => %(payload)s::jsonb, key => %(key)s)"
_PUBLISH_BATCH = (
    "SELECT * FROM alk.publish_batch(stream => %(stream)s, payloads => %(payloads)s::jsonb[], keys => %(keys)s::text[])"
)
_READ_SINCE = (
    "SELECT " + STREAM_EVENT_COLUMNS + " FROM alk.read_since(%(stream)s, %(after_offset)s::bigint, %(n)s::bigint)"
)
_READ_FROM_CONSUMER = (
    "SELECT " + STREAM_EVENT_COLUMNS + " FROM alk.read_from_consumer(%(stream)s, %(consumer)s, %(n)s::bigint)"
)
_SAVE_OFFSET = "SELECT alk.save_offset(%(stream)s, %(consumer)s, %(at_offset)s::bigint)"
_GET_OFFSET = "SELECT alk.get_offset(%(stream)s, %(consumer)s)"
_TRIM_TO = "SELECT alk.trim_to(%(stream)s, %(horizon)s::bigint)"
_CHANNEL = "SELECT alk.stream_channel(%(stream)s)"

#: Reconnect backoff of a subscription's listener: first retry at once, then
#: doubling from this many seconds up to _BACKOFF_MAX.
_BACKOFF_START = 0.05
_BACKOFF_MAX = 5.0


class AsyncStream:
    """One stream, by name. Cheap to create: it holds no connection."""

    def __init__(self, executor: AsyncExecutor, name: str) -> None:
        self.executor = executor
        self.name = _codec.text(name, "stream")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    async def publish(self, payload: Any, *, key: str | None = None, conn: AsyncConnection | None = None) -> int:
        """Append one event and return its offset (``conn``: inside the caller's
        transaction, which then holds the stream's publish lock until it ends)."""
        params = {"stream": self.name, "payload": _codec.payload(payload), "key": _codec.text(key, "key")}
        return int(await self.executor.value(_PUBLISH, params, conn=conn, transactional=True))

    async def publish_with_key(self, key: str | None, payload: Any, *, conn: AsyncConnection | None = None) -> int:
        """:meth:`publish` with the key first (the contract's spelling, docs/contract.md#streams)."""
        return await self.publish(payload, key=key, conn=conn)

    async def publish_batch(
        self,
        payloads: Iterable[Any],
        *,
        keys: Iterable[str | None] | None = None,
        conn: AsyncConnection | None = None,
    ) -> list[int]:
        """Append many events in one round trip; their offsets in input order.
        ``keys``, when given, holds one key (or None) per payload."""
        params = {
            "stream": self.name,
            "payloads": _codec.payloads(payloads),
            "keys": None if keys is None else [_codec.text(key, f"keys[{i}]") for i, key in enumerate(keys)],
        }
        rows = await self.executor.rows(_PUBLISH_BATCH, params, conn=conn, transactional=True)
        return [row[0] for row in rows]

    async def read_since(
        self, after_offset: int, n: int = 100, *, conn: AsyncConnection | None = None
    ) -> list[StreamEvent]:
        """Up to ``n`` events with offset > ``after_offset``, ascending (``n <= 0`` reads nothing)."""
        params = {
            "stream": self.name,
            "after_offset": _codec.bigint(after_offset, "after_offset"),
            "n": _codec.bigint(n, "n"),
        }
        rows = await self.executor.rows(_READ_SINCE, params, conn=conn, transactional=True)
        return [stream_event_from_row(row) for row in rows]

    async def read_from_consumer(
        self, consumer: str, n: int = 100, *, conn: AsyncConnection | None = None
    ) -> list[StreamEvent]:
        """Up to ``n`` events after the consumer's saved checkpoint."""
        params = {"stream": self.name, "consumer": _codec.text(consumer, "consumer"), "n": _codec.bigint(n, "n")}
        rows = await self.executor.rows(_READ_FROM_CONSUMER, params, conn=conn, transactional=True)
        return [stream_event_from_row(row) for row in rows]

    async def save_offset(self, consumer: str, offset: int, *, conn: AsyncConnection | None = None) -> bool:
        """Save the consumer's checkpoint; True when it advanced (a save at or
        below the stored one is a no-op returning False)."""
        params = {
            "stream": self.name,
            "consumer": _codec.text(consumer, "consumer"),
            "at_offset": _codec.bigint(offset, "offset"),
        }
        return bool(await self.executor.value(_SAVE_OFFSET, params, conn=conn, transactional=True))

    async def get_offset(self, consumer: str, *, conn: AsyncConnection | None = None) -> int:
        """The consumer's saved checkpoint, 0 when none was saved."""
        params = {"stream": self.name, "consumer": _codec.text(consumer, "consumer")}
        return int(await self.executor.value(_GET_OFFSET, params, conn=conn, transactional=True))

    async def trim_to(self, horizon: int) -> int:
        """Delete events at offsets <= ``horizon``; how many went."""
        params = {"stream": self.name, "horizon": _codec.bigint(horizon, "horizon")}
        return int(await self.executor.value(_TRIM_TO, params, transactional=True))

    async def channel(self) -> str:
        """The LISTEN channel publish notifies for this stream (``alk.stream_channel``)."""
        return str(await self.executor.value(_CHANNEL, {"stream": self.name}, transactional=True))

    def subscribe(
        self,
        consumer: str,
        *,
        batch: int = 100,
        poll_interval: float = 5.0,
        auto_save_every: int | None = None,
        auto_save_interval: float | None = None,
    ) -> AsyncSubscription:
        """An iterator over the stream for ``consumer``: it replays from the
        consumer's saved checkpoint, then tails new events as they commit.

        It listens on a dedicated connection (LISTEN/NOTIFY) and re-reads at
        least every ``poll_interval`` seconds when no notification comes. A
        dropped connection is reopened and reading resumes after the last event
        read, so nothing is lost; delivery is at least once (events after the
        saved checkpoint are yielded again by the next subscription).

        Checkpoints: call :meth:`AsyncSubscription.save_offset` to save the
        last yielded offset. With ``auto_save_every`` (events) and/or
        ``auto_save_interval`` (seconds) set, the subscription also saves by
        itself when asked for the next event once that many events or seconds
        have passed since the last save, whenever it has caught up and is about
        to wait, and when its ``with`` block ends without an exception. An
        event counts as processed once the next one is asked for.
        """
        return AsyncSubscription(
            self,
            consumer,
            batch=batch,
            poll_interval=poll_interval,
            auto_save_every=auto_save_every,
            auto_save_interval=auto_save_interval,
        )


class AsyncSubscription:
    """A consumer's live view of a stream; see :meth:`AsyncStream.subscribe`.

    Use it as ``async with stream.subscribe("billing") as events: async for
    event in events: ...``, or iterate it and call :meth:`aclose` when done.
    One task (or thread) at a time: it is not shareable.
    """

    def __init__(
        self,
        stream: AsyncStream,
        consumer: str,
        *,
        batch: int = 100,
        poll_interval: float = 5.0,
        auto_save_every: int | None = None,
        auto_save_interval: float | None = None,
    ) -> None:
        self.stream = stream
        self.consumer = _codec.text(consumer, "consumer")
        if _codec.bigint(batch, "batch") is None or batch <= 0:
            raise InvalidArgument(f"batch must be a positive int, got {batch!r}")
        if not poll_interval > 0:
            raise InvalidArgument(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
        if auto_save_every is not None and (_codec.bigint(auto_save_every, "auto_save_every") or 0) <= 0:
            raise InvalidArgument(f"auto_save_every must be a positive int, got {auto_save_every!r}")
        if auto_save_interval is not None and not auto_save_interval > 0:
            raise InvalidArgument(
                f"auto_save_interval must be a positive number of seconds, got {auto_save_interval!r}"
            )
        self.batch = batch
        self.poll_interval = poll_interval
        self.auto_save_every = auto_save_every
        self.auto_save_interval = auto_save_interval
        self._auto_save = auto_save_every is not None or auto_save_interval is not None
        self._buffer: deque[StreamEvent] = deque()
        self._started = False
        self._closed = False
        self._stopping = False
        #: Offset of the last event read from the database (buffered or yielded).
        self._position = 0
        #: Offset of the last event handed to the caller, None before the first.
        self._last_yielded: int | None = None
        self._unsaved = 0
        self._last_save_at = monotonic()
        self._listener: AsyncListener | None = None  # made by _start

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.stream.name!r}, {self.consumer!r}, at={self._last_yielded})"

    @property
    def last_offset(self) -> int | None:
        """The offset of the last event yielded, or None before the first."""
        return self._last_yielded

    @property
    def listener_pid(self) -> int | None:
        """The server process id of the listening connection, when connected."""
        return None if self._listener is None else self._listener.pid

    @property
    def reconnects(self) -> int:
        """How many times the listening connection was lost (each loss is followed by a reconnect)."""
        return 0 if self._listener is None else self._listener.reconnects

    async def __aenter__(self) -> AsyncSubscription:
        await self._start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            if exc_type is None and self._auto_save and self._unsaved and not self._closed:
                await self._auto_save_now()
        finally:
            await self.aclose()

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> StreamEvent:
        if self._closed:
            raise StopAsyncIteration
        if not self._started:
            await self._start()
        # The caller came back for more: what it was given is processed.
        if self._auto_save and self._unsaved and self._save_due():
            await self._auto_save_now()
        while not self._buffer:
            if self._stopping:
                # Everything yielded is processed: the same save as catching up.
                if self._auto_save and self._unsaved:
                    await self._auto_save_now()
                await self.aclose()
                raise StopAsyncIteration
            await self._fill()
        event = self._buffer.popleft()
        self._last_yielded = event.offset
        self._unsaved += 1
        return event

    async def save_offset(self, *, conn: AsyncConnection | None = None) -> bool:
        """Save the last yielded offset as the consumer's checkpoint, through
        the monotone ``alk.save_offset`` (``conn``: inside the caller's
        transaction). True when the stored checkpoint advanced; False when it
        did not or nothing was yielded yet."""
        if self._last_yielded is None:
            return False
        advanced = await self.stream.save_offset(self.consumer, self._last_yielded, conn=conn)
        self._unsaved = 0
        self._last_save_at = monotonic()
        return advanced

    def stop(self) -> None:
        """Ask the iteration to end: buffered events are still yielded, then it
        stops instead of waiting (at the latest ``poll_interval`` later when it
        is already waiting)."""
        self._stopping = True

    async def aclose(self) -> None:
        """Close the listening connection; iteration ends. Saves nothing."""
        self._closed = True
        self._buffer.clear()
        if self._listener is not None:
            await self._listener.close()

    # internals -------------------------------------------------------------

    def _save_due(self) -> bool:
        if self.auto_save_every is not None and self._unsaved >= self.auto_save_every:
            return True
        return self.auto_save_interval is not None and monotonic() - self._last_save_at >= self.auto_save_interval

    async def _start(self) -> None:
        """Read the checkpoint and start listening; errors here propagate."""
        if self._started:
            return
        self._position = await self.stream.get_offset(self.consumer)
        # The first retry after a loss is immediate; repeated failures back off, doubling.
        backoff = Backoff(_BACKOFF_START, _BACKOFF_MAX, jitter=False, immediate=True)
        self._listener = AsyncListener(self.stream.executor.listen_conninfo(), self.stream.channel, backoff=backoff)
        await self._listener.connect()
        self._started = True

    async def _fill(self) -> None:
        """Read the next events into the buffer, or wait for a wake-up.

        A lost connection (any OperationalError: terminated backend, network,
        server restart) is reopened with backoff; reading resumes after the
        last event read, so no event is lost or reordered."""
        assert self._listener is not None
        try:
            # LISTEN comes before the first read on every connection, so a
            # commit that the read misses is always notified to it.
            listener = await self._listener.connect()
            cursor = await listener.execute(
                _READ_SINCE, {"stream": self.stream.name, "after_offset": self._position, "n": self.batch}
            )
            rows = await cursor.fetchall()
            self._listener.healthy()
            if rows:
                events = [stream_event_from_row(row) for row in rows]
                self._buffer.extend(events)
                self._position = events[-1].offset
                return
            # Caught up: everything yielded so far is processed.
            if self._auto_save and self._unsaved:
                await self._auto_save_now()
            if self._stopping:
                return
            await self._listener.wait(self.poll_interval)
        except psycopg.OperationalError as error:
            await self._lost(error)
        except psycopg.Error as error:
            raise_translated(error)

    async def _lost(self, error: Exception) -> None:
        logger.warning(
            "stream %r consumer %r: listener connection lost (%s); reconnecting",
            self.stream.name,
            self.consumer,
            error,
        )
        if self._listener is not None:
            await self._listener.lost()

    async def _auto_save_now(self) -> None:
        """An automatic save; a lost connection only delays it (the next
        subscription re-reads a little more), so it never ends the iteration."""
        try:
            await self.save_offset()
        except psycopg.OperationalError as error:
            logger.warning(
                "stream %r consumer %r: automatic save_offset failed (%s); will retry",
                self.stream.name,
                self.consumer,
                error,
            )
