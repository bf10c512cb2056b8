"""`gitdrop web`: the web board served by a real uvicorn on 127.0.0.1, read and
driven over HTTP: the board's columns, escaping of hostile words, the live
stream after a CLI send, logging in with a hub token and acting as that agent,
refusals in the rule's words, CSRF, the login wall off loopback, the charts."""

import json
import re
import threading
import time
import xml.etree.ElementTree as ET

import pytest

from gitdrop import hub as hubmod
from gitdrop import tokens
from cli_helpers import Gitdrop
from conftest import free_port

try:
    import httpx
except ImportError:   # the MCP SDK brings it under this name
    import httpx2 as httpx

uvicorn = pytest.importorskip("uvicorn")

HOSTILE = "<script>alert(1)</script>"


class Server:
    """The app on a free port of 127.0.0.1, in a thread, until stop()."""

    def __init__(self, hub_path: str, **kw):
        from gitdrop.web.app import make_app, server
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = server(make_app(hub_path, **kw), "127.0.0.1", self.port)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            assert time.time() < deadline, "the web board did not start"
            time.sleep(0.02)

    def client(self, **kw):
        kw.setdefault("timeout", 5.0)
        return httpx.Client(base_url=self.url, **kw)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(5)


def seed(path: str):
    h = hubmod.init(path)
    r = h.room("lobby")
    r.register("core/juno", ["lead"])
    r.register("core/spartan", ["coder"])
    r.register("core/kai", ["coder"])
    r.register("ops/ada", ["lead"], human=True)
    r.create_task("core/juno", "Build the users API", assignee="core/spartan", priority=2,
                  body="Return id and name.\n" + HOSTILE, reviewer="core/juno")          # 1
    r.move_task("core/spartan", 1, "start")
    r.create_task("core/juno", HOSTILE)                                                 # 2
    r.create_task("ops/ada", "Pick a port", assignee="core/kai")                        # 3
    r.move_task("ops/ada", 3, "sign")        # a task across teams: both leads sign it
    r.move_task("core/juno", 3, "sign")
    r.move_task("core/kai", 3, "start")
    r.move_task("core/kai", 3, "ask", question="Which port? <b>bold</b>")
    r.create_task("core/juno", "Page of users", assignee="core/spartan",
                  reviewer="core/juno")                                                  # 4
    r.move_task("core/spartan", 4, "start")
    r.move_task("core/spartan", 4, "submit", note="done")
    r.create_task("core/juno", "Say hello", assignee="core/spartan", review=False)      # 5
    r.move_task("core/spartan", 5, "start")
    r.move_task("core/spartan", 5, "complete", note="said")
    r.create_task("core/juno", "Users by page", after=["2"])                            # 6
    r.send("core/spartan", "core/juno", "hello " + HOSTILE, task="1")
    return h


@pytest.fixture
def hub(tmp_path):
    return seed(str(tmp_path / "hub.git"))


@pytest.fixture
def web(hub):
    s = Server(hub.path)
    yield s
    s.stop()


def cards(page: str, state: str) -> list[str]:
    col = re.search(r'<div class="col" data-state="' + state + r'">(.*?)</div>(?=<div class="col"|</div><div class="side">)',
                    page, re.S)
    assert col, state
    return re.findall(r'<div class="card" data-task="([^"]+)"', col.group(1))


def login(s: Server, hub_path: str, agent: str):
    """A client logged in as `agent`, and the login's key (what /board.js keeps in the
    browser's storage and puts in each form's csrf field)."""
    c = s.client()
    r = c.post("/login", data={"token": tokens.mint(hub_path, agent)})
    assert r.status_code == 200, r.text
    key = re.search(r'<meta name="gitdrop-key" content="([^"]+)">', r.text).group(1)
    page = c.get("/r/lobby").text
    assert f"signed in as <b>{agent}</b>" in page
    return c, key


def tip(hub) -> str:
    return hub.store.tip("refs/heads/rooms/lobby")


