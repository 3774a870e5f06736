"""graphile-worker (npm): runs graphile_worker.cjs under Node with the
package installed in ``--node-modules`` (bench/README.md says how)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

from bench.peers.common import Args, PeerResult, PeerUnavailable, main

SCRIPT = Path(__file__).resolve().parent / "graphile_worker.cjs"


async def run(args: Args) -> PeerResult:
    node = shutil.which("node")
    if not node:
        raise PeerUnavailable("node is not on PATH")
    module = Path(args.node_modules or "node_modules") / "graphile-worker"
    if not (module / "package.json").exists():
        raise PeerUnavailable(f"graphile-worker is not installed under {module.parent}")
    env = dict(os.environ, GRAPHILE_WORKER_MODULE=str(module.resolve()), NO_LOG_SUCCESS="1")
    proc = await asyncio.create_subprocess_exec(
        node,
        str(SCRIPT),
        args.url,
        str(args.jobs),
        str(args.concurrency),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"graphile-worker runner failed ({proc.returncode}): {err.decode()[-3000:]}")
    line = [ln for ln in out.decode().splitlines() if ln.startswith("{")][-1]
    data = json.loads(line)
    return PeerResult(
        peer=data["peer"],
        version=data["version"],
        jobs=data["jobs"],
        concurrency=data["concurrency"],
        enqueue_s=data["enqueue_s"],
        process_s=data["process_s"],
        processed=data["processed"],
        settings=data["settings"],
    )


if __name__ == "__main__":
    main(run)
