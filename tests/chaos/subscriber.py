"""A stream subscriber process the chaos tests SIGKILL and restart:
``python -m tests.chaos.subscriber DSN LOG``. It appends one JSON line when it
starts (the checkpoint it resumes from) and one per event it processed, and
saves its checkpoint after every event (auto_save_every=1)."""

from __future__ import annotations

import json
import os
import sys
import time

from pyalk import Alk


def main(dsn: str, log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    with Alk(dsn) as alk:
        stream = alk.stream("s")
        checkpoint = stream.get_offset("c")
        os.write(fd, (json.dumps({"run": os.getpid(), "checkpoint": checkpoint, "at": time.time()}) + "\n").encode())
        with stream.subscribe("c", auto_save_every=1, poll_interval=1.0) as events:
            for event in events:
                os.write(fd, (json.dumps({"run": os.getpid(), "offset": event.offset, "at": time.time()}) + "\n"
                              ).encode())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