def test_the_board_shows_tasks_in_their_columns(web):
    with web.client() as c:
        assert "lobby" in c.get("/").text
        page = c.get("/r/lobby").text
    assert cards(page, "in_progress") == ["1"]
    assert sorted(cards(page, "pending")) == ["2", "6"]
    assert cards(page, "feedback") == ["3"]
    assert cards(page, "review") == ["4"]
    assert cards(page, "completed") == ["5"]
    assert "(person)" in page and "ops/ada" in page
    assert '<script src="/board.js">' in page
    with web.client() as c:
        assert "EventSource" in c.get("/board.js").text


def test_hostile_words_are_escaped(web):
    with web.client() as c:
        pages = [c.get(p).text for p in ("/r/lobby", "/r/lobby/t/1", "/r/lobby/t/2",
                                         "/r/lobby/log", "/r/lobby/charts",
                                         "/r/lobby/a/core/spartan")]
    for p in pages:
        assert HOSTILE not in p
        assert "<b>bold</b>" not in p
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[1]   # the brief and the message
    assert "Which port? &lt;b&gt;bold&lt;/b&gt;" in pages[0]


def test_task_page_has_moves_messages_and_commit_links(web):
    with web.client() as c:
        page = c.get("/r/lobby/t/4").text
        assert "task-submit" in page and "task-start" in page and "core/spartan" in page
        oid = re.search(r'href="/r/lobby/c/([0-9a-f]+)"', page).group(1)
        assert c.get(f"/r/lobby/c/{oid}").status_code == 200
        page1 = c.get("/r/lobby/t/1").text
        assert "hello &lt;script&gt;" in page1
        assert c.get("/r/lobby/t/99").status_code == 404
        assert c.get("/r/nowhere").status_code == 404


def test_log_filters(web):
    with web.client() as c:
        page = c.get("/r/lobby/log", params={"author": "kai"}).text
        assert "task-ask" in page and "task-submit" not in page
        page = c.get("/r/lobby/log", params={"task": "5"}).text
        assert "task-complete" in page and "task-ask" not in page
        page = c.get("/r/lobby/log", params={"op": "send"}).text
        assert "hello" in page and "task-start" not in page


@pytest.mark.alone   # a latency under a second: no other test's load
def test_sse_delivers_a_cli_send_within_a_second(web, hub, tmp_path):
    got, ready = [], threading.Event()

    def listen():
        with httpx.Client(timeout=10.0) as c:
            with c.stream("GET", web.url + "/r/lobby/events") as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                for line in r.iter_lines():
                    ready.set()
                    if line.startswith("data: "):
                        got.append((time.monotonic(), json.loads(line[6:])))
                        return
    t = threading.Thread(target=listen, daemon=True)
    t.start()
    assert ready.wait(5)
    time.sleep(0.2)
    Gitdrop(hub.path, str(tmp_path), agent="core/kai").ok("send", "core/juno", "-m", "ping from cli")
    sent = time.monotonic()
    t.join(5)
    assert got, "no event came"
    assert got[0][0] - sent < 1.0
    assert got[0][1]["op"] == "send" and got[0][1]["from"] == "core/kai"


def test_login_then_approve_is_a_commit_by_that_agent(web, hub):
    c, csrf = login(web, hub.path, "core/juno")
    r = c.post("/r/lobby/t/4/approve", data={"csrf": csrf})
    assert r.status_code == 303
    assert hub.room("lobby").task(4)["state"] == "completed"
    assert hub.store.reader.commit(tip(hub)).author == "core/juno"
    assert "approve done" in c.get(r.headers["location"]).text


def test_a_person_answers_and_sends(web, hub):
    c, csrf = login(web, hub.path, "ops/ada")
    r = c.post("/r/lobby/t/3/answer", data={"csrf": csrf, "text": "8080"})
    assert r.status_code == 303, r.text
    t = hub.room("lobby").task(3)
    assert t["state"] == "in_progress" and t["answer"] == "8080"
    r = c.post("/r/lobby/send", data={"csrf": csrf, "to": "core/kai", "text": "thanks"})
    assert r.status_code == 409 and "unread" in r.text   # the rules: read first
    assert "hello" in c.get("/r/lobby/inbox").text
    assert c.post("/r/lobby/inbox/read", data={"csrf": csrf}).status_code == 303
    r = c.post("/r/lobby/send", data={"csrf": csrf, "to": "core/kai", "text": "thanks"})
    assert r.status_code == 303, r.text
    c2 = hub.store.reader.commit(tip(hub))
    assert c2.author == "ops/ada"
    page = c.get("/r/lobby").text
    assert "(person)" in page


