"""Landed version files are immutable: sql/versions/MANIFEST pins each one's sha256."""

from __future__ import annotations

import hashlib

from pyalk.schema.install import versions
from pyalk.schema.resources import sql_dir

IMMUTABLE = "a landed version is immutable: write a new version file (docs/migrations.md, 'How to change a rule')"


def _manifest() -> dict[str, str]:
    """file name -> sha256, from sha256sum-style lines."""
    pinned = {}
    for line in (sql_dir() / "versions" / "MANIFEST").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split()
            pinned[name] = digest
    return pinned


def test_every_version_file_matches_its_manifest_line():
    pinned = _manifest()
    on_disk = {v.path.name: hashlib.sha256(v.path.read_bytes()).hexdigest() for v in versions()}
    changed = sorted(name for name in pinned.keys() & on_disk.keys() if pinned[name] != on_disk[name])
    assert not changed, f"{', '.join(changed)} changed: {IMMUTABLE}"
    unlisted = sorted(on_disk.keys() - pinned.keys())
    assert not unlisted, f"{', '.join(unlisted)} not in sql/versions/MANIFEST: run python tools/sqlversion.py new"
    missing = sorted(pinned.keys() - on_disk.keys())
    assert not missing, f"MANIFEST lists {', '.join(missing)}, which is gone: {IMMUTABLE}"
