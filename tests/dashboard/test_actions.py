"""The dashboard's actions and who may take them: POST with a CSRF token
only, the read-only grants (actions shown disabled and refused) and the
admin grants (they work), and the optional token."""

from __future__ import annotations

import base64
import re
from urllib.parse import quote

import psycopg
import pytest
from starlette.testclient import TestClient

from pyalk.dashboard import create_app
from tests.dashboard.conftest import HOSTILE


def csrf_of(client: TestClient, url: str = "/queue?name=emails") -> str:
    body = client.get(url).text
    found = re.search(r'name="csrf" value="([^"]+)"', body)
    assert found
    return found.group(1)


def post(client: TestClient, action: str, csrf: str | None, **fields: object) -> object:
    data = {k: str(v) for k, v in fields.items()}
    if csrf is not None:
        data["csrf"] = csrf
    return client.post(f"/actions/{action}", data=data, follow_redirects=False)


def dead(db: psycopg.Connection, queue: str) -> int:
    return int(db.execute("SELECT dead FROM alk.queue_stats(%s)", [queue]).fetchone()[0])


def pause_available(db: psycopg.Connection) -> bool:
    return db.execute("SELECT to_regprocedure('alk.pause_queue(text)') IS NOT NULL").fetchone()[0]


def test_requeue_one_dead_job_with_the_csrf_token(client, db, seeded):
    token = csrf_of(client, f"/job?queue={quote(HOSTILE)}&id={seeded.dead_id}")
    response = post(client, "requeue", token, queue=HOSTILE, job_id=seeded.dead_id, next="/job?id=1")
    assert response.status_code == 303
    assert response.headers["location"].startswith("/job?id=1&msg=requeued+1+dead+job")
    assert dead(db, HOSTILE) == 0
    row = db.execute("SELECT state, attempts - attempts_refunded FROM alk.get_job(%s, %s)",
                     [HOSTILE, seeded.dead_id]).fetchone()
    assert row == ("pending", 0)  # every spent attempt refunded


def test_requeue_all_and_cancel(client, db, seeded):
    token = csrf_of(client)
    assert post(client, "requeue", token, queue="reports", next="/").status_code == 303
    assert dead(db, "reports") == 0
    job = db.execute("SELECT id FROM alk.list_jobs('emails', 'pending', 1)").fetchone()[0]
    response = post(client, "cancel", token, queue="emails", job_id=job, next="/queue?name=emails")
    assert response.status_code == 303 and "msg=cancelled" in response.headers["location"]
    assert db.execute("SELECT count(*) FROM alk.get_job('emails', %s)", [job]).fetchone()[0] == 0


def test_actions_without_the_token_or_from_another_site_are_refused(client, db, seeded):
    token = csrf_of(client)
    assert post(client, "requeue", None, queue="reports").status_code == 403
    assert post(client, "requeue", "forged", queue="reports").status_code == 403
    foreign = client.post("/actions/requeue", data={"csrf": token, "queue": "reports"},
                          headers={"Origin": "http://evil.example"}, follow_redirects=False)
    assert foreign.status_code == 403
    fresh = TestClient(client.app, base_url="http://127.0.0.1")  # no cookie: the field alone proves nothing
    assert fresh.post("/actions/requeue", data={"csrf": token, "queue": "reports"}).status_code == 403
    assert client.get("/actions/requeue").status_code == 405
    assert dead(db, "reports") == 1


def test_redirects_stay_on_this_site(client, db):
    token = csrf_of(client)
    for target in ("https://evil.example/", "//evil.example/", "/\\evil.example"):
        response = post(client, "requeue", token, queue="emails", next=target)
        assert response.headers["location"].startswith("/?msg="), target


def test_the_read_only_role_sees_everything_and_may_do_nothing(db, seeded, make_role):
    viewer = make_role("viewer")
    with TestClient(create_app(viewer), base_url="http://127.0.0.1") as client:
        overview = client.get("/")
        assert overview.status_code == 200 and "emails" in overview.text
        queue = client.get("/queue?name=reports&state=dead")
        assert queue.status_code == 200
        assert re.search(r"<button[^>]*disabled[^>]*>Requeue all dead jobs</button>", queue.text)
        job = client.get(f"/job?queue=reports&id={seeded.big_id}")
        assert job.status_code == 200
        assert re.search(r"<button[^>]*disabled[^>]*>Requeue this job</button>", job.text)
        assert client.get(f"/stream?name={quote(HOSTILE)}").status_code == 200
        assert "pyalk_queue_jobs{" in client.get("/metrics").text
        token = csrf_of(client)
        refused = post(client, "requeue", token, queue="reports")
        assert refused.status_code == 403 and "may not" in refused.text
    assert dead(db, "reports") == 1


def test_the_admin_role_may_act(db, seeded, make_role):
    admin = make_role("admin")
    with TestClient(create_app(admin), base_url="http://127.0.0.1") as client:
        page = client.get("/queue?name=reports&state=dead").text
        assert re.search(r"<button type=\"submit\" class=\"\" >Requeue all dead jobs</button>", page)
        assert post(client, "requeue", csrf_of(client), queue="reports").status_code == 303
    assert dead(db, "reports") == 0


def test_read_only_mode_offers_nothing_even_to_the_owner(db, seeded):
    with TestClient(create_app(seeded.dsn, read_only=True), base_url="http://127.0.0.1") as client:
        assert re.search(r"<button[^>]*disabled[^>]*>Requeue all dead jobs</button>",
                         client.get("/queue?name=reports").text)
        assert post(client, "requeue", csrf_of(client), queue="reports").status_code == 403
    assert dead(db, "reports") == 1


def test_pause_and_resume(client, db):
    if not pause_available(db):
        pytest.skip("needs alk.pause_queue (the queue's 0009)")
    token = csrf_of(client)
    assert "msg=paused" in post(client, "pause", token, queue="emails", next="/").headers["location"]
    assert db.execute("SELECT paused FROM alk.queue_stats('emails')").fetchone()[0] is True
    assert "Resume queue" in client.get("/queue?name=emails").text
    assert "msg=already+paused" in post(client, "pause", token, queue="emails", next="/").headers["location"]
    assert "msg=resumed" in post(client, "resume", token, queue="emails", next="/").headers["location"]
    assert db.execute("SELECT paused FROM alk.queue_stats('emails')").fetchone()[0] is False


def test_pause_is_offered_only_when_the_schema_has_it(client, db):
    page = client.get("/queue?name=emails").text
    button = re.search(r"<button[^>]*>Pause queue</button>", page)
    assert button
    assert ("disabled" in button.group(0)) != pause_available(db)


def test_a_configured_token_is_required_as_bearer_or_basic_password(seeded):
    with TestClient(create_app(seeded.dsn, token="s3cret"), base_url="http://127.0.0.1") as client:
        denied = client.get("/")
        assert denied.status_code == 401 and denied.headers["www-authenticate"].startswith("Basic")
        assert client.get("/metrics").status_code == 401
        assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        basic = base64.b64encode(b"anyone:s3cret").decode()
        assert client.get("/", headers={"Authorization": f"Basic {basic}"}).status_code == 200
        assert client.get("/", headers={"Authorization": "Basic !!!"}).status_code == 401
