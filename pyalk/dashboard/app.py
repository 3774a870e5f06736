"""The dashboard's ASGI app: pages, htmx fragments, actions and /metrics
(docs/dashboard.md). Every value reaches the page through Jinja2's
autoescaping; every action is a POST carrying the CSRF token."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import psycopg
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pyalk.dashboard import charts, security
from pyalk.dashboard.data import ACTIONS, EXACT_LIMIT, Data, JobKey, make_pool
from pyalk.dashboard.metrics import QueueMetrics

STATES = ("pending", "processing", "dead", "completed")
PAGE_SIZE = 50
#: How much of a payload a page shows before offering the whole of it.
PAYLOAD_SHOWN = 64 * 1024
#: Seconds between the htmx refreshes of the live parts.
REFRESH_S = 2


def _stamp(at: int | None) -> str:
    if at is None:
        return "—"
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(at)


def _span(seconds: int | None) -> str:
    if seconds is None:
        return "—"
    sign, s = ("-" if seconds < 0 else ""), abs(int(seconds))
    if s < 60:
        return f"{sign}{s}s"
    if s < 3600:
        return f"{sign}{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{sign}{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{sign}{s // 86400}d {s % 86400 // 3600:02d}h"


def _approx(value: int) -> str:
    """An estimate to three significant digits: 81302 -> 81,300."""
    digits = len(str(abs(value)))
    return f"{round(value, min(0, 3 - digits)):,}"


#: A worker's state as the pages show it, from alk.workers()' flags: gone
#: (silent past the SQL's bound, whatever it was asked) over stopping (asked
#: to stop) over running.
WORKER_STATES = ("running", "stopping", "gone")


def _worker_state(worker: dict[str, Any]) -> str:
    return "gone" if worker["gone"] else "stopping" if worker["stopping"] else "running"


def _worker_counts(workers: Iterable[dict[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(WORKER_STATES, 0)
    for worker in workers:
        counts[_worker_state(worker)] += 1
    return counts


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("pyalk.dashboard", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.filters["stamp"] = _stamp
    env.filters["span"] = _span
    env.filters["approx"] = _approx
    env.filters["worker_state"] = _worker_state
    env.filters["worker_counts"] = _worker_counts
    env.globals["chart"] = charts.throughput_svg
    env.globals["refresh_s"] = REFRESH_S
    return env


def _int(value: str | None, what: str) -> int:
    try:
        return int(value or "")
    except ValueError:
        raise BadRequest(f"{what} must be an integer, got {value!r}") from None


def _required(value: str | None, what: str) -> str:
    if not value:
        raise BadRequest(f"{what} is required")
    return value


class BadRequest(Exception):
    """A request the dashboard cannot answer: 400 with the message."""


def _safe_next(target: str | None) -> str:
    # Only a path of this site: never an absolute or scheme-relative URL.
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/"


def _pretty(payload: Any) -> str:
    return json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=False)


class Dashboard:
    """The handlers, over one Data and one template environment."""

    def __init__(self, data: Data, metrics: QueueMetrics, read_only: bool) -> None:
        self.data = data
        self.metrics = metrics
        self.read_only = read_only
        self.env = _environment()
        self.env.globals["exact_limit"] = data.exact_limit

    async def _render(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        token = request.cookies.get(security.CSRF_COOKIE) or security.new_csrf_token()
        allowed = dict.fromkeys(ACTIONS, False)
        if not self.read_only:
            allowed = await self.data.allowed()
        html = self.env.get_template(template).render(
            csrf=token, csrf_field=security.CSRF_FIELD, allowed=allowed, path=request.url.path,
            here=str(request.url.path) + (f"?{request.url.query}" if request.url.query else ""),
            message=request.query_params.get("msg"), **context)
        response = HTMLResponse(html, status_code=status)
        if request.cookies.get(security.CSRF_COOKIE) != token:
            response.set_cookie(security.CSRF_COOKIE, token, httponly=True, samesite="strict", path="/")
        return response

    # pages -------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        return await self._render(request, "overview.html", view=await self.data.overview())

    async def overview_fragment(self, request: Request) -> Response:
        return await self._render(request, "_overview.html", view=await self.data.overview())

    async def _queue_context(self, request: Request) -> dict[str, Any]:
        name = _required(request.query_params.get("name"), "name")
        state = request.query_params.get("state") or "pending"
        if state not in STATES:
            raise BadRequest(f"state must be one of {', '.join(STATES)}, got {state!r}")
        after = None
        if request.query_params.get("after"):
            parts = request.query_params["after"].split(",")
            if len(parts) != 3:
                raise BadRequest("after must be priority,run_at,id")
            after = JobKey(_int(parts[0], "after"), _int(parts[1], "after"), _int(parts[2], "after"))
        jobs = await self.data.jobs(name, state, PAGE_SIZE + 1, after)
        more = len(jobs) > PAGE_SIZE
        jobs = jobs[:PAGE_SIZE]
        next_page = None
        if more:
            last = jobs[-1]
            next_page = "/queue?" + urlencode({"name": name, "state": state,
                                               "after": f"{last['priority']},{last['run_at']},{last['id']}"})
        return {"name": name, "state": state, "states": STATES, "jobs": jobs, "next_page": next_page,
                "stats": await self.data.queue(name), "throughput": await self.data.throughput(name),
                "workers": await self.data.workers(), "now": await self.data.now(), "first_page": after is None,
                "first_url": "/queue?" + urlencode({"name": name, "state": state}),
                "page_url": "/queue?" + urlencode({"name": name, "state": state})}

    async def queue(self, request: Request) -> Response:
        return await self._render(request, "queue.html", **await self._queue_context(request))

    async def queue_fragment(self, request: Request) -> Response:
        return await self._render(request, "_queue_stats.html", **await self._queue_context(request))

    async def job(self, request: Request) -> Response:
        queue = _required(request.query_params.get("queue"), "queue")
        job_id = _int(request.query_params.get("id"), "id")
        job = await self.data.job(queue, job_id)
        if job is None:
            return await self._render(request, "missing.html", status=404, what=f"job {job_id} in queue", name=queue,
                                      back="/queue?" + urlencode({"name": queue}))
        pretty = _pretty(job["payload"])
        return await self._render(request, "job.html", job=job, queue=queue, now=await self.data.now(),
                                  payload=pretty[:PAYLOAD_SHOWN], payload_chars=len(pretty),
                                  result=_pretty(job.get("result")), headers=_pretty(job.get("headers")),
                                  cut=len(pretty) > PAYLOAD_SHOWN,
                                  full_url="/job/payload?" + urlencode({"queue": queue, "id": job_id}))

    async def job_payload(self, request: Request) -> Response:
        queue = _required(request.query_params.get("queue"), "queue")
        job = await self.data.job(queue, _int(request.query_params.get("id"), "id"))
        if job is None:
            return PlainTextResponse("no such job", status_code=404)
        return _json_text(job["payload"])

    async def stream(self, request: Request) -> Response:
        name = _required(request.query_params.get("name"), "name")
        before = request.query_params.get("before")
        before_offset = _int(before, "before") if before else None
        events = await self.data.events(name, before_offset, PAGE_SIZE + 1)
        more = len(events) > PAGE_SIZE
        events = events[:PAGE_SIZE]
        older = ("/stream?" + urlencode({"name": name, "before": events[-1]["event_offset"]})) if more else None
        return await self._render(request, "stream.html", name=name, stats=await self.data.stream(name),
                                  events=events, older=older, consumers=await self.data.consumers(name),
                                  now=await self.data.now(), first_page=before_offset is None,
                                  first_url="/stream?" + urlencode({"name": name}))

    async def event_payload(self, request: Request) -> Response:
        stream = _required(request.query_params.get("stream"), "stream")
        event = await self.data.event(stream, _int(request.query_params.get("offset"), "offset"))
        if event is None:
            return PlainTextResponse("no such event", status_code=404)
        return _json_text(event["payload"])

    async def _workers_context(self, request: Request) -> dict[str, Any]:
        queue = request.query_params.get("queue") or None
        workers = await self.data.workers()
        if workers is not None and queue is not None:
            workers = [w for w in workers if w["queue"] == queue]
        return {"workers": workers, "queue": queue, "now": await self.data.now(),
                "page_url": "/workers" + (f"?{urlencode({'queue': queue})}" if queue else ""),
                "fragment_url": "/fragments/workers" + (f"?{urlencode({'queue': queue})}" if queue else "")}

    async def workers(self, request: Request) -> Response:
        return await self._render(request, "workers.html", **await self._workers_context(request))

    async def workers_fragment(self, request: Request) -> Response:
        return await self._render(request, "_workers.html", **await self._workers_context(request))

    async def metrics_page(self, request: Request) -> Response:
        body = await run_in_threadpool(self.metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    # actions -----------------------------------------------------------------

    async def action(self, request: Request) -> Response:
        if self.read_only:
            return PlainTextResponse("the dashboard is read-only", status_code=403)
        form = await request.form()
        field = form.get(security.CSRF_FIELD)
        if not security.same_origin(request.headers) or not security.csrf_ok(
                request.cookies.get(security.CSRF_COOKIE), field if isinstance(field, str) else None):
            return PlainTextResponse("CSRF check failed: reload the page and try again", status_code=403)
        name = request.path_params["name"]
        queue = _required(_text(form.get("queue")), "queue")
        target = _safe_next(_text(form.get("next")))
        job_text = _text(form.get("job_id"))
        done: Callable[[], Awaitable[str]]
        if name == "requeue":
            async def done() -> str:
                moved = await self.data.requeue(queue, [_int(job_text, "job_id")] if job_text else None)
                return f"requeued {moved} dead job{'s' if moved != 1 else ''}"
        elif name == "cancel":
            async def done() -> str:
                gone = await self.data.cancel(queue, _int(job_text, "job_id"))
                return "cancelled" if gone else "nothing cancelled: the job is gone or dead"
        elif name in ("pause", "resume"):
            async def done() -> str:
                changed = await (self.data.pause(queue) if name == "pause" else self.data.resume(queue))
                return f"{name}d" if changed else f"already {name}d"
        elif name == "stop":
            worker_id = _required(_text(form.get("worker_id")), "worker_id")

            async def done() -> str:
                asked = await self.data.stop(worker_id, queue)
                return "asked the worker to stop" if asked else "nothing to stop: the worker is not registered"
        else:
            return PlainTextResponse("no such action", status_code=404)
        try:
            message = await done()
        except psycopg.errors.InsufficientPrivilege:
            return PlainTextResponse(f"{name}: this role may not do that", status_code=403)
        separator = "&" if "?" in target else "?"
        return RedirectResponse(target + separator + urlencode({"msg": message}), status_code=303)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _json_text(payload: Any) -> Response:
    # Plain text (nosniff comes with every response): never rendered as HTML.
    return Response(_pretty(payload), media_type="text/plain; charset=utf-8")


def _handled(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Bad input and pyalk's own errors as a 400 with the message."""
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except BadRequest as error:
            return PlainTextResponse(str(error), status_code=400)
        except psycopg.Error as error:
            if error.sqlstate and error.sqlstate.startswith("LK"):
                return PlainTextResponse(error.diag.message_primary or str(error), status_code=400)
            raise
    return run


