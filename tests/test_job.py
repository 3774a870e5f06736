"""job_from_row builds the same Job that Job(*row) does, every field in
place (it sets the slots directly: a misordered field would show here)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields

import pytest

from pyalk.values import Job, job_from_row


def test_job_from_row_sets_every_field_in_order():
    row = tuple(f"value of {field.name}" for field in fields(Job))
    built = job_from_row(row)
    assert built == Job(*row)
    assert [getattr(built, field.name) for field in fields(Job)] == list(row)
    assert job_from_row(("settled", *row), 1) == Job(*row)


def test_a_job_built_from_a_row_is_still_frozen():
    job = job_from_row(tuple(range(len(fields(Job)))))
    with pytest.raises(FrozenInstanceError):
        job.id = 5  # type: ignore[misc]
