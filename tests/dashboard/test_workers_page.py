"""The workers page: the registry as alk.workers() returns it (states, hosts,
"3s ago"), every value escaped, the count on each queue's page, and the Stop
action: POST with the CSRF token, offered only to a role that may execute
alk.request_stop, refused otherwise with nothing written."""

from __future__ import annotations

import html
import re
from urllib.parse import quote, urlencode

import psycopg
from markupsafe import escape
from psycopg import sql
from starlette.testclient import TestClient

from pyalk.dashboard import create_app, security
from tests.dashboard.conftest import GONE, HOSTILE, WORKERS
from tests.dashboard.test_actions import csrf_of
from tests.dashboard.test_pages import assert_escaped

ROW = re.compile(r'<tr data-worker="([^"]*)" data-state="(\w+)">(.*?)</tr>', re.S)
STOP = re.compile(r'<form method="post" action="/actions/stop".*?</form>', re.S)


def rows(body: str) -> dict[str, tuple[str, str]]:
    """worker id -> (state, the row's cells), as the page shows them."""
    return {html.unescape(worker_id): (state, cells) for worker_id, state, cells in ROW.findall(body)}


def stopping(db: psycopg.Connection) -> dict[str, bool]:
    return dict(db.execute("SELECT worker_id, stopping FROM alk.workers()").fetchall())


def stop(client: TestClient, csrf: str | None, worker_id: str, **headers: str) -> object:
    data = {"queue": WORKERS[worker_id][0], "worker_id": worker_id, "next": "/workers"}
    if csrf is not None:
        data["csrf"] = csrf
    return client.post("/actions/stop", data=data, headers=headers, follow_redirects=False)


def test_the_workers_page_lists_every_worker_with_its_state(client, registered):
    assert 'href="/workers"' in client.get("/").text  # linked from the overview's header
    response = client.get("/workers")
    assert response.status_code == 200
    body = response.text
    assert_escaped(body)
    shown = rows(body)
    assert list(shown) == sorted(WORKERS)  # alk.workers()' order: by worker_id
    assert {worker_id: state for worker_id, (state, _) in shown.items()} == {
        "emails-1": "running", "emails-2": "running", HOSTILE: "running", GONE: "gone"}
    cells = shown["emails-1"][1]
    assert "web-3:4242" in cells and '<td class="n" title="jobs held at the last beat / concurrency">3/8</td>' in cells
    assert re.search(r'<td class="seen" title="[^"]+">\ds ago</td>', cells)
    assert "pyalk 0.9" in cells and '<a href="/queue?name=emails">emails</a>' in cells
    assert re.search(r'<td class="seen" title="[^"]+">2m 0\ds ago</td>', shown[GONE][1])
    hostile = shown[HOSTILE][1]
    assert f"<code>{escape(HOSTILE)}</code>" in hostile and f"{escape(HOSTILE)}:1" in hostile
    assert str(escape("<b>x</b>")) in hostile
    assert "4 registered: 3 running, 0 stopping, 1 gone" in body
    assert len(STOP.findall(body)) == 4  # the owner may stop any of them
    assert 'hx-get="/fragments/workers"' in body
    fragment = client.get("/fragments/workers")
    assert fragment.status_code == 200 and "<html" not in fragment.text and rows(fragment.text).keys() == shown.keys()


def test_the_workers_page_of_one_queue(client, registered):
    body = client.get(f"/workers?queue={quote(HOSTILE)}").text
    assert_escaped(body)
    assert list(rows(body)) == [HOSTILE]
    assert f'hx-get="{escape("/fragments/workers?" + urlencode({"queue": HOSTILE}))}"' in body
    assert "No worker is registered for this queue" in client.get("/workers?queue=nobody").text


def test_each_queue_page_says_how_many_workers_serve_it(client, db, registered):
    line = re.compile(r'<p class="served"><a href="/workers\?queue=([^"]*)">Workers</a> on this queue: '
                      r"(\d+) running, (\d+) stopping, (\d+) gone</p>")
    assert line.findall(client.get("/queue?name=emails").text) == [("emails", "2", "0", "0")]
    assert line.findall(client.get("/fragments/queue?name=reports").text) == [("reports", "0", "0", "1")]
    assert db.execute("SELECT alk.request_stop('emails-2')").fetchone() == (True,)
    assert line.findall(client.get("/queue?name=emails").text) == [("emails", "1", "1", "0")]
    hostile = client.get(f"/queue?name={quote(HOSTILE)}").text
    assert_escaped(hostile)
    assert line.findall(hostile)[0][1:] == ("1", "0", "0")
    assert line.findall(client.get("/queue?name=idle").text) == [("idle", "0", "0", "0")]


