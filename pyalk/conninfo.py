"""The database pyalk connects to when the caller names none: ``$PYALK_DSN``,
else libpq's own environment and defaults (an empty conninfo: PGHOST,
PGPORT, PGDATABASE, PGUSER, PGPASSWORD, PGSERVICE, ~/.pgpass, ...).

``Alk()``, ``AsyncAlk()`` and every ``pyalk`` command without ``--dsn``
resolve it here, so a library and its command line reach the same database.
An explicit source (``Alk("dbname=app")``, ``--dsn``) always wins, an empty
one included: ``Alk("")`` is libpq's environment alone.
"""

from __future__ import annotations

import os

#: The environment variable that names pyalk's database (a conninfo or URI).
ENVIRONMENT_VARIABLE = "PYALK_DSN"


def default_conninfo() -> str:
    """``$PYALK_DSN`` when set and not empty, else ``""``: libpq then reads
    its own environment variables and defaults."""
    return os.environ.get(ENVIRONMENT_VARIABLE) or ""
