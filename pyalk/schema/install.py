"""The versioned SQL scripts and the install script for psql users.

``sql/versions/NNNN_<mechanism>.sql`` are immutable once landed; the chain
is their order. ``current_files()`` are the current definition, one
``sql/<mechanism>.sql`` or one folder ``sql/<mechanism>/`` per mechanism of
``CURRENT``, which a fresh install may run instead (``current_script``); the
migration tests prove both give the same catalog. A psql install runs them in one transaction and records the
head in ``alk.alembic_version``, the same table Alembic keeps, so either path
can take over from the other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pyalk.schema.resources import sql_dir

_VERSION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

#: Serialises concurrent installs and migrations (an arbitrary fixed key).
MIGRATION_LOCK_KEY = 0x616C6B_6D6967  # "alk" "mig"

VERSION_TABLE = "alembic_version"


@dataclass(frozen=True)
class Version:
    number: str
    mechanism: str
    path: Path

    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")


def versions() -> list[Version]:
    found = []
    for path in sorted((sql_dir() / "versions").iterdir()):
        match = _VERSION_FILE.match(path.name)
        if match:
            found.append(Version(match.group(1), match.group(2), path))
    return found


#: The current definition, by mechanism in dependency order.
CURRENT = ("core", "queue", "workers", "stream", "outbox", "lock", "schedule", "security")


def current_files() -> list[Path]:
    """The current files in install order: per mechanism of ``CURRENT``, its
    folder ``sql/<mechanism>/`` (every ``*.sql`` in it, by name: a mechanism too
    long for one file, cut by concern as 10_table.sql, 20_wake.sql, ...) or else
    its file ``sql/<mechanism>.sql``. One place decides this; every reader of
    the current definition goes through it."""
    files: list[Path] = []
    for name in CURRENT:
        folder, single = sql_dir() / name, sql_dir() / f"{name}.sql"
        if folder.is_dir():
            if single.exists():
                raise FileNotFoundError(f"{single} and {folder}/ both exist: a mechanism is one or the other")
            parts = sorted(folder.glob("*.sql"))
            if not parts:
                raise FileNotFoundError(f"{folder}/ holds no .sql file")
            files += parts
        else:
            files.append(single)
    return files


def current_name(path: Path) -> str:
    """A current file's name under sql/: ``core.sql``, ``queue/40_claim.sql``
    (read from the path alone, so a copy elsewhere keeps its name)."""
    return f"{path.parent.name}/{path.name}" if path.parent.name in CURRENT else path.name


def head() -> str:
    return versions()[-1].number


BOOTSTRAP = f"""\
SELECT pg_catalog.pg_advisory_xact_lock({MIGRATION_LOCK_KEY});
CREATE SCHEMA IF NOT EXISTS alk;
CREATE TABLE IF NOT EXISTS alk.{VERSION_TABLE} (
    version_num VARCHAR(32) NOT NULL,
    CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num)
);
"""


def install_script(after: str | None = None) -> str:
    """The SQL that brings a database to the head version.

    With ``after`` unset the script installs into a database without pyalk;
    with ``after`` set to the installed version it applies only what follows.
    Either way it refuses to run against a database at another version.
    """
    chain = [v for v in versions() if after is None or v.number > after]
    parts = _preamble(after)
    for version in chain:
        parts.append(f"-- version {version.number}: {version.mechanism}")
        parts.append(version.sql())
    if chain:
        parts += record_version(chain[-1].number)
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"


def current_script() -> str:
    """A fresh install from the current definition (``current_files``),
    recorded as the head version; it refuses a database that has pyalk."""
    parts = _preamble(None)
    for path in current_files():
        parts.append(f"-- current: {current_name(path)}")
        parts.append(path.read_text(encoding="utf-8"))
    parts += record_version(head())
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"


def record_version(number: str) -> list[str]:
    return [f"DELETE FROM alk.{VERSION_TABLE};",
            f"INSERT INTO alk.{VERSION_TABLE} (version_num) VALUES ('{number}');"]


def _preamble(after: str | None) -> list[str]:
    """BEGIN, the lock and version table, and the guard that the database is at ``after``."""
    expected = "NULL" if after is None else f"'{after}'"
    return [
        "-- pyalk install script: run with psql -v ON_ERROR_STOP=1 -f <file> (it is one transaction: BEGIN to COMMIT).",
        "BEGIN;",
        # 0001's CREATE SCHEMA IF NOT EXISTS meets the schema the bootstrap made:
        # no NOTICE about it (or any other) for this transaction only.
        "SET LOCAL client_min_messages = warning;",
        BOOTSTRAP,
        f"""DO $pyalk$
DECLARE installed text := (SELECT max(version_num) FROM alk.{VERSION_TABLE});
BEGIN
    IF installed IS DISTINCT FROM {expected} THEN
        RAISE EXCEPTION 'pyalk is installed at version %, this script expects %: use %',
            coalesce(installed, 'none'), coalesce({expected}, 'none'),
            CASE WHEN installed IS NULL THEN 'pyalk sql' ELSE 'pyalk sql --after ' || installed END;
    END IF;
END
$pyalk$;""",
    ]