def test_stop_with_the_csrf_token_notifies_the_worker_and_shows_it_stopping(client, db, dsn, registered):
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(registered.channels[HOSTILE])))
        response = stop(client, csrf_of(client, "/workers"), HOSTILE)
        assert response.status_code == 303
        assert response.headers["location"] == "/workers?msg=asked+the+worker+to+stop"
        heard = list(listener.notifies(timeout=10, stop_after=1))
    assert [(n.channel, n.payload) for n in heard] == [(registered.channels[HOSTILE], "stop")]
    assert stopping(db) == {"emails-1": False, "emails-2": False, HOSTILE: True, GONE: False}
    body = client.get("/workers?msg=asked+the+worker+to+stop").text
    assert '<p class="flash" role="status">asked the worker to stop</p>' in body
    shown = rows(body)
    assert shown[HOSTILE][0] == "stopping" and not STOP.search(shown[HOSTILE][1])  # asked once: no second button
    assert STOP.search(shown["emails-1"][1])


def test_stop_of_a_worker_that_is_not_registered(client, db, registered):
    token = csrf_of(client, "/workers")
    response = client.post("/actions/stop", data={"csrf": token, "queue": "emails", "worker_id": "nobody"},
                           follow_redirects=False)
    assert response.status_code == 303 and "nothing+to+stop" in response.headers["location"]
    # The worker's queue routes the call: the right id under another queue is not found.
    wrong_queue = client.post("/actions/stop", data={"csrf": token, "queue": "reports", "worker_id": "emails-1"},
                              follow_redirects=False)
    assert "nothing+to+stop" in wrong_queue.headers["location"]
    missing = client.post("/actions/stop", data={"csrf": token, "queue": "emails"}, follow_redirects=False)
    assert missing.status_code == 400 and "worker_id is required" in missing.text
    assert not any(stopping(db).values())


def test_stop_without_a_valid_csrf_token_is_refused_and_writes_nothing(client, db, registered):
    token = csrf_of(client, "/workers")
    assert stop(client, None, "emails-1").status_code == 403
    assert stop(client, "forged", "emails-1").status_code == 403
    assert stop(client, token, "emails-1", Origin="http://evil.example").status_code == 403
    fresh = TestClient(client.app, base_url="http://127.0.0.1")  # no cookie: the field alone proves nothing
    assert stop(fresh, token, "emails-1").status_code == 403
    assert client.get("/actions/stop").status_code == 405
    assert not any(stopping(db).values())


def test_a_reader_sees_the_workers_but_no_stop_button_and_a_forged_post_is_refused(db, registered, make_role):
    with TestClient(create_app(make_role("reader")), base_url="http://127.0.0.1") as client:
        body = client.get("/workers").text
        assert list(rows(body)) == sorted(WORKERS)
        assert not STOP.search(body) and ">Stop</button>" not in body
        # The form an admin's page holds, forged with this session's valid token (the
        # cookie the page set): it passes the CSRF check and the database says no.
        refused = stop(client, client.cookies[security.CSRF_COOKIE], "emails-1")
        assert refused.status_code == 403 and "may not" in refused.text
    assert not any(stopping(db).values())


def test_the_admin_role_may_stop(db, registered, make_role):
    with TestClient(create_app(make_role("admin")), base_url="http://127.0.0.1") as client:
        assert len(STOP.findall(client.get("/workers").text)) == 4
        assert stop(client, csrf_of(client, "/workers"), "emails-2").status_code == 303
    assert stopping(db)["emails-2"] is True


def test_read_only_mode_offers_no_stop_even_to_the_owner(db, seeded, registered):
    with TestClient(create_app(seeded.dsn, read_only=True), base_url="http://127.0.0.1") as client:
        body = client.get("/workers").text
        assert len(rows(body)) == 4 and not STOP.search(body)
        assert stop(client, client.cookies[security.CSRF_COOKIE], "emails-1").status_code == 403
    assert not any(stopping(db).values())


def test_a_role_that_may_not_read_the_registry_gets_a_page_that_says_so(db, registered, make_role):
    # docs/security.md's read-only recipe names its functions one by one; alk.workers() is not among them.
    viewer = make_role("viewer")
    with psycopg.connect(viewer) as conn:
        if conn.execute("SELECT has_function_privilege('alk.workers()', 'EXECUTE')").fetchone() == (True,):
            revoke = sql.SQL("REVOKE EXECUTE ON FUNCTION alk.workers() FROM {}")
            db.execute(revoke.format(sql.Identifier(conn.info.user)))
    with TestClient(create_app(viewer), base_url="http://127.0.0.1") as client:
        page = client.get("/workers")
        assert page.status_code == 200 and "may not read the registry of workers" in page.text
        queue = client.get("/queue?name=emails")
        assert queue.status_code == 200 and 'class="served"' not in queue.text
