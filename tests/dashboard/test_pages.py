"""The dashboard's pages over a seeded database: what they show, that every
value is escaped, that big payloads are cut with a way to the whole, and
that the job browser pages by keyset in claim order."""

from __future__ import annotations

import html
import re
from urllib.parse import quote

from markupsafe import escape
from starlette.testclient import TestClient

from pyalk import Alk, JobHandle, PermanentError
from pyalk.dashboard import create_app
from tests.dashboard.conftest import BIG, HOSTILE


def assert_escaped(body: str) -> None:
    assert "<script>alert" not in body
    assert "<img src=x" not in body
    assert "<b>x</b>" not in body


def test_overview_shows_queues_streams_schedules_locks_and_throughput(client):
    response = client.get("/")
    assert response.status_code == 200
    body = response.text
    assert_escaped(body)
    assert str(escape(HOSTILE)) in body  # the name is shown, as text
    row = re.search(r'<tr data-queue="emails">(.*?)</tr>', body, re.S)
    assert row
    cells = row.group(1)
    assert '<td class="n ready">28</td>' in cells and '<td class="n scheduled">1</td>' in cells
    assert '<td class="n processing">2' in cells
    assert "<svg" in cells and "acked in the last hour" in cells
    assert re.search(r"\d+ acked in the last hour", cells)
    assert 'hx-get="/fragments/overview"' in body and 'hx-trigger="every' in body
    assert '<script src="/static/htmx.min.js"' in body
    assert "orders" in body and "@every 5m" in body
    fragment = client.get("/fragments/overview")
    assert fragment.status_code == 200 and "<html" not in fragment.text and "emails" in fragment.text


def test_counts_past_the_exact_limit_are_shown_as_estimates(seeded, db):
    db.execute("ANALYZE alk.jobs")  # what autovacuum does: the estimates read these statistics
    with TestClient(create_app(seeded.dsn, exact_limit=5), base_url="http://127.0.0.1") as client:
        for page in ("/", "/queue?name=emails"):
            body = client.get(page).text
            # emails holds 28 ready jobs: past 5, an estimate, marked and explained; its 1 scheduled job is exact.
            estimate = re.search(r'<span class="estimate" title="([^"]*)">≈([\d,]+)</span>', body)
            assert estimate, page
            assert "not exact" in estimate.group(1) and int(estimate.group(2).replace(",", "")) >= 6
            assert re.search(r'class="[^"]*scheduled[^"]*">1<', body), page
    with TestClient(create_app(seeded.dsn, exact_limit=None), base_url="http://127.0.0.1") as client:
        body = client.get("/").text
        assert '<td class="n ready">28</td>' in body and "estimate" not in body


def test_the_overview_chart_draws_what_a_worker_settled(client, dsn):
    queue = "charted"
    with Alk(dsn) as alk:
        alk.queue(queue).enqueue_batch(list(range(25)))

        def handler(job: JobHandle) -> None:
            if job.payload % 5 == 0:
                raise PermanentError("every fifth")

        counts = alk.worker(queue, handler, burst=True, handle_signals=False).run()
    assert (counts.acked, counts.failed) == (20, 5)
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', client.get("/").text, re.S)
    assert row
    cells = row.group(1)
    assert 'aria-label="20 acked in the last hour"' in cells
    assert '<rect class="ok"' in cells and '<rect class="bad"' in cells  # bars, the dead stacked in red
    # Every bar's tooltip: the worker's settles, in the minute(s) they happened.
    bars = [tuple(map(int, m)) for m in re.findall(r"<title>\d\d:\d\d: (\d+) acked, (\d+) retried, (\d+) dead</title>",
                                                   cells)]
    assert len(bars) == 61 and tuple(map(sum, zip(*bars, strict=True))) == (20, 0, 5)


def test_pages_forbid_scripts_from_anywhere_else(client):
    response = client.get("/")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert response.headers["x-frame-options"] == "DENY"
    assert client.get("/static/htmx.min.js").status_code == 200


def test_queue_page_pages_by_keyset_in_claim_order(client, db):
    db.execute("SELECT alk.enqueue('emails', '{\"urgent\": 1}', priority => 5)")
    expected = [r[0] for r in db.execute(
        "SELECT id FROM alk.list_jobs('emails', 'pending', 1000) ORDER BY priority DESC, run_at, id")]
    seen: list[int] = []
    url: str | None = "/queue?name=emails&state=pending"
    pages = 0
    while url:
        body = client.get(url).text
        seen += [int(i) for i in re.findall(r'<a href="/job\?queue=emails&amp;id=(\d+)">', body)]
        found = re.search(r'<a rel="next" href="([^"]+)">', body)
        url = html.unescape(found.group(1)) if found else None
        pages += 1
        assert pages < 10
    assert seen == expected
    assert "OFFSET" not in (url or "")
    assert seen[0] == expected[0] and len(seen) == 30  # 28 ready, 1 scheduled, 1 urgent