def test_a_refused_action_shows_the_rule(web, hub):
    c, csrf = login(web, hub.path, "core/kai")     # not the reviewer of task 4
    before = tip(hub)
    r = c.post("/r/lobby/t/4/approve", data={"csrf": csrf})
    assert r.status_code == 409
    assert 'class="rule"' in r.text and "why:" in r.text
    rule = re.search(r'<code class="rule">([^<]+)</code>', r.text).group(1)
    assert rule and rule != "error"
    assert tip(hub) == before


def test_posts_without_login_or_csrf_are_refused(web, hub):
    before = tip(hub)
    with web.client() as anon:
        r = anon.post("/r/lobby/t/4/approve", data={"csrf": "x"})
        assert r.status_code == 403
        r = anon.post("/r/lobby/send", data={"to": "core/kai", "text": "hi"})
        assert r.status_code == 403
    c, csrf = login(web, hub.path, "core/juno")
    assert c.post("/r/lobby/t/4/approve", data={}).status_code == 403
    assert c.post("/r/lobby/t/4/approve", data={"csrf": csrf + "x"}).status_code == 403
    with web.client() as forged:
        forged.cookies.set(f"gitdrop_session_{web.port}", "e30.AAAA")
        assert forged.post("/r/lobby/t/4/approve", data={"csrf": csrf}).status_code == 403
    assert web.client().post("/login", data={"token": "gd_nope"}).status_code == 403
    assert tip(hub) == before


def test_a_new_token_ends_the_old_session(web, hub):
    c, csrf = login(web, hub.path, "core/juno")
    tokens.mint(hub.path, "core/juno")     # rotated
    assert c.post("/r/lobby/t/4/approve", data={"csrf": csrf}).status_code == 403
    assert hub.room("lobby").task(4)["state"] == "review"


def test_off_loopback_every_page_needs_a_login(hub):
    s = Server(hub.path, require_login=True)
    try:
        with s.client() as c:
            for p in ("/", "/r/lobby", "/r/lobby/t/1", "/r/lobby/log", "/r/lobby/charts",
                      "/r/lobby/charts/flow.svg", "/r/lobby/events"):
                r = c.get(p)
                assert r.status_code == 401, p
                assert "Build the users API" not in r.text
        c, _ = login(s, hub.path, "core/juno")
        assert "Build the users API" in c.get("/r/lobby").text
    finally:
        s.stop()


def test_the_charts_are_svg(web):
    from gitdrop.web.charts import STATES
    with web.client() as c:
        flow = c.get("/r/lobby/charts/flow.svg")
        assert flow.headers["content-type"].startswith("image/svg+xml")
        root = ET.fromstring(flow.text)
        ns = "{http://www.w3.org/2000/svg}"
        series = [p.get("data-state") for p in root.iter(ns + "path") if p.get("class") == "series"]
        assert sorted(series) == sorted(STATES)
        act = ET.fromstring(c.get("/r/lobby/charts/activity.svg").text)
        agents = {g.get("data-agent") for g in act.iter(ns + "g") if g.get("class") == "agent"}
        assert {"core/juno", "core/spartan", "core/kai"} <= agents
        graph = ET.fromstring(c.get("/r/lobby/charts/graph.svg").text)
        nodes = {g.get("data-task") for g in graph.iter(ns + "g") if g.get("class") == "node"}
        assert nodes == {"1", "2", "3", "4", "5", "6"}
        assert len([x for x in graph.iter(ns + "line") if x.get("class") == "edge"]) == 1
        assert c.get("/r/lobby/charts").status_code == 200


def test_flow_replays_the_states():
    from gitdrop.web.charts import flow_series
    evs = [{"task": "1", "op": "task-create", "time": 100, "for": []},
           {"task": "1", "op": "task-claim", "time": 200},
           {"task": "1", "op": "task-start", "time": 300},
           {"task": "2", "op": "task-create", "time": 300, "for": ["a/b"]}]
    times, series = flow_series(evs, [{"state": "in_progress"}, {"state": "assigned"}], 400,
                                buckets=5)
    assert times[0] == 100 and times[-1] == 400
    assert series["pending"][0] == 1
    assert series["in_progress"][-1] == 1 and series["assigned"][-1] == 1


