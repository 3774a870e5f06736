"""The ledger reader beside its writers: a line still being appended is left
for the next read, never parsed half-written (CI once read '{"id": 40,
"attempt"' mid-write); once the writers stopped, such a line fails the check."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import jsonl_records

LINE = '{"id": 40, "attempt": 1, "worker": "w", "pid": 1, "start": 1.5, "expires": 2}'


def test_a_line_in_flight_is_left_for_the_next_read(tmp_path: Path) -> None:
    path = tmp_path / "1.jsonl"
    path.write_text(LINE + "\n" + LINE[:20])
    assert jsonl_records(path) == [{"id": 40, "attempt": 1, "worker": "w", "pid": 1, "start": 1.5, "expires": 2}]
    path.write_text(LINE + "\n" + LINE + "\n")
    assert len(jsonl_records(path)) == 2


def test_an_unterminated_line_after_the_writers_stopped_fails(tmp_path: Path) -> None:
    path = tmp_path / "1.jsonl"
    path.write_text(LINE + "\n" + LINE[:20])
    with pytest.raises(AssertionError, match="unterminated"):
        jsonl_records(path, settled=True)
    assert jsonl_records(tmp_path / "absent.jsonl", settled=True) == []
