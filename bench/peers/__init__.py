"""End-to-end peer runners (issue 7 §2).

Each runner is a module run in its own process against its own database:

    python -m bench.peers.<name> --dsn DSN --url URL --jobs N --concurrency C

It installs the peer's schema through the peer's own API, enqueues N no-op
jobs with the peer's bulk API, then starts the peer's worker configured as
its documentation recommends for throughput and times how long N jobs take
to be processed. It prints one JSON line (see ``common.PeerResult``).

The pyalk row (``pyalk_worker``) is the slot for pyalk's own worker.
"""
