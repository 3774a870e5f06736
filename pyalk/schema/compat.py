"""Whether this pyalk can run on the schema a database has installed.

The schema says its version and the newest version that broke older clients
(``alk.schema_info()``, sql/core.sql). This pyalk needs the
head of the chain it ships and understands schemas up to that head; a newer
schema is fine unless it broke clients of this head's age.
"""

from __future__ import annotations

from pyalk.errors import SchemaMismatch
from pyalk.schema.install import head

#: The read every client makes once per connection source.
SCHEMA_INFO = "SELECT version, breaking_since FROM alk.schema_info()"

#: SQLSTATEs that mean "alk.schema_info() is not there": no schema alk
#: (3F000), or a schema older than 0008 (42883: undefined function).
MISSING = {"3F000", "42883"}


def check(version: str | None, breaking_since: str | None, *, needs: str | None = None) -> None:
    """Raise :class:`SchemaMismatch` with one clear line unless this pyalk can
    run on a schema at ``version`` whose clients broke at ``breaking_since``."""
    needs = needs or head()
    if version is None or version < needs:
        raise SchemaMismatch(
            f"schema {version or 'none'} is older than this pyalk needs ({needs}): run pyalk migrate")
    if breaking_since is not None and breaking_since > needs:
        raise SchemaMismatch(
            f"schema {version} is newer than this pyalk understands (it knows up to {needs}): upgrade pyalk")


def missing(*, needs: str | None = None) -> SchemaMismatch:
    """The error for a database where ``alk.schema_info()`` does not exist."""
    return SchemaMismatch(
        f"schema alk is not installed, or older than 0008 (this pyalk needs {needs or head()}): run pyalk migrate")
