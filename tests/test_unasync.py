"""tools/unasync.py, the translator itself: code is rewritten, strings and
comments are not (docstrings follow their one documented rule)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_unasync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "tools" / "unasync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


unasync = load_unasync()


def translate(source: str) -> str:
    return str(unasync.translate(textwrap.dedent(source)))


def test_async_keywords_become_plain_and_await_is_dropped():
    source = """\
        async def run(alk: AsyncAlk) -> None:
            async with alk.try_lock("n", "o", ttl=5) as lock:
                async for event in alk.stream("s").subscribe("c"):
                    await lock.renew()
            value = await (await alk.queue("q")).enqueue(1)
    """
    assert translate(source) == textwrap.dedent("""\
        def run(alk: Alk) -> None:
            with alk.try_lock("n", "o", ttl=5) as lock:
                for event in alk.stream("s").subscribe("c"):
                    lock.renew()
            value = (alk.queue("q")).enqueue(1)
    """)


def test_names_modules_and_asyncio_map_to_their_sync_twins():
    source = """\
        import asyncio
        from collections.abc import AsyncIterator, Awaitable
        from contextlib import asynccontextmanager

        from pyalk._async.queue import AsyncJobHandle, AsyncQueue
        from tests.wrapper._async import test_queue

        Handler = Callable[[AsyncJobHandle], Awaitable[dict[str, int]]] | None


        class Sub:
            async def __aenter__(self) -> Sub: ...
            async def __aexit__(self, *exc: object) -> None: ...
            def __aiter__(self) -> AsyncIterator[int]: ...
            async def __anext__(self) -> int:
                raise StopAsyncIteration
            async def aclose(self) -> None:
                self.lock = asyncio.Lock()
                self.event = asyncio.Event()
                await asyncio.sleep(0.1)
    """
    assert translate(source) == textwrap.dedent("""\
        import threading
        import time
        from collections.abc import Iterator, Awaitable
        from contextlib import contextmanager

        from pyalk._sync.queue import JobHandle, Queue
        from tests.wrapper._sync import test_queue

        Handler = Callable[[JobHandle], dict[str, int]] | None


        class Sub:
            def __enter__(self) -> Sub: ...
            def __exit__(self, *exc: object) -> None: ...
            def __iter__(self) -> Iterator[int]: ...
            def __next__(self) -> int:
                raise StopIteration
            def close(self) -> None:
                self.lock = threading.Lock()
                self.event = threading.Event()
                time.sleep(0.1)
    """)


def test_strings_and_comments_survive_untouched():
    source = """\
        def f(adb: object) -> str:
            # await the AsyncAlk: async with pyalk._async, then aclose
            x = "await AsyncAlk async with pyalk._async aclose"  # AsyncQueue await
            return f"AsyncAlk {x} await " + 'async for' + \"\"\"AsyncStream\"\"\"
    """
    assert translate(source) == textwrap.dedent("""\
        def f(db_conn: object) -> str:
            # await the AsyncAlk: async with pyalk._async, then aclose
            x = "await AsyncAlk async with pyalk._async aclose"  # AsyncQueue await
            return f"AsyncAlk {x} await " + 'async for' + \"\"\"AsyncStream\"\"\"
    """)


def test_docstrings_name_the_sync_api():
    source = '''\
        """Module: see :class:`AsyncAlk` and :func:`pyalk._async.schedule.run`."""


        class AsyncSubscription:
            """Use ``async with s as events: async for e in events: ...``, then
            ``await s.aclose()``; a :class:`~pyalk.AsyncWorker` (not AsyncAlkish)."""

            x = "a plain string naming AsyncAlk stays"
    '''
    assert translate(source) == textwrap.dedent('''\
        """Module: see :class:`Alk` and :func:`pyalk._sync.schedule.run`."""


        class Subscription:
            """Use ``with s as events: for e in events: ...``, then
            ``s.close()``; a :class:`~pyalk.Worker` (not AsyncAlkish)."""

            x = "a plain string naming AsyncAlk stays"
    ''')


def test_an_async_name_without_a_twin_is_refused():
    with pytest.raises(unasync.UnknownAsyncName, match="AsyncGizmo"):
        translate("x: AsyncGizmo\n")
    with pytest.raises(unasync.UnknownAsyncName, match=r"asyncio\.gather"):
        translate("import asyncio\nasyncio.gather()\n")


def test_check_names_the_stale_files_and_exits_1(tmp_path, monkeypatch, capsys):
    source_dir, target_dir = tmp_path / "_async", tmp_path / "_sync"
    source_dir.mkdir()
    (source_dir / "mod.py").write_text("async def f() -> None:\n    await g()\n")
    monkeypatch.setattr(unasync, "ROOT", tmp_path)
    monkeypatch.setattr(unasync, "PAIRS", [(source_dir, target_dir)])

    assert unasync.main(["--check"]) == 1
    assert capsys.readouterr().out == "stale: _sync/mod.py\n"
    assert not target_dir.exists()

    assert unasync.main([]) == 0
    assert capsys.readouterr().out == "wrote: _sync/mod.py\n"
    assert (target_dir / "mod.py").read_text() == (
        "# Generated by tools/unasync.py from _async/mod.py: edit that file, not this one.\ndef f() -> None:\n    g()\n"
    )
    assert unasync.main(["--check"]) == 0
    assert capsys.readouterr().out == ""


def test_sub_packages_are_generated_in_place_and_orphans_removed(tmp_path, monkeypatch, capsys):
    source_dir, target_dir = tmp_path / "_async", tmp_path / "_sync"
    (source_dir / "part").mkdir(parents=True)
    (source_dir / "part" / "__init__.py").write_text("from pkg._async.part.inner import AsyncAlk\n")
    (source_dir / "part" / "inner.py").write_text("async def f(alk: AsyncAlk) -> None:\n    await alk.close()\n")
    target_dir.mkdir()
    header = "# Generated by tools/unasync.py from {}: edit that file, not this one.\n"
    (target_dir / "moved.py").write_text(header.format("_async/moved.py") + "x = 1\n")
    (target_dir / "handwritten.py").write_text("y = 2\n")  # not generated: never removed
    monkeypatch.setattr(unasync, "ROOT", tmp_path)
    monkeypatch.setattr(unasync, "PAIRS", [(source_dir, target_dir)])
    monkeypatch.setattr(unasync, "MODULES", {("pkg", "_async"): "_sync"})

    assert unasync.main(["--check"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "stale: _sync/part/__init__.py", "stale: _sync/part/inner.py", "orphan: _sync/moved.py"]

    assert unasync.main([]) == 0
    capsys.readouterr()
    assert (target_dir / "part" / "__init__.py").read_text() == (
        header.format("_async/part/__init__.py") + "from pkg._sync.part.inner import Alk\n")
    assert (target_dir / "part" / "inner.py").read_text() == (
        header.format("_async/part/inner.py") + "def f(alk: Alk) -> None:\n    alk.close()\n")
    assert not (target_dir / "moved.py").exists()
    assert (target_dir / "handwritten.py").exists()
    assert unasync.main(["--check"]) == 0
