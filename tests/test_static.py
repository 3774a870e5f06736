"""The package's promises that need no database, as the fast check states
them (tools/check: ruff, mypy in strict mode, the generated sync tree, the SQL
version pins); py.typed ships, so the annotations are part of the API."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_fast_check_passes():
    result = subprocess.run(["bash", str(ROOT / "tools" / "check")], cwd=ROOT, capture_output=True, text=True,
                            timeout=600, env=dict(os.environ, PYTHON=sys.executable))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("tools/check: all passed")
