"""The web board in a real browser: headless Chromium driven through chromedriver
(WebDriver over HTTP). The board renders its tasks; a CLI send shows on the open
page without a reload; a person logs in and approves (the commit is theirs), and a
refusal shows its rule; screenshots of the main pages are saved. Skipped where
Chromium or chromedriver is not installed (.ci/setup.d/30-chromium.sh installs
them)."""

import base64
import os
import shutil
import subprocess
import time

import pytest

from cli_helpers import Gitdrop
from test_web import Server, free_port, httpx, seed

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or \
    ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else "")
DRIVER = shutil.which("chromedriver") or \
    ("/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else "")

pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="needs chromium and chromedriver "
                                       "(.ci/setup.d/30-chromium.sh installs them)")


class Browser:
    """One headless Chromium session through chromedriver's WebDriver API."""

    def __init__(self, tmp):
        self.port = free_port()
        self.driver = subprocess.Popen([DRIVER, f"--port={self.port}"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30.0)
        deadline = time.time() + 15
        while True:
            try:
                if self.http.get("/status").json()["value"]["ready"]:
                    break
            except (httpx.TransportError, ValueError, KeyError):
                pass
            assert time.time() < deadline, "chromedriver did not start"
            time.sleep(0.05)
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", f"--user-data-dir={tmp}/profile",
                "--no-first-run", "--disable-extensions"]
        r = self.http.post("/session", json={"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}}})
        assert r.status_code == 200, r.text
        self.sid = r.json()["value"]["sessionId"]

    def cmd(self, method, path, **kw):
        r = self.http.request(method, f"/session/{self.sid}{path}", **kw)
        assert r.status_code == 200, r.text
        return r.json()["value"]

    def go(self, url):
        self.cmd("POST", "/url", json={"url": url})

    def js(self, script, *args):
        return self.cmd("POST", "/execute/sync", json={"script": script, "args": list(args)})

    def shot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.cmd("GET", "/screenshot")))
        return path

    def quit(self):
        try:
            self.http.delete(f"/session/{self.sid}")
        finally:
            self.http.close()
            self.driver.terminate()
            self.driver.wait(10)


@pytest.fixture
def site(tmp_path):
    h = seed(str(tmp_path / "hub.git"))
    s = Server(h.path)
    b = Browser(tmp_path)
    yield h, s, b
    b.quit()
    s.stop()


def until(fn, timeout):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def test_the_board_renders_its_tasks(site):
    h, s, b = site
    b.go(s.url + "/r/lobby")
    cols = b.js("var out={};document.querySelectorAll('.col').forEach(function(c){"
                "out[c.dataset.state]=Array.from(c.querySelectorAll('.card'))"
                ".map(function(x){return x.dataset.task})});return out;")
    assert cols["in_progress"] == ["1"] and cols["review"] == ["4"]
    assert sorted(cols["pending"]) == ["2", "6"]
    # the hostile title is text on the page, not a script that ran
    assert "<script>alert(1)</script>" in b.js("return document.body.innerText")


@pytest.mark.alone   # a latency under a second: no other test's load
def test_a_cli_send_shows_without_a_reload(site, tmp_path):
    h, s, b = site
    b.go(s.url + "/r/lobby")
    b.js("window.notReloaded = true")
    assert until(lambda: b.js("return window.gitdropEvents && window.gitdropEvents.readyState"
                              " === 1"), 5), "the event stream did not open"
    Gitdrop(h.path, str(tmp_path), agent="core/kai").ok("send", "core/juno", "-m",
                                                         "seen live in the page")
    sent = time.monotonic()
    shown = until(lambda: "seen live in the page" in b.js(
        "var t=document.getElementById('events');return t?t.innerText:''"), 3)
    took = time.monotonic() - sent
    assert shown, "the message never showed"
    assert took < 1.0, f"it took {took:.2f} s"
    assert b.js("return window.notReloaded === true")