def test_queue_page_for_a_hostile_name_and_its_dead_job(client, seeded):
    body = client.get(f"/queue?name={quote(HOSTILE)}&state=dead").text
    assert_escaped(body)
    assert f"id={seeded.dead_id}" in body
    assert str(escape("<img src=x onerror=alert(3)>")) in body
    job = client.get(f"/job?queue={quote(HOSTILE)}&id={seeded.dead_id}")
    assert job.status_code == 200
    assert_escaped(job.text)
    assert str(escape('"x": "<script>alert(2)</script>"')) in job.text  # pretty-printed, escaped
    for column in ("visibility_timeout_s", "backoff_base_s", "dead_letter_retention_s", "claim_expires_at", "died_at"):
        assert f"<th>{column}</th>" in job.text


def test_a_1mb_payload_is_cut_on_the_page_and_whole_behind_a_link(client, seeded):
    listing = client.get("/queue?name=reports&state=dead").text
    assert len(listing) < 60_000
    assert f"({BIG + 12} bytes)" in listing
    page = client.get(f"/job?queue=reports&id={seeded.big_id}")
    assert 60_000 < len(page.text) < 200_000
    link = re.search(r'<a href="(/job/payload\?[^"]+)">Show all</a>', page.text)
    assert link
    whole = client.get(html.unescape(link.group(1)))
    assert whole.status_code == 200 and whole.headers["content-type"].startswith("text/plain")
    assert whole.headers["x-content-type-options"] == "nosniff"
    assert len(whole.text) > BIG and "x" * BIG in whole.text


def test_stream_page_events_consumers_and_paging(client):
    body = client.get(f"/stream?name={quote(HOSTILE)}").text
    assert_escaped(body)
    offsets = [int(o) for o in re.findall(r'<tr><td class="n">(\d+)</td><td>k', body)]
    assert offsets == list(range(75, 25, -1))
    assert re.search(r'<td class="n warn">15</td>', body)  # the consumer's lag: 75 - 60
    older = re.search(r'<a rel="next" href="([^"]+)">', body)
    assert older
    rest = client.get(html.unescape(older.group(1))).text
    assert [int(o) for o in re.findall(r'<tr><td class="n">(\d+)</td><td>k', rest)] == list(range(25, 0, -1))
    big = client.get("/stream?name=orders").text
    link = re.search(r'<a href="(/event/payload\?[^"]+)">all (\d+) bytes</a>', big)
    assert link and int(link.group(2)) == BIG + 12
    assert "y" * BIG in client.get(html.unescape(link.group(1))).text


def test_bad_requests_are_400_with_the_reason_and_missing_jobs_404(client):
    bad = client.get("/queue?name=emails&state=<b>")
    assert bad.status_code == 400 and "state must be one of" in bad.text
    assert bad.headers["content-type"].startswith("text/plain")
    assert client.get("/queue").status_code == 400
    assert client.get("/job?queue=emails&id=x").status_code == 400
    assert client.get("/queue?name=emails&after=1,2").status_code == 400
    assert client.get("/job?queue=emails&id=987654").status_code == 404
    assert client.get("/queue?name=").status_code == 400


def test_a_completed_job_is_listed_and_shows_its_result_and_headers_escaped(client, db):
    db.execute("SELECT alk.set_queue_retention(%s, 3600)", [HOSTILE])
    job_id = db.execute("SELECT alk.enqueue(%s, '{\"n\": 1}', headers => %s::jsonb)",
                        [HOSTILE, '{"traceparent": "<b>x</b>"}']).fetchone()[0]  # type: ignore[index]
    db.execute("SELECT alk.claim(%s, 'w1', 1)", [HOSTILE])
    assert db.execute("SELECT alk.ack(%s, 'w1', 1, %s, %s::jsonb)",
                      [job_id, HOSTILE, '{"html": "<script>alert(9)</script>"}']).fetchone()[0]  # type: ignore[index]
    listing = client.get(f"/queue?name={quote(HOSTILE)}&state=completed")
    assert listing.status_code == 200
    assert_escaped(listing.text)
    assert f"id={job_id}" in listing.text
    page = client.get(f"/job?queue={quote(HOSTILE)}&id={job_id}")
    assert page.status_code == 200
    assert "<script>alert(9)" not in page.text
    assert_escaped(page.text)
    result = re.search(r'<pre class="json" id="job-result">(.*?)</pre>', page.text, re.S)
    assert result and html.unescape(result.group(1)) == '{\n  "html": "<script>alert(9)</script>"\n}'
    headers = re.search(r'<pre class="json" id="job-headers">(.*?)</pre>', page.text, re.S)
    assert headers and html.unescape(headers.group(1)) == '{\n  "traceparent": "<b>x</b>"\n}'
    assert '<span class="pill ok" id="job-state">completed</span>' in page.text
    assert "<th>completed_at</th>" in page.text
    assert "Cancel this job" not in page.text and "Requeue this job" not in page.text