class _SecurityHeaders:
    """Pages load nothing from elsewhere and cannot be framed."""

    POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
              "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(b"content-security-policy", self.POLICY.encode()),
                            (b"x-frame-options", b"DENY"), (b"referrer-policy", b"same-origin"),
                            (b"x-content-type-options", b"nosniff")]
                message = {**message, "headers": headers}
            await send(message)
        await self.app(scope, receive, with_headers)


def create_app(conninfo: str, *, token: str | None = None, read_only: bool = False,
               exact_limit: int | None = EXACT_LIMIT) -> Starlette:
    """The dashboard on the database at ``conninfo``. ``token``: require it
    (bearer or basic-auth password) on every request. ``read_only``: offer
    no actions whatever the role may do. ``exact_limit``: counts past it are
    estimates (None: every count exact, at a cost linear in the jobs)."""
    pool = make_pool(conninfo)
    metrics = QueueMetrics(conninfo)
    board = Dashboard(Data(pool, exact_limit), metrics, read_only)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await pool.open()
        try:
            yield
        finally:
            await pool.close()
            metrics.close()

    routes = [
        Route("/", _handled(board.overview)),
        Route("/fragments/overview", _handled(board.overview_fragment)),
        Route("/queue", _handled(board.queue)),
        Route("/fragments/queue", _handled(board.queue_fragment)),
        Route("/job", _handled(board.job)),
        Route("/job/payload", _handled(board.job_payload)),
        Route("/stream", _handled(board.stream)),
        Route("/workers", _handled(board.workers)),
        Route("/fragments/workers", _handled(board.workers_fragment)),
        Route("/event/payload", _handled(board.event_payload)),
        Route("/metrics", board.metrics_page),
        Route("/actions/{name}", _handled(board.action), methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("pyalk.dashboard", "static")]), name="static"),
    ]
    middleware = [Middleware(_SecurityHeaders)]
    if token:
        middleware.append(Middleware(security.TokenAuth, token=token))
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
