"""docs/contract.md and the figures the docs state, checked against the catalog.

The contract page names functions, parameters, result shapes, row types and
error codes; each is compared with what a migrated database holds (pg_proc,
pg_attribute) and with pyalk.errors. Every hand-written doc is also read for
integer widths it attributes to a column or argument (a "32-bit" `priority`)
and compared with the column's real type. Names the contract pins for later
are listed in NOT_YET_BUILT: they must not exist yet, and once one lands the
test fails until the doc moves it out of "not yet implemented".
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import psycopg

from pyalk.errors import BY_SQLSTATE

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs/contract.md"

#: What docs/contract.md#flow-control-and-operations pins but the schema does
#: not have yet: functions, (function, parameter) pairs and alk.job columns.
NOT_YET_BUILT_FUNCTIONS: set[str] = set()
NOT_YET_BUILT_PARAMETERS: set[tuple[str, str]] = set()
NOT_YET_BUILT_COLUMNS: set[str] = set()

#: Relations whose integer columns the docs describe: the row types clients
#: scan and the private tables behind them.
WIDTH_CHECKED = ("alk.job", "alk.jobs", "alk.schedule", "alk.schedules")

#: Words that state a width: narrow (32 bits or less) and wide (64 bits).
NARROW = re.compile(r"32-bit|16-bit|\bint4\b|\bint2\b|\bsmallint\b|`integer`")
WIDE = re.compile(r"64-bit|\bint8\b|\bbigint\b")
INTEGER_TYPES = {"bigint": "wide", "integer": "narrow", "smallint": "narrow"}


def anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def sections(text: str) -> dict[str, str]:
    """Each heading's anchor and the text under it, up to the next heading of any level."""
    found: dict[str, str] = {}
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.M)
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        found[anchor(heading.lstrip("#"))] = body
    return found


def table_rows(body: str) -> list[list[str]]:
    """The cells of a markdown table's body rows (header and rule skipped)."""
    rows = [line for line in body.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def code(cell: str) -> str:
    """The first `code span` of a table cell."""
    match = re.search(r"`([^`]*)`", cell)
    assert match, f"no code span in {cell!r}"
    return match.group(1)


def hand_written_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "sql-reference.md")]


def catalog_functions(db: psycopg.Connection) -> dict[str, list[tuple[list[str], str]]]:
    """Every function of schema alk: its overloads' input parameter names and result."""
    rows = db.execute("""
        SELECT p.proname,
               ARRAY(SELECT p.proargnames[i] FROM generate_subscripts(p.proargnames, 1) AS i
                     WHERE p.proargmodes IS NULL OR p.proargmodes[i] IN ('i', 'b', 'v') ORDER BY i),
               pg_get_function_result(p.oid)
        FROM pg_proc p WHERE p.pronamespace = 'alk'::regnamespace""").fetchall()
    found: dict[str, list[tuple[list[str], str]]] = defaultdict(list)
    for name, arguments, result in rows:
        found[name].append((list(arguments), result))
    return found


def columns(db: psycopg.Connection, relation: str) -> list[tuple[str, str]]:
    """A table's or composite type's columns and their types, in order."""
    return db.execute("""
        SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
        WHERE a.attrelid = coalesce(to_regclass(%(r)s), (SELECT t.typrelid FROM pg_type t
                                                         WHERE t.oid = to_regtype(%(r)s)))
          AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum""", {"r": relation}).fetchall()


def test_anchors_are_github_slugs():
    assert anchor("Cancel, inspect, sweep") == "cancel-inspect-sweep"
    assert anchor(" Flow control and operations") == "flow-control-and-operations"
    assert set(sections("# A\nx\n## Queue\ny\n### Wake-ups\nz\n")) == {"a", "queue", "wake-ups"}


def test_every_contract_anchor_cited_exists():
    anchors = set(sections(PAGE.read_text()))
    for name in ("ground-rules", "queue", "streams", "outbox", "transactions", "locks", "scheduler", "workers",
                 "sql-api", "scale-out", "flow-control-and-operations"):
        assert name in anchors, f"docs/contract.md has no section #{name}"
    files = [*hand_written_docs(), *(ROOT / "sql").glob("*.sql"), *(ROOT / "pyalk").rglob("*.py"),
             *(ROOT / "tests").rglob("*.py")]
    for path in files:
        text = path.read_text()
        cited = re.findall(r"contract\.md#([\w-]+)", text)
        if path == PAGE:
            cited += re.findall(r"\]\(#([\w-]+)\)", text)
        for name in cited:
            assert name in anchors, f"{path.relative_to(ROOT)} cites docs/contract.md#{name}, which does not exist"


def test_pinned_functions_match_the_catalog(db):
    catalog = catalog_functions(db)
    rows = table_rows(sections(PAGE.read_text())["pinned-functions"])
    assert len(rows) > 40
    for function_cell, returns_cell in rows:
        match = re.fullmatch(r"alk\.(\w+)\((.*)\)", code(function_cell))
        assert match, f"not a call: {function_cell}"
        name, listed = match.group(1), [a.strip() for a in match.group(2).split(",") if a.strip()]
        assert name in catalog, f"docs/contract.md pins alk.{name}, which does not exist"
        overloads = {tuple(arguments): result for arguments, result in catalog[name]}
        assert tuple(listed) in overloads, (
            f"alk.{name}({', '.join(listed)}) in docs/contract.md, the catalog has {sorted(overloads)}")
        assert code(returns_cell) == overloads[tuple(listed)], f"alk.{name} returns {overloads[tuple(listed)]}"


