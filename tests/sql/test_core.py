"""The core every mechanism stands on (sql/core.sql; docs/contract.md#ground-rules)."""

from __future__ import annotations

import pytest

from pyalk.errors import SchemaMismatch
from pyalk.schema import compat
from pyalk.schema.install import head


def test_schema_info_reports_the_installed_head_and_its_breaking_marker(db):
    version, breaking_since = db.execute("SELECT version, breaking_since FROM alk.schema_info()").fetchone()
    assert version == head()
    assert breaking_since is not None and breaking_since <= version
    compat.check(version, breaking_since)  # this pyalk runs on the schema it installs


def test_schema_info_follows_the_version_table(db):
    db.execute("UPDATE alk.alembic_version SET version_num = '0042'")
    assert db.execute("SELECT version FROM alk.schema_info()").fetchone()[0] == "0042"


@pytest.mark.parametrize(("version", "breaking", "message"), [
    ("0007", "0001", "schema 0007 is older than this pyalk needs"),
    (None, None, "schema none is older than this pyalk needs"),
    ("9999", "9999", "schema 9999 is newer than this pyalk understands"),
])
def test_a_schema_this_pyalk_cannot_run_on_is_one_clear_line(version, breaking, message):
    with pytest.raises(SchemaMismatch, match=message) as caught:
        compat.check(version, breaking)
    assert "\n" not in str(caught.value)


def test_a_newer_schema_that_broke_nothing_is_accepted():
    compat.check("9999", head())
