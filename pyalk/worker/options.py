"""The checks of a worker's options, written once for both forms: each bad
value raises with the option's name and the value given, before anything
starts."""

from __future__ import annotations


def check_options(*, concurrency: object, prefetch: object, batch_size: object, buffer_lifetime: float | None,
                  settle_interval: float, poll_interval: float, busy_poll: float, grace_period: float) -> None:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be an int >= 0, got {prefetch!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    if buffer_lifetime is not None and not buffer_lifetime >= 0:
        raise ValueError(f"buffer_lifetime must be >= 0 seconds or None, got {buffer_lifetime!r}")
    if not settle_interval >= 0:
        raise ValueError(f"settle_interval must be >= 0 seconds, got {settle_interval!r}")
    if not poll_interval > 0:
        raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
    if not busy_poll >= 0:
        raise ValueError(f"busy_poll must be >= 0 seconds, got {busy_poll!r}")
    if not grace_period >= 0:
        raise ValueError(f"grace_period must be >= 0 seconds, got {grace_period!r}")