def test_row_types_match_the_catalog(db):
    documented: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for type_cell, column, sql_type in table_rows(sections(PAGE.read_text())["row-types"]):
        documented[code(type_cell)].append((column, sql_type))
    assert set(documented) >= {"alk.job", "alk.schedule", "alk.stream_event"}
    for relation, listed in documented.items():
        assert listed == columns(db, relation), f"{relation}'s columns in docs/contract.md#row-types"
    # "Every integer column is bigint", for the row types and the tables behind them.
    for relation in WIDTH_CHECKED:
        narrow = [(c, t) for c, t in columns(db, relation) if INTEGER_TYPES.get(t) == "narrow"]
        assert narrow == [], f"{relation} has integer columns that are not bigint: {narrow}"


def test_error_codes_match_the_wrapper_and_errors_md():
    contract = {code(c): code(cls) for c, cls, _ in table_rows(sections(PAGE.read_text())["error-codes"])}
    errors_md = dict(re.findall(r"^\| `(LK\d{3})` \| `(pyalk\.\w+)`", (ROOT / "docs/errors.md").read_text(), re.M))
    wrapper = {sqlstate: f"pyalk.{cls.__name__}" for sqlstate, cls in BY_SQLSTATE.items()}
    assert contract == wrapper == errors_md


def test_every_alk_name_the_contract_uses_exists_or_is_marked_not_yet_built(db):
    text = PAGE.read_text()
    known = {row[0] for row in db.execute("""
        SELECT proname FROM pg_proc WHERE pronamespace = 'alk'::regnamespace
        UNION SELECT typname FROM pg_type WHERE typnamespace = 'alk'::regnamespace
        UNION SELECT relname FROM pg_class WHERE relnamespace = 'alk'::regnamespace""")}
    named = set(re.findall(r"\balk\.(\w+)", text))
    assert named - known == NOT_YET_BUILT_FUNCTIONS, "alk.* names in docs/contract.md that the schema lacks"
    catalog = catalog_functions(db)
    for function, parameter in NOT_YET_BUILT_PARAMETERS:
        assert all(parameter not in arguments for arguments, _ in catalog[function]), (
            f"alk.{function} has {parameter} now: move it out of docs/contract.md#flow-control-and-operations")
    job_columns = {c for c, _ in columns(db, "alk.job")}
    assert job_columns & NOT_YET_BUILT_COLUMNS == set(), "alk.job gained a pinned column: update docs/contract.md"
    pending = sections(text)["flow-control-and-operations"]
    bullets = re.split(r"^- ", pending, flags=re.M)[1:]
    assert len(bullets) == 0 and all("Not yet implemented" in b for b in bullets)
    for name in [*NOT_YET_BUILT_FUNCTIONS, *(p for _, p in NOT_YET_BUILT_PARAMETERS), *NOT_YET_BUILT_COLUMNS]:
        assert name in pending, f"{name} is listed as not yet built but docs/contract.md does not pin it"


def claims(text: str) -> list[str]:
    """The sentences (and table rows) of a markdown page, code blocks left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    units: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        if paragraph.lstrip().startswith("|"):
            units += paragraph.splitlines()
        else:
            units += re.split(r"(?<=[.;])\s+", " ".join(paragraph.split()))
    return units


def width_errors(text: str, widths: dict[str, str]) -> list[str]:
    """Sentences that name a column or argument in backticks and state a width it does not have."""
    wrong = []
    for sentence in claims(text):
        said = {"narrow" for _ in NARROW.finditer(sentence)} | {"wide" for _ in WIDE.finditer(sentence)}
        if len(said) != 1:
            continue  # no width stated, or both (a comparison): nothing to check
        for name in re.findall(r"`(\w+)`", sentence):
            if name in widths and widths[name] not in said:
                wrong.append(f"`{name}` is {widths[name]}: {sentence}")
    return wrong


def test_width_claims_are_read_from_sentences():
    widths = {"priority": "wide"}
    assert width_errors("`priority` and `x` are 32-bit columns. `priority` is a bigint.", widths) == [
        "`priority` is wide: `priority` and `x` are 32-bit columns."]
    assert width_errors("```sql\n-- `priority` int4\n```\nThe hash is a signed int4.", widths) == []


def test_docs_state_integer_widths_the_catalog_has(db):
    kinds: dict[str, set[str]] = defaultdict(set)
    for relation in WIDTH_CHECKED:
        for column, sql_type in columns(db, relation):
            if sql_type in INTEGER_TYPES:
                kinds[column].add(INTEGER_TYPES[sql_type])
    for name, sql_type in db.execute("""
        SELECT a.name, format_type(a.type, NULL) FROM pg_proc p,
               unnest(p.proargnames, coalesce(p.proallargtypes, p.proargtypes::oid[])) AS a(name, type)
        WHERE p.pronamespace = 'alk'::regnamespace AND p.proname !~ '^_'"""):
        if sql_type in INTEGER_TYPES:
            kinds[name].add(INTEGER_TYPES[sql_type])
    widths = {name: kind.pop() for name, kind in kinds.items() if len(kind) == 1}
    assert widths["priority"] == widths["max_attempts"] == "wide"
    wrong = [f"{path.relative_to(ROOT)}: {error}" for path in hand_written_docs()
             for error in width_errors(path.read_text(), widths)]
    assert wrong == []

