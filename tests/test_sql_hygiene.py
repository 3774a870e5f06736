"""Promises about every function pyalk installs, checked in the catalog and
in the source: pinned search_path, private tables, documented functions, one
error-code table, generated sync code, a current SQL reference."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import sqlglot
from sqlglot.tokens import TokenType

from pyalk.errors import BY_SQLSTATE
from pyalk.schema.docgen import render
from pyalk.schema.install import current_files, current_name

ROOT = Path(__file__).resolve().parent.parent

#: Public functions with no Python binding, and why.
SQL_ONLY = {
    "now": "the clock; Python code reads it through the functions that use it",
    "pinned_clock": "the clock's pinned branch; alk.now() calls it",
    "clock_privilege": "a privilege marker: GRANT EXECUTE on it, nobody needs to call it",
    "grant_reader": "role administration: run from psql or a deploy migration (docs/security.md)",
    "grant_producer": "role administration: run from psql or a deploy migration (docs/security.md)",
    "grant_worker": "role administration: run from psql or a deploy migration (docs/security.md)",
    "grant_admin": "role administration: run from psql or a deploy migration (docs/security.md)",
    "revoke_all": "role administration: run from psql or a deploy migration (docs/security.md)",
    "role_grants": "role administration: inspect from psql (docs/security.md)",
    "role_functions": "role administration: inspect from psql (docs/security.md)",
    "limit_names": "role administration: run from psql or a deploy migration (docs/security.md)",
    "name_limits": "role administration: inspect from psql (docs/security.md)",
}


#: Hot-path expression helpers that carry no SET clause so the planner can
#: inline them (sql/core.sql explains why at alk.now): alk.now, the clock;
#: _sat_add and _sat_sub, saturating stamp arithmetic in every WHERE and SET;
#: _holds, the claimed-job predicate of ack/retry/fail/heartbeat (sql/queue/10_table.sql);
#: _purge_at, the retention rule the sweep's index is built on.
#: _limits_active, the constant that plans the name-limit checks away (sql/core.sql).
INLINABLE = {"now", "_sat_add", "_sat_sub", "_holds", "_purge_at", "_name_ok", "_channel", "_queue_channel",
             "_limits_active"}


def _public_in(acl: str | None) -> bool:
    """Whether an aclitem[] text grants anything to PUBLIC (an empty grantee)."""
    return acl is not None and any(item.startswith("=") for item in acl.strip("{}").split(","))


def test_every_function_pins_search_path_and_public_ones_are_definer_and_documented(db):
    rows = db.execute("""
        SELECT p.proname, p.proconfig, p.prosecdef, obj_description(p.oid, 'pg_proc'), p.proacl::text
        FROM pg_proc p WHERE p.pronamespace = 'alk'::regnamespace""").fetchall()
    assert rows
    for name, config, definer, comment, acl in rows:
        if name in INLINABLE:
            assert config is None, f"alk.{name} must stay inlinable (no SET clause)"
        else:
            # Exactly this setting (other settings such as TimeZone may sit beside it).
            pinned = [item for item in config or [] if item.startswith("search_path=")]
            assert pinned == ["search_path=pg_catalog, pg_temp"], f"alk.{name} has proconfig {config}"
        assert comment, f"alk.{name} has no COMMENT"
        assert not _public_in(acl), f"PUBLIC may execute alk.{name}: {acl}"
        if not name.startswith("_") and name != "now":
            assert definer, f"alk.{name} should be SECURITY DEFINER"


def test_inlinable_helpers_cannot_be_redirected_by_search_path(db):
    """No SET clause, so every function and operator must be qualified: strip
    the qualified forms, literals and casts, and nothing resolvable remains."""
    for name in INLINABLE:
        language, body = db.execute(
            "SELECT l.lanname, p.prosrc FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
            "WHERE p.pronamespace = 'alk'::regnamespace AND p.proname = %s", [name]).fetchone()
        assert language == "sql", name
        assert db.execute("SELECT provolatile <> 'v' OR proname = 'now' FROM pg_proc "
                          "WHERE pronamespace = 'alk'::regnamespace AND proname = %s", [name]).fetchone()[0]
        rest = re.sub(r"--[^\n]*", " ", body)  # comments
        rest = re.sub(r"'(?:[^']|'')*'", "''", rest)  # string literals
        rest = re.sub(r"OPERATOR\(pg_catalog\.[^)]+\)", " OP ", rest)
        rest = re.sub(r"::(bigint|numeric|text)\b", " ", rest)
        rest = re.sub(r"\b(pg_catalog|alk)\.\w+\s*\(", " (", rest)
        assert not re.search(r"[<>=~+*/!|%^&-]", rest), f"alk.{name} has an unqualified operator: {rest}"
        words = set(re.findall(r"\b[a-z_]+\b(?=\s*\()", rest)) - {"select", "case", "when", "then", "else", "and",
                                                                      "or", "not", "null", "is", "end", "true"}
        assert not words, f"alk.{name} calls unqualified functions: {words}"


def test_public_has_no_rights_on_the_schema_or_tables(db):
    schema_acl = db.execute("SELECT nspacl::text FROM pg_namespace WHERE nspname = 'alk'").fetchone()[0]
    assert not _public_in(schema_acl)
    for relname, acl in db.execute(
            "SELECT relname, relacl::text FROM pg_class WHERE relnamespace = 'alk'::regnamespace"):
        assert not _public_in(acl), (relname, acl)


def test_granted_role_can_use_the_functions_but_not_the_tables(db, dsn):
    role = "pyalk_app_" + str(abs(hash(dsn)) % 10**8)
    db.execute(f'CREATE ROLE "{role}" LOGIN')
    outsider = role + "_out"
    db.execute(f'CREATE ROLE "{outsider}" LOGIN')
    try:
        # The broader grant of docs/security.md, verbatim in shape.
        db.execute(f'GRANT USAGE ON SCHEMA alk TO "{role}"')
        db.execute(f'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA alk TO "{role}"')
        with psycopg.connect(dsn, user=role, autocommit=True) as app:
            job_id = app.execute("SELECT alk.enqueue('q', '{}')").fetchone()[0]
            assert app.execute("SELECT id FROM alk.claim('q', 'w', 1)").fetchone()[0] == job_id
            assert app.execute("SELECT alk.ack(%s, 'w', 1)", [job_id]).fetchone()[0] is True
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("SELECT * FROM alk.jobs")
        with psycopg.connect(dsn, user=outsider, autocommit=True) as other, pytest.raises(
                psycopg.errors.InsufficientPrivilege):
            other.execute("SELECT alk.enqueue('q', '{}')")
    finally:
        db.execute(f'DROP OWNED BY "{role}"')
        db.execute(f'DROP ROLE "{role}"')
        db.execute(f'DROP ROLE "{outsider}"')


def test_least_privilege_recipe_grants_kinds_not_helpers(db, dsn):
    role = "pyalk_lp_" + str(abs(hash(dsn)) % 10**8)
    db.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        # The recipe of docs/security.md ("Roles as code").
        db.execute("SELECT alk.grant_producer(%s), alk.grant_worker(%s)", [role, role])
        with psycopg.connect(dsn, user=role, autocommit=True) as app:
            assert app.execute("SELECT alk.now()").fetchone()[0] > 1_700_000_000
            job_id = app.execute("SELECT alk.enqueue('q', '{}')").fetchone()[0]
            assert app.execute("SELECT id FROM alk.claim('q', 'w', 1)").fetchone()[0] == job_id
            assert app.execute("SELECT alk.try_lock('l', 'me', 60)").fetchone()[0] is True
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("SELECT alk._try_lock('alk:scheduler', 'me', 60)")
    finally:
        db.execute(f'DROP OWNED BY "{role}"')
        db.execute(f'DROP ROLE "{role}"')


def test_caller_search_path_cannot_redirect_a_function(db):
    # A planted pg_temp/public function or table named like what alk uses
    # changes nothing: bodies resolve in pg_catalog and alk only.
    db.execute("CREATE TEMP TABLE jobs (id bigint)")
    db.execute("CREATE FUNCTION pg_temp.now() RETURNS bigint LANGUAGE sql AS 'SELECT 1'")
    db.execute("SET search_path = pg_temp, public")
    db.execute("SELECT set_config('alk.now', '1700000000', false)")
    job_id = db.execute("SELECT alk.enqueue('q', '1')").fetchone()[0]
    assert db.execute("SELECT run_at FROM alk.get_job('q', %s)", [job_id]).fetchone()[0] == 1_700_000_000


def _statements(text: str) -> list[list[sqlglot.tokens.Token]]:
    """Split a SQL script into statements with sqlglot's tokenizer (it knows
    dollar quoting and comments, so bodies stay whole)."""
    statements: list[list[sqlglot.tokens.Token]] = [[]]
    for token in sqlglot.tokenize(text, read="postgres"):
        if token.token_type == TokenType.SEMICOLON:
            statements.append([])
        else:
            statements[-1].append(token)
    return [s for s in statements if s]


def _argument_types(tokens: list[sqlglot.tokens.Token]) -> str:
    """The text between the name's parentheses, a stand-in for the signature."""
    depth, text = 0, []
    for token in tokens:
        if token.token_type == TokenType.L_PAREN:
            depth += 1
            if depth == 1:
                continue
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1
            if depth == 0:
                break
        if depth >= 1:
            text.append(token.text)
    return " ".join(text)