def test_screenshots_of_the_main_pages(site, tmp_path):
    h, s, b = site
    shots = []
    for name, path in (("rooms", "/"), ("board", "/r/lobby"), ("task", "/r/lobby/t/1"),
                       ("agent", "/r/lobby/a/core/spartan"), ("log", "/r/lobby/log"),
                       ("charts", "/r/lobby/charts")):
        b.go(s.url + path)
        assert b.js("return document.readyState") == "complete"
        shots.append(b.shot(str(tmp_path / f"web-{name}.png")))
    for p in shots:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(p) > 5000
        print("screenshot:", p)


def _log_in(b, url, token):
    b.go(url + "/login")
    b.js("document.querySelector('input[name=token]').value = arguments[0];"
         "document.querySelector('form[action=\"/login\"]').submit();", token)
    assert until(lambda: "/login" not in b.js("return location.pathname"), 5), "no login"


def _click(b, action):
    """Submit the page's form that posts to `action` (a path ending), as a click would."""
    b.js("var a=arguments[0];var f=Array.from(document.forms).find(function(f){"
         "return (f.getAttribute('action')||'').endsWith(a)});"
         "f.querySelector('button').click();", action)


def test_a_person_logs_in_approves_and_a_refusal_shows_the_rule(site):
    from gitdrop import tokens
    h, s, b = site
    # kai is not the reviewer of task 4: the page says which rule refused it
    _log_in(b, s.url, tokens.mint(h.path, "core/kai"))
    b.go(s.url + "/r/lobby/t/4")
    _click(b, "/approve")
    assert until(lambda: b.js("var r=document.getElementById('refusal');"
                              "return r?r.innerText:''"), 5)
    text = b.js("return document.getElementById('refusal').innerText")
    assert "refused by rule task-state-machine" in text, text
    assert h.room("lobby").task("4")["state"] == "review"
    # the reviewer logs in and approves: the commit is theirs
    b.js("document.cookie.split(';').forEach(function(c){document.cookie="
         "c.split('=')[0]+'=;expires=Thu, 01 Jan 1970 00:00:00 GMT;path=/'})")
    _log_in(b, s.url, tokens.mint(h.path, "core/juno"))
    b.go(s.url + "/r/lobby/t/4")
    _click(b, "/approve")
    assert until(lambda: h.room("lobby").task("4")["state"] == "completed", 5)
    last = h.room("lobby").log(1)[0]
    assert (last["op"], last["author"]) == ("task-approve", "core/juno")


def test_another_server_on_this_host_gets_the_cookie_but_cannot_act(site):
    """Cookies ignore ports: a server on another port of this host that the person
    visits receives the board's cookie. Replayed, it reads pages but cannot act: the
    login's key is kept in the storage of the board's own origin, which includes the
    port, and no page shows it. The person's own browser still acts."""
    import http.server
    import re
    import threading
    from gitdrop import tokens
    h, s, b = site
    got = []

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            got.append(self.headers.get("Cookie", ""))
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<p>another server</p>")

        def log_message(self, *a):
            pass
    # a thread a connection: Chromium may open one it sends nothing on (a preconnect),
    # and a server that reads them in turn waited on it (shutdown() with it) a minute
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        _log_in(b, s.url, tokens.mint(h.path, "ops/ada"))
        b.go(f"http://127.0.0.1:{other.server_port}/")
        assert b.js("return localStorage.getItem('gitdrop-key')") is None
    finally:
        other.shutdown()
        other.server_close()
    cookie = next(c for c in got if "gitdrop_session" in c)
    with s.client(headers={"Cookie": cookie, "Origin": s.url}) as thief:
        page = thief.get("/r/lobby/t/3").text
        assert "signed in as <b>ops/ada</b>" in page
        csrf = re.search(r'name="csrf" value="([^"]*)"', page).group(1)
        r = thief.post("/r/lobby/t/3/answer", data={"csrf": csrf, "text": "stolen"})
    assert r.status_code == 403 and h.room("lobby").task("3")["state"] == "feedback"
    b.go(s.url + "/r/lobby/t/3")
    b.js("document.querySelector('textarea[name=text]').value = '8080'")
    _click(b, "/answer")
    assert until(lambda: h.room("lobby").task("3")["state"] == "in_progress", 5)
    assert h.room("lobby").task("3")["answer"] == "8080"