def test_the_cli_serves_and_stops_on_ctrl_c(hub, tmp_path):
    import signal
    import subprocess
    from cli_helpers import ENTRY
    port = free_port()
    g = Gitdrop(hub.path, str(tmp_path))
    p = subprocess.Popen([*ENTRY, "web", "--port", str(port)], env=g.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, page = time.time() + 15, None
        while time.time() < deadline and page is None:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/r/lobby", timeout=2.0)
            except httpx.TransportError:
                time.sleep(0.1)
        assert page is not None and page.status_code == 200
        assert "Build the users API" in page.text
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=10)
    assert p.returncode == 0, err
    assert f"http://127.0.0.1:{port}/" in err


@pytest.mark.parametrize("face", ["web", "serve"])
def test_port_0_prints_the_port_it_serves_and_a_port_in_use_is_a_usage_error(
        face, hub, tmp_path):
    """--port 0 picks a free port: the address printed is the one served (it said
    port 0); a port already taken is exit 2 naming it, not a server's log."""
    import signal
    import subprocess
    from cli_helpers import ENTRY
    g = Gitdrop(hub.path, str(tmp_path), agent="core/juno")
    args = ["web"] if face == "web" else ["serve", "--transport", "http"]
    extra = ["--allow-host", "board.example"] if face == "web" else []
    p = subprocess.Popen([*ENTRY, *args, "--port", "0", *extra], env=g.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()
        url = re.search(r"http://127\.0\.0\.1:(\d+)/\S*", line)
        assert url and url.group(1) != "0", line
        if face == "serve":
            assert "registration: open" in line, line
        # Under another name (DNS rebinding: a web page's own name made to resolve to
        # 127.0.0.1), neither answers: the page would read the board, or call tools.
        rebound = {"Host": f"evil.example:{url.group(1)}"}
        if face == "web":
            assert httpx.get(url.group(0) + "r/lobby", timeout=10).status_code == 200
            r = httpx.get(url.group(0) + "r/lobby", timeout=10, headers=rebound)
            assert r.status_code == 421 and "Build the users API" not in r.text, r.text
            assert "answers to" in r.text and "--allow-host" in r.text
            r = httpx.get(url.group(0) + "r/lobby", timeout=10,   # a name it was given
                          headers={"Host": f"board.example:{url.group(1)}"})
            assert r.status_code == 200 and "Build the users API" in r.text
        else:
            for headers in ({}, rebound):
                r = httpx.post(url.group(0), timeout=10, json={
                    "jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "t", "version": "0"}}},
                    headers={"Accept": "application/json, text/event-stream", **headers})
                if not headers:
                    assert r.status_code == 200 and "gitdrop" in r.text, r.text[:300]
                else:
                    assert r.status_code == 421 and "gitdrop" not in r.text, r.text[:300]
        taken = g(*args, "--port", url.group(1), timeout=30)
        if face == "serve":   # another loopback address: the SDK alone left it unguarded
            q = subprocess.Popen([*ENTRY, *args, "--port", "0", "--host", "127.0.0.2"],
                                 env=g.env, stderr=subprocess.PIPE, text=True)
            try:
                there = re.search(r"http://127\.0\.0\.2:(\d+)/\S*", q.stderr.readline())
                for host, want in ((f"127.0.0.2:{there.group(1)}", 200),
                                   (f"evil.example:{there.group(1)}", 421)):
                    r = httpx.post(there.group(0), timeout=10, json={
                        "jsonrpc": "2.0", "id": 1, "method": "initialize",
                        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                   "clientInfo": {"name": "t", "version": "0"}}},
                        headers={"Accept": "application/json, text/event-stream",
                                 "Host": host})
                    assert r.status_code == want, (host, r.status_code, r.text[:200])
            finally:
                q.send_signal(signal.SIGINT)
                q.communicate(timeout=15)
        assert taken.rc == 2 and f"cannot listen on 127.0.0.1:{url.group(1)}" in taken.err, taken
    finally:
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=15)


