"""The rotation of job storage (sql/queue/15_rotation.sql, docs/design.md,
"Job storage"): ``rotate_jobs`` calls alk.rotate_jobs, which empties the
current slot of alk.jobs with TRUNCATE once enough of its jobs are settled,
and waits at most 100 ms for its lock. pyalk's worker calls it as it goes
(pyalk/_async/worker/rotation.py); anything else may.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyalk import _codec

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from pyalk._async.executor import AsyncExecutor

_ROTATE = "SELECT alk.rotate_jobs()"
_ROTATE_AFTER = "SELECT alk.rotate_jobs(min_jobs => %(min_jobs)s::bigint)"


async def rotate_jobs(executor: AsyncExecutor, min_jobs: int | None = None, *,
                      conn: AsyncConnection | None = None) -> str:
    """``alk.rotate_jobs``: 'rotated', 'moving' (a step of at most 20,000
    rows moved, more are left: call again), 'not due', 'locked' or 'too many
    live jobs'. ``min_jobs``: the current slot's jobs that must be settled,
    with no more of them live than settled (None: the server's default; 0:
    now)."""
    if min_jobs is None:
        return str(await executor.value(_ROTATE, {}, conn=conn))
    return str(await executor.value(_ROTATE_AFTER, {"min_jobs": _codec.bigint(min_jobs, "min_jobs")}, conn=conn))