def _created_functions() -> dict[str, str]:
    """alk function name -> the current file (its name under sql/) that creates
    it; every function is qualified and created once per name and signature."""
    found: dict[str, str] = {}
    signatures: dict[tuple[str, str], str] = {}
    for path in current_files():
        for tokens in _statements(path.read_text()):
            words = [t.text.upper() for t in tokens[:4]]
            if words[:2] == ["CREATE", "FUNCTION"] or words[:4] == ["CREATE", "OR", "REPLACE", "FUNCTION"]:
                start = 2 if words[1] == "FUNCTION" else 4
                schema, dot, name = (t.text for t in tokens[start:start + 3])
                assert (schema, dot) == ("alk", "."), f"unqualified function in {current_name(path)}"
                signature = (name, _argument_types(tokens[start + 3:]))
                assert signature not in signatures, (
                    f"alk.{name} is created in {signatures[signature]} and again in {current_name(path)}: "
                    "define it once")
                signatures[signature] = current_name(path)
                found.setdefault(name, current_name(path))
    return found


def test_current_files_create_every_function_once_and_qualified():
    created = _created_functions()
    assert created["claim"] == "queue/40_claim.sql" and created["schema_info"] == "core.sql"


#: The longest a current file may be, so a mechanism cut into a folder stays cut
#: (sql/queue/ was one 1,849-line file).
MAX_CURRENT_LINES = 600