def test_a_big_dependency_graph_draws_the_linked_and_open_tasks_first():
    from gitdrop.web import charts
    nodes = [{"id": str(i), "title": f"t{i}", "state": s} for i, s in enumerate(
        ["completed", "pending", "completed", "in_progress", "pending", "pending"])]
    g = {"nodes": nodes, "edges": [["2", "0"], ["5", "2"]]}   # 5 waits on 2, 2 on 0
    svg = charts.graph_svg(g, "/r/x", most=4)
    drawn = re.findall(r'data-task="(\d+)"', svg)
    assert sorted(drawn) == ["0", "1", "2", "5"]   # the linked ones, then an open one
    assert svg.count('class="edge"') == 2 and "… 2 more tasks not drawn" in svg
    assert "more tasks not drawn" not in charts.graph_svg(g, "/r/x")


def test_a_board_without_login_answers_only_to_this_machine_by_name(web, hub):
    from gitdrop.transports.httpd import host_of
    with web.client() as c:
        for host in (f"127.0.0.1:{web.port}", f"localhost:{web.port}", "[::1]:8787"):
            assert c.get("/r/lobby", headers={"Host": host}).status_code == 200, host
        for host in ("evil.example", f"evil.example:{web.port}", "127.0.0.1.evil.example",
                     "", "[::1", "localhost.:80"):
            r = c.get("/r/lobby", headers={"Host": host})
            assert r.status_code == 421 and "Build the users API" not in r.text, (host, r.text)
        r = c.get("/r/lobby/events", headers={"Host": "evil.example"})
        assert r.status_code == 421
    assert host_of("[::1]:80") == "::1" and host_of("LocalHost:1") == "localhost"
    s = Server(hub.path, require_login=True)   # off this machine: the login protects it
    try:
        with s.client() as c:
            r = c.get("/r/lobby", headers={"Host": "board.example.org"})
            assert r.status_code == 401 and "Build the users API" not in r.text
    finally:
        s.stop()


