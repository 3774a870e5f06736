"""Where the versioned SQL and the Alembic environment live: inside the wheel
(pyalk/sql, pyalk/alembic) or, in a source checkout, at the project root."""

from __future__ import annotations

from pathlib import Path

# pyalk/schema/resources.py -> the package root (pyalk/)
_PACKAGE = Path(__file__).resolve().parent.parent


def _find(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"pyalk's {name}/ folder is missing from {_PACKAGE} and its parent")


def sql_dir() -> Path:
    return _find("sql")


def alembic_dir() -> Path:
    return _find("alembic")