#: Over the limit for now, by name: the next to cut into a folder as sql/queue/ was.
TOO_LONG_FOR_NOW = {"schedule.sql"}


def test_current_files_are_every_sql_file_and_none_is_too_long():
    sql = ROOT / "sql"
    listed = [current_name(p) for p in current_files()]
    on_disk = {current_name(p) for p in sql.rglob("*.sql") if p.relative_to(sql).parts[0] != "versions"}
    assert sorted(listed) == sorted(on_disk), "every SQL file outside sql/versions/ is installed, once"
    lines = {current_name(p): len(p.read_text().splitlines()) for p in current_files()}
    too_long = {name: n for name, n in lines.items() if n > MAX_CURRENT_LINES}
    assert set(too_long) == TOO_LONG_FOR_NOW, f"cut into sql/<mechanism>/ by concern (or list here): {too_long}"


def test_every_public_function_is_bound_in_python_and_documented():
    python = "\n".join(p.read_text() for p in (ROOT / "pyalk").rglob("*.py"))
    docs = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md") if p.name != "sql-reference.md")
    for name in _created_functions():
        if name.startswith("_"):
            continue
        assert f"alk.{name}(" in docs, f"alk.{name} has no example in docs/"
        if name not in SQL_ONLY:
            assert re.search(rf"alk\.{name}\(", python), f"alk.{name} is not bound in pyalk/"


def raised_codes(source: str) -> set[str]:
    """The SQLSTATEs a SQL source raises: the code of every alk._raise call
    (comments and strings that merely mention a code do not count)."""
    code_only = re.sub(r"--[^\n]*", "", source)
    return set(re.findall(r"alk\._raise\(\s*'(LK\d{3})'", code_only))


def test_raised_codes_are_read_from_raise_calls_only():
    assert raised_codes("PERFORM alk._raise('LK002', 'x');\n-- alk._raise('LK004', ...)\nSELECT 'LK003';") == {"LK002"}


def test_error_codes_agree_between_sql_python_and_docs():
    raised = set()
    for path in current_files():
        raised |= raised_codes(path.read_text())
    documented = set(re.findall(r"^\| `(LK\d{3})` \| `pyalk\.(\w+)`", (ROOT / "docs/errors.md").read_text(), re.M))
    assert "LK000" not in raised
    assert raised <= set(BY_SQLSTATE)
    assert {code: cls.__name__ for code, cls in BY_SQLSTATE.items()} == dict(documented)
    # Every documented code has a SQL path that raises it: no code is a promise only a wrapper keeps.
    assert {code for code, _ in documented} - raised == set(), "documented in docs/errors.md but raised by no SQL"


def test_generated_sync_code_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "tools/unasync.py"), "--check"], capture_output=True,
                            text=True)
    assert result.returncode == 0, "run python tools/unasync.py: " + result.stdout


def test_sql_reference_is_current(pg_server, template_db):
    if pg_server.version // 10000 != 18:
        pytest.skip("docs/sql-reference.md is rendered on PostgreSQL 18; other versions format defaults differently")
    rendered = render(pg_server.dsn_for(template_db))
    assert (ROOT / "docs/sql-reference.md").read_text() == rendered, "run python -m pyalk.schema.docgen --dsn ..."
