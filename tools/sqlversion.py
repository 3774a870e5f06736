"""Maintainer tool for the SQL change flow (docs/migrations.md, "How to change a rule").

    python tools/sqlversion.py diff [--dsn DSN]          what the current files change against the chain
    python tools/sqlversion.py new NAME [--from-diff]    the next version file, its Alembic revision, its pin
    python tools/sqlversion.py pin                       refresh the pins of versions not yet on main
    python tools/sqlversion.py check                     the pins and the Alembic revisions match sql/versions

Pins: a version's sha256, so a landed version is never edited. Versions
0001-0048 are pinned together in sql/versions/MANIFEST, which is closed: a
landed file like them, its own digest pinned here (MANIFEST_SHA256). Each
version since pins itself in NNNN_<name>.sql.sha256 beside it, a new file
written once (``sha256sum -c`` reads both).

``diff`` installs the chain and the current files into two scratch databases
on the server of --dsn (or PYALK_DEV_DSN), compares their catalogs and prints,
for every changed or new function, its CREATE OR REPLACE and COMMENT ON block
from the current file that holds it (``current_files()``: sql/<mechanism>.sql
or a file of sql/<mechanism>/); other differences (tables, types, indexes) are listed
for the maintainer to write as ALTERs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyalk.schema.install import current_files, current_script, head, install_script, versions  # noqa: E402

VERSIONS = ROOT / "sql" / "versions"
MANIFEST = VERSIONS / "MANIFEST"
#: The digest of MANIFEST as it landed with 0048, its last line: closed since.
MANIFEST_SHA256 = "275268d0cbafaff9753ce423625c9e34d81365315d8aff9945aed27e4fea8b22"
#: A version's own pin file: NNNN_<name>.sql + this, in sha256sum's format.
PIN_SUFFIX = ".sha256"
ALEMBIC_VERSIONS = ROOT / "alembic" / "versions"
REVOKE = "REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;"


@dataclass(frozen=True)
class FunctionBlock:
    """One function of a current file: its CREATE statement and its COMMENT ON."""

    key: str  # "alk.name(type,type)", spaces removed, as regprocedure prints it
    create: str
    comment: str

    def replace_sql(self) -> str:
        create = re.sub(r"^CREATE\s+(OR\s+REPLACE\s+)?FUNCTION", "CREATE OR REPLACE FUNCTION", self.create)
        return f"{create}\n{self.comment}\n"


def _signature_key(text: str) -> str:
    return re.sub(r"\s+", "", text)


def function_blocks(source: str) -> dict[str, FunctionBlock]:
    """Every function a current file defines, keyed by the signature of its COMMENT ON."""
    import sqlglot
    from sqlglot.tokens import TokenType

    statements: list[str] = []
    first = None
    for token in sqlglot.tokenize(source, read="postgres"):
        if first is None:
            first = token.start
        if token.token_type == TokenType.SEMICOLON:
            statements.append(source[first:token.end + 1])
            first = None
    creates: dict[str, str] = {}
    blocks: dict[str, FunctionBlock] = {}
    for statement in statements:
        create = re.match(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(alk\.\w+)", statement)
        comment = re.match(r"COMMENT\s+ON\s+FUNCTION\s+(alk\.\w+\s*\([^)]*\))", statement)
        if create:
            creates[create.group(1)] = statement
        elif comment:
            key = _signature_key(comment.group(1))
            name = key.split("(")[0]
            if name not in creates:
                raise ValueError(f"COMMENT ON FUNCTION {key} comes before (or without) its CREATE")
            blocks[key] = FunctionBlock(key, creates.pop(name), statement)
    if creates:
        raise ValueError(f"functions without a COMMENT ON: {', '.join(sorted(creates))}")
    return blocks


def current_blocks() -> dict[str, FunctionBlock]:
    blocks: dict[str, FunctionBlock] = {}
    for path in current_files():
        blocks.update(function_blocks(path.read_text(encoding="utf-8")))
    return blocks


# -- diff ---------------------------------------------------------------------


@contextmanager
def scratch_database(dsn: str) -> Iterator[str]:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    name = f"pyalk_sqlversion_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@dataclass
class Diff:
    functions: list[FunctionBlock]  # changed or new in the current files
    dropped: list[str]  # in the chain, not in the current files
    other: dict[str, tuple[list[tuple[object, ...]], list[tuple[object, ...]]]]  # part -> (chain only, current only)

    def empty(self) -> bool:
        return not (self.functions or self.dropped or self.other)


def diff(dsn: str) -> Diff:
    import psycopg

    from tests.migrations.catalog import snapshot

    with scratch_database(dsn) as chain_dsn, scratch_database(dsn) as current_dsn:
        for target, script in ((chain_dsn, install_script()), (current_dsn, current_script())):
            with psycopg.connect(target, autocommit=True) as conn:
                conn.execute(script)
        chain, current = snapshot(chain_dsn), snapshot(current_dsn)
    old = {row[0]: row for row in chain.pop("functions")}
    new = {row[0]: row for row in current.pop("functions")}
    blocks = current_blocks()
    changed = [_signature_key(key) for key in sorted(new) if old.get(key) != new[key]]
    missing = [key for key in changed if key not in blocks]
    if missing:
        raise ValueError(f"no COMMENT ON FUNCTION with this signature in the current files: {missing}")
    other = {}
    for part, rows in current.items():
        before = chain[part]
        if rows != before:
            other[part] = ([r for r in before if r not in rows], [r for r in rows if r not in before])
    return Diff([blocks[key] for key in changed], sorted(set(old) - set(new)), other)


def render_diff(found: Diff) -> str:
    lines: list[str] = []
    for block in found.functions:
        lines += [f"-- {block.key}: changed or new in the current files", block.replace_sql()]
    for key in found.dropped:
        lines += [f"-- {key} is gone from the current files", f"DROP FUNCTION {key};", ""]
    for part, (chain_only, current_only) in found.other.items():
        lines.append(f"-- {part} differ: write the ALTER (or CREATE) by hand")
        lines += [f"--   chain only:   {row}" for row in chain_only]
        lines += [f"--   current only: {row}" for row in current_only]
        lines.append("")
    return "\n".join(lines)


# -- new and pin ----------------------------------------------------------------

ALEMBIC = '''"""pyalk {number}: apply sql/versions/{number}_{name}.sql."""

from pyalk.schema.migrate import apply_version

revision = "{number}"
down_revision = "{previous}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_version("{number}")
'''


def _read_pins(path: Path) -> dict[str, str]:
    """The ``<sha256>  <file>`` lines of a pin file."""
    pinned = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split()
            pinned[name] = digest
    return pinned


def pin_path(version: Path) -> Path:
    """Where a version since 0049 keeps its pin."""
    return version.with_name(version.name + PIN_SUFFIX)


def manifest_lines() -> dict[str, str]:
    """The pins MANIFEST holds (0001-0048)."""
    return _read_pins(MANIFEST)


def own_pins() -> dict[str, str]:
    """The pins of the versions since MANIFEST closed, each from its own file."""
    pinned = {}
    for path in sorted(MANIFEST.parent.glob(f"*{PIN_SUFFIX}")):
        pinned.update(_read_pins(path))
    return pinned


IMMUTABLE = "a landed version is immutable: write a new version file (docs/migrations.md, 'How to change a rule')"


def manifest_problems() -> list[str]:
    """What is wrong between sql/versions, its pins and alembic/versions: a
    changed MANIFEST, a version pinned twice or in a pin file not its own, a
    version file whose sha256 is not its pinned one, one not pinned, a pinned
    one gone, a version without its Alembic revision (each NNNN_*.py applies
    version NNNN on top of the one before). Empty when all agree; no database."""
    problems = []
    if _sha256(MANIFEST) != MANIFEST_SHA256:
        problems.append(f"sql/versions/MANIFEST changed: it is closed since 0049 (it pins 0001-0048, landed); "
                        f"a newer version pins itself in NNNN_<name>.sql{PIN_SUFFIX}")
    closed, own = manifest_lines(), own_pins()
    problems += [f"{name} is pinned twice: in MANIFEST and in {name}{PIN_SUFFIX}"
                 for name in sorted(closed.keys() & own.keys())]
    for path in sorted(MANIFEST.parent.glob(f"*{PIN_SUFFIX}")):
        stray = set(_read_pins(path)) - {path.name[:-len(PIN_SUFFIX)]}
        problems += [f"{path.name} pins {name}, not its own version" for name in sorted(stray)]
    pinned = {**closed, **own}
    on_disk = {v.path.name: _sha256(v.path) for v in versions()}
    problems += [f"{name} changed: {IMMUTABLE}" for name in sorted(pinned.keys() & on_disk.keys())
                 if pinned[name] != on_disk[name]]
    problems += [f"{name} is not pinned: run python tools/sqlversion.py new (or pin)"
                 for name in sorted(on_disk.keys() - pinned.keys())]
    problems += [f"{name} is pinned but gone: {IMMUTABLE}"
                 for name in sorted(pinned.keys() - on_disk.keys())]
    previous = None
    for version in versions():
        revisions = list(ALEMBIC_VERSIONS.glob(f"{version.number}_*.py"))
        if len(revisions) != 1:
            problems.append(f"version {version.number} has {len(revisions)} Alembic revisions"
                            " in alembic/versions, not 1")
        else:
            text = revisions[0].read_text()
            down = f'"{previous}"' if previous else "None"
            expected = (f'revision = "{version.number}"', f"down_revision = {down}",
                        f'apply_version("{version.number}")')
            problems += [f"{revisions[0].name} lacks {line}" for line in expected if line not in text]
        previous = version.number
    return problems


def write_pin(version: Path) -> None:
    pin_path(version).write_text(f"{_sha256(version)}  {version.name}\n")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def new_version(name: str, body: str) -> Path:
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"name must be lower-case letters, digits and _, got {name!r}")
    previous = head()
    number = f"{int(previous) + 1:04d}"
    path = VERSIONS / f"{number}_{name}.sql"
    header = (f"-- pyalk {number}: {name} (what changes and why; the rule itself lives in sql/<mechanism>.sql "
              "or sql/<mechanism>/).\n")
    path.write_text(f"{header}\n{body.rstrip()}\n\n{REVOKE}\n", encoding="utf-8")
    revision = ROOT / "alembic" / "versions" / f"{number}_{name}.py"
    revision.write_text(ALEMBIC.format(number=number, name=name, previous=previous), encoding="utf-8")
    write_pin(path)
    return path


def _landed(path: Path, base: str) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{base}:{rel}"],
                          capture_output=True).returncode == 0


def pin(base: str = "main") -> list[str]:
    """Refresh the pins of version files not yet on ``base``; a landed one never moves, nor MANIFEST."""
    closed = manifest_lines()
    touched = []
    for version in versions():
        own = pin_path(version.path)
        if version.path.name in closed:
            continue  # checked by check: MANIFEST is closed
        if own.exists() and _read_pins(own).get(version.path.name) == _sha256(version.path):
            continue
        if own.exists() and _landed(version.path, base):
            raise SystemExit(f"{version.path.name} is on {base} and changed: a landed version is immutable: "
                             "write a new version file")
        write_pin(version.path)
        touched.append(version.path.name)
    return touched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/sqlversion.py")
    sub = parser.add_subparsers(dest="command", required=True)
    dsn_help = "a server to create scratch databases on (default: $PYALK_DEV_DSN)"
    p_diff = sub.add_parser("diff", help="what the current files change against the chain")
    p_diff.add_argument("--dsn", default=os.environ.get("PYALK_DEV_DSN"), help=dsn_help)
    p_new = sub.add_parser("new", help="the next version file, its Alembic revision and its pin")
    p_new.add_argument("name")
    p_new.add_argument("--from-diff", action="store_true", help="fill the version file with diff's output")
    p_new.add_argument("--dsn", default=os.environ.get("PYALK_DEV_DSN"), help=dsn_help)
    p_pin = sub.add_parser("pin", help="refresh the pins of versions not yet on main")
    p_pin.add_argument("--base", default="main")
    sub.add_parser("check", help="the pins and the Alembic revisions match sql/versions (no database)")
    args = parser.parse_args(argv)
    if args.command == "check":
        problems = manifest_problems()
        print("\n".join(problems) or "sql/versions, its pins and alembic/versions agree")
        return 1 if problems else 0
    if args.command == "pin":
        print("\n".join(pin(args.base)) or "the pins are current")
        return 0
    if args.command == "new" and not args.from_diff:
        print(new_version(args.name, "-- CREATE OR REPLACE FUNCTION ... and ALTER TABLE ... here."))
        return 0
    if not args.dsn:
        parser.error("--dsn or PYALK_DEV_DSN is needed")
    found = diff(args.dsn)
    if args.command == "diff":
        print(render_diff(found) if not found.empty() else "-- the current files and the chain agree")
        return 1 if not found.empty() else 0
    if found.empty():
        raise SystemExit("nothing to write: the current files and the chain agree")
    print(new_version(args.name, render_diff(found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