def test_hostile_requests_get_an_answer_not_a_server_error(web, hub):
    """Every page and every action with hostile path parts, query values and form
    fields (attacks.HOSTILE_ARGS): an answer below 500. Found this way: a CSRF
    field that is not ASCII was a 500 (hmac compares ASCII str only), as was a
    session cookie that is not; and /login, open to anybody, read a chunked body
    of any size into memory."""
    import urllib.parse
    import attacks

    def part(v):
        return urllib.parse.quote(v.encode("utf-8", "surrogateescape"), safe="")

    c, csrf = login(web, hub.path, "core/juno")
    values = attacks.HOSTILE_ARGS + ["..%2f..%2fhub", "<script>", "'"]
    bad, asked = [], 0
    pages_ = ["/r/{v}", "/r/{v}/fragment", "/r/{v}/log", "/r/{v}/charts", "/r/lobby/charts/{v}",
              "/r/lobby/t/{v}", "/r/lobby/a/{v}", "/r/lobby/a/core/{v}", "/r/lobby/c/{v}",
              "/r/{v}/inbox", "/r/lobby/log?agent={v}", "/r/lobby/log?op={v}",
              "/r/lobby/log?task={v}", "/r/lobby/log?n={v}", "/r/lobby?ok={v}"]
    for who in (c, web.client()):
        for p in pages_:
            for v in values:
                r = who.get(p.replace("{v}", v if v.startswith("..%") else part(v)))
                asked += 1
                if r.status_code >= 500:
                    bad.append((p, v, r.status_code))
    actions = ["/r/lobby/send", "/r/lobby/t/1/send", "/r/lobby/t/3/answer",
               "/r/lobby/t/4/reject", "/r/lobby/inbox/read", "/login"]
    for p in actions:
        for field in ("csrf", "to", "text", "reason", "answer", "token"):
            for v in values:
                form = {"csrf": csrf, "to": "spartan", "text": "hi", "reason": "r", "answer": "a"}
                form[field] = v
                body = urllib.parse.urlencode(form, encoding="utf-8", errors="surrogateescape")
                r = c.post(p, content=body.encode(),
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
                asked += 1
                if r.status_code >= 500:
                    bad.append((p, field, v, r.status_code))
    assert asked > 1000 and not bad, bad[:10]

    def chunks():   # no Content-Length: only reading it tells its size
        for _ in range(200):
            yield b"token=" + b"a" * 100_000
    r = web.client().post("/login", content=chunks(),
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and "too large" in r.text
    r = c.post("/r/lobby/send", headers={"Cookie": f"gitdrop_session_{web.port}=\u00e9.\u00e9".encode("latin-1")},
               data={"csrf": csrf, "to": "spartan", "text": "x"})
    assert r.status_code == 403
    before = tip(hub)
    r = c.post("/r/lobby/send", content=b"csrf=" + csrf.encode() + b"&to=spartan&text=caf%E9",
               headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 409 and "UTF-8" in r.text and tip(hub) == before


def test_the_session_cookie_alone_cannot_act(web, hub):
    """Cookies ignore ports: any other server on this host that the browser visits
    receives the board's cookie. With it, it reads pages, but no page and not the
    cookie carries the login's key, so whatever it posts is refused. The port in the
    cookie's name keeps a second board's login from replacing the first's."""
    c, key = login(web, hub.path, "ops/ada")
    (name, value), = c.cookies.items()
    assert name == f"gitdrop_session_{web.port}" and key not in value
    thief = web.client()
    thief.cookies.set(name, value)
    seen = "".join(thief.get(p).text for p in ("/r/lobby", "/r/lobby/t/3", "/r/lobby/inbox"))
    assert "signed in as <b>ops/ada</b>" in seen and key not in seen
    before = tip(hub)
    for csrf in set(re.findall(r'name="csrf" value="([^"]*)"', seen)) | {""}:
        r = thief.post("/r/lobby/t/3/answer", data={"csrf": csrf, "text": "stolen"},
                       headers={"Origin": web.url})
        assert r.status_code == 403 and "Log in again" in r.text, r.text
    assert tip(hub) == before
    other = Server(hub.path)
    try:
        r = c.post(other.url + "/login", data={"token": tokens.mint(hub.path, "core/juno")})
        assert r.status_code == 200
        assert "signed in as <b>core/juno</b>" in c.get(other.url + "/r/lobby").text
        assert "signed in as <b>ops/ada</b>" in c.get("/r/lobby").text
    finally:
        other.stop()
    r = c.post("/r/lobby/t/3/answer", data={"csrf": key, "text": "8080"})
    assert r.status_code == 303 and hub.room("lobby").task(3)["answer"] == "8080"


def test_an_open_stream_ends_with_its_login(hub):
    """Off loopback a stream needs a login; once its token is revoked it delivers
    nothing more and ends."""
    s = Server(hub.path, require_login=True)
    got, ended, ready = [], threading.Event(), threading.Event()
    c, _ = login(s, hub.path, "core/kai")

    def listen():
        try:
            with c.stream("GET", "/r/lobby/events", timeout=10.0) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    ready.set()
                    if line.startswith("data: "):
                        got.append(line)
                        return
            ended.set()
        except httpx.HTTPError:
            pass
    try:
        t = threading.Thread(target=listen, daemon=True)
        t.start()
        assert ready.wait(5)
        tokens.revoke(hub.path, "core/kai")
        hub.room("lobby").create_task("core/juno", "the secret plan")
        assert ended.wait(5) and not got, got
    finally:
        s.stop()


def test_login_and_logout_from_another_site_are_refused(web, hub):
    """Another site's page must not log the person in as its own agent, nor out."""
    foreign = {"Origin": f"http://localhost:{web.port}"}
    with web.client() as c:
        r = c.post("/login", data={"token": tokens.mint(hub.path, "core/kai")}, headers=foreign)
        assert r.status_code == 403 and "its own address" in r.text
        assert "set-cookie" not in r.headers
    c, _ = login(web, hub.path, "core/juno")
    r = c.post("/logout", headers=foreign)
    assert r.status_code == 403 and "its own address" in r.text
    assert "signed in as <b>core/juno</b>" in c.get("/r/lobby").text
    kept = dict(c.cookies)   # a copy of the cookie, as another program could keep it
    assert c.post("/logout", headers={"Origin": web.url}).status_code == 303
    assert "signed in as" not in c.get("/r/lobby").text
    with web.client() as copy:   # the logout ended the login, not only this browser's cookie
        copy.cookies.update(kept)
        assert "signed in as" not in copy.get("/r/lobby").text
        assert copy.get("/r/lobby/inbox").status_code == 401


def test_a_commit_page_shows_only_a_commit_of_its_room(web, hub):
    """Not another room's commit, nor a destroyed room's (the hub keeps its objects),
    nor one named by a prefix; a tree or a blob is a 404, not a server error."""
    import pygit2
    hub.create_room("hub/admin", "secret")
    r = hub.room("secret")
    r.register("ops/ada")
    r.send("ops/ada", "ops/ada", "the launch code is 1234")
    secret = hub.store.tip("refs/heads/rooms/secret")
    hub.destroy_room("secret", "hub/admin")
    lobby = tip(hub)
    tree = pygit2.Repository(hub.path)[lobby].tree
    blob = next(str(e.id) for e in tree if e.type_str == "blob")
    with web.client() as c:
        assert c.get(f"/r/lobby/c/{lobby}").status_code == 200
        for oid, want in ((secret, 404), (str(tree.id), 404), (blob, 404), (lobby[:8], 400)):
            r = c.get(f"/r/lobby/c/{oid}")
            assert r.status_code == want and "launch code" not in r.text, (oid, r.status_code)
            assert "follow a link of the room&#x27;s log" in r.text


def test_event_streams_are_capped_per_client_and_in_all(hub):
    """A cap per client and one in all. Every loopback address is one client (a
    process here took the per-address cap from each 127.x.y.z and filled the board),
    and a login is one of its own, wherever it comes from."""
    s = Server(hub.path, streams=(2, 3))

    def client(address, agent=""):
        c = httpx.Client(base_url=s.url, timeout=5.0,
                         transport=httpx.HTTPTransport(local_address=address))
        if agent:
            r = c.post("/login", data={"token": tokens.mint(hub.path, agent)})
            assert r.status_code in (200, 303), r.text
        return c
    opened = []

    def open_(c):
        cm = c.stream("GET", "/r/lobby/events")
        r = cm.__enter__()
        if r.status_code == 200:
            opened.append(cm)
        else:
            r.read()
            cm.__exit__(None, None, None)
        return r
    try:
        one, two = client("127.0.0.1"), client("127.0.0.2")
        three = client("127.0.0.3", "core/juno")
        assert [open_(one).status_code for _ in range(2)] == [200, 200]
        r = open_(one)
        assert r.status_code == 503 and "close some of the board's tabs" in r.text
        r = open_(two)   # another loopback address: the same client
        assert r.status_code == 503 and "from your address" in r.text
        assert open_(three).status_code == 200   # a login counts as its own
        r = open_(three)
        assert r.status_code == 503 and "reload later" in r.text
        opened.pop(0).__exit__(None, None, None)   # a tab closed: room for one more
        deadline = time.time() + 5
        while open_(three).status_code != 200:
            assert time.time() < deadline, "a closed stream was still counted"
            time.sleep(0.1)
    finally:
        for cm in opened:
            cm.__exit__(None, None, None)
        s.stop()


def test_streams_asked_for_at_once_are_capped_too(hub):
    """The count was taken once a stream's body began: 60 asked for at once all
    passed a check of 0, and one address held 50 against a cap of 16."""
    import threading
    s = Server(hub.path, streams=(2, 100))
    gate, got, opened, lock = threading.Barrier(12), [], [], threading.Lock()

    def ask():
        c = httpx.Client(base_url=s.url, timeout=10.0)
        gate.wait()
        cm = c.stream("GET", "/r/lobby/events")
        r = cm.__enter__()
        with lock:
            got.append(r.status_code)
            opened.append(cm)
    try:
        threads = [threading.Thread(target=ask) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(got) == [200] * 2 + [503] * 10, got
    finally:
        for cm in opened:
            cm.__exit__(None, None, None)
    try:   # and every place is given back once they close
        deadline = time.time() + 5
        while True:
            with httpx.Client(base_url=s.url, timeout=5.0) as c:
                with c.stream("GET", "/r/lobby/events") as r1, \
                        c.stream("GET", "/r/lobby/events") as r2:
                    if (r1.status_code, r2.status_code) == (200, 200):
                        break
            assert time.time() < deadline, "closed streams were still counted"
            time.sleep(0.1)
    finally:
        s.stop()


def test_the_done_box_says_only_the_boards_own_words(web):
    lie = "Your session expired. Log in again at http://gitdrop-login.example/"
    with web.client() as c:
        page = c.get("/r/lobby", params={"ok": lie}).text
        assert lie not in page and 'class="ok"' not in page
        assert '<div class="ok">approve done</div>' in c.get("/r/lobby/t/4?ok=approve").text


def _answering(p, port: int) -> None:
    """Until the board `gitdrop web` (process `p`) started serves a page."""
    deadline = time.time() + 15
    while True:
        try:
            assert httpx.get(f"http://127.0.0.1:{port}/r/lobby", timeout=2).status_code == 200
            return
        except httpx.TransportError:
            assert time.time() < deadline and p.poll() is None, "the board did not start"
            time.sleep(0.1)


def test_half_sent_connections_do_not_take_the_board_down(hub, tmp_path):
    """Connections that send half a request and stay took every file descriptor:
    the board answered nobody until they went, and logged a traceback for every
    accept that failed (85 MB in 35 s). Past what the open-file limit leaves, a
    connection is closed at once; the board answers as soon as they are gone."""
    import resource
    import signal
    import socket
    import subprocess
    from cli_helpers import ENTRY
    port = free_port()
    g = Gitdrop(hub.path, str(tmp_path))

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    p = subprocess.Popen([*ENTRY, "web", "--port", str(port)], env=g.env, preexec_fn=low_limit,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    held = []
    try:
        _answering(p, port)
        for _ in range(400):
            try:
                s = socket.create_connection(("127.0.0.1", port), 2)
                s.sendall(b"GET /r/lobby HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                held.append(s)
            except OSError:
                pass
        time.sleep(1)
        assert p.poll() is None, "the board ended"
        for s in held:
            s.close()
        held.clear()
        time.sleep(1)
        page = httpx.get(f"http://127.0.0.1:{port}/r/lobby", timeout=10)
        assert page.status_code == 200 and "Build the users API" in page.text
    finally:
        for s in held:
            s.close()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=15)
    assert err.count("Traceback") < 5, err[-3000:]


def test_a_request_must_come_whole_body_and_all_on_every_kept_alive_turn(hub, tmp_path):
    """Only a request's headers were timed, and only the first on a connection: one
    whose body never came, or a kept-alive connection whose next request was begun
    and never finished, held its descriptor for ever (one local client held them
    all). GITDROP_REQUEST_SECONDS shortens the wait for this test."""
    import signal
    import socket
    import subprocess
    from cli_helpers import ENTRY
    port = free_port()
    g = Gitdrop(hub.path, str(tmp_path))
    p = subprocess.Popen([*ENTRY, "web", "--port", str(port)],
                         env=dict(g.env, GITDROP_REQUEST_SECONDS="1"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    conns = []
    try:
        _answering(p, port)

        def conn(data: bytes):
            s = socket.create_connection(("127.0.0.1", port), 5)
            s.settimeout(5)
            s.sendall(data)
            conns.append(s)
            return s
        no_body = conn(b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/x-www-form-urlencoded\r\n"
                       b"Content-Length: 100\r\n\r\n")
        again = conn(b"GET /r/lobby HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b"</html>" not in first.lower():
            chunk = again.recv(65536)
            assert chunk, first[-300:]
            first += chunk
        again.sendall(b"GET /r/lobby HTTP/1.1\r\nHost: 127.0")   # begun, never finished
        time.sleep(3)

        def closed(s) -> bool:
            try:
                while True:
                    data = s.recv(65536)
                    if not data:
                        return True
            except (ConnectionResetError, BrokenPipeError):
                return True
            except socket.timeout:
                return False
        assert closed(no_body) and closed(again)
        page = httpx.get(f"http://127.0.0.1:{port}/r/lobby", timeout=10)
        assert page.status_code == 200
    finally:
        for s in conns:
            s.close()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=15)
    assert "Traceback" not in err, err[-3000:]   # a body cut off is nobody to answer
