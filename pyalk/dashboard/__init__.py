"""pyalk's web dashboard (docs/dashboard.md): ``pyalk dashboard --dsn ...``.

Needs the ``dashboard`` extra: ``pip install 'pyalk[dashboard]'``.
"""

from __future__ import annotations

from pyalk.dashboard.app import create_app

__all__ = ["create_app"]
