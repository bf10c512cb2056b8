"""The web board as a Starlette app: `make_app(hub_path)`.

Reading needs no login when the board is bound to this machine only (the CLI
passes `require_login=True` for any other address); acting always does. A login
is a hub token (`gitdrop token team/name`): the session cookie is signed with a
secret of this process, HttpOnly and SameSite=Strict, and names the agent and the
token's digest (a rotated or revoked token ends the session). Every POST action
also carries the login's key (Board.key), which no page shows. Writes go through
the core, so the rules decide; a refusal is shown with the rule's own words.
"""

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import secrets
import threading
import time
import urllib.parse

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import board as boardmod
from .. import events as eventsmod
from .. import model, tokens
from ..transports.httpd import LOOPBACK, client_key, host_of
from ..core import by_short_name
from ..view import first_parent_walk
from ..errors import GitdropError, NotFound, Refusal, UsageError
from . import charts, pages

COOKIE = "gitdrop_session"   # and _PORT: see Board.cookie_name
SESSION_SECONDS = 12 * 3600
WATCHER = "hub/web"        # the notifier's subscriber id: nobody commits as it
KEEPALIVE = 15.0           # seconds between SSE comments while nothing lands
TICK = 0.5                 # seconds between checks that a stream's reader is still there
HISTORY_CAP = 20000        # commits read for the log filters, the charts, a commit's page
STREAMS = (16, 200)        # open event streams at most: of one login (else client), in all
MAX_FORM = 256 * 1024
STATUS = {Refusal: 409, NotFound: 404, UsageError: 400}


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


def _unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def _status(err) -> int:
    for cls, code in STATUS.items():
        if isinstance(err, cls):
            return code
    return 500 if not isinstance(err, GitdropError) else 409


class Board:
    """What the routes share: the hub (one lock around it), the token verifier, the
    session secret and the notifier."""

    def __init__(self, hub_path: str, require_login: bool, secret: bytes | None):
        from ..opener import open_hub
        self.hub_path = hub_path
        self.hub = open_hub(hub_path, create=False)
        self.require_login = require_login
        self.secret = secret or secrets.token_bytes(32)
        self.verifier = tokens.Verifier(hub_path)
        self.lock = threading.RLock()
        self.notifier = None
        self.stopping = threading.Event()
        # Logins ended by a logout, until they would have expired anyway: a cookie
        # is its own proof, so a copy kept somewhere would outlive the logout.
        self.ended: dict[str, float] = {}

    # --- the hub ----------------------------------------------------------------
    async def call(self, fn, *a, **kw):
        def locked():
            with self.lock:
                return fn(*a, **kw)
        return await run_in_threadpool(locked)

    def room(self, name: str):
        return self.hub.room(name)

    # --- sessions ---------------------------------------------------------------
    def sign(self, data: dict) -> str:
        raw = _b64(json.dumps(data, separators=(",", ":")).encode())
        mac = _b64(hmac.new(self.secret, raw.encode(), hashlib.sha256).digest())
        return f"{raw}.{mac}"

    @staticmethod
    def cookie_name(request: Request) -> str:
        """Cookies ignore ports: with the port in its name, a login to one board does
        not replace the login to another on the same host."""
        return f"{COOKIE}_{request.url.port or 80}"

    def key(self, session: dict) -> str:
        """The login's key, which every action must carry. The browser sends the cookie
        to every server on this host, whatever its port: one the person visits could
        replay it. The key is derived from the cookie with this process's secret, shown
        once (the login's answer), and kept by the browser in storage of this board's
        origin (scheme, host and port), which another port cannot read. No page shows
        it, so the cookie alone reads but cannot act."""
        return _b64(hmac.new(self.secret, b"key:" + str(session.get("n", "")).encode(),
                             hashlib.sha256).digest())

    def session(self, request: Request) -> dict | None:
        value = request.cookies.get(self.cookie_name(request), "")
        raw, _, mac = value.partition(".")
        if not raw or not mac:
            return None
        want = _b64(hmac.new(self.secret, raw.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(want.encode(), mac.encode("utf-8", "surrogateescape")):
            return None
        try:
            data = json.loads(_unb64(raw))
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("e", 0) < time.time():
            return None
        if data.get("n") in self.ended:
            return None
        if not self._token_still(data.get("a", ""), data.get("t", "")):
            return None
        return data

    def end(self, session: dict) -> None:
        """A logout: this login's cookie reads and acts no more, wherever it is."""
        now = time.time()
        self.ended = {n: e for n, e in self.ended.items() if e > now}
        self.ended[str(session.get("n", ""))] = session.get("e", now)

    def _token_still(self, agent: str, digest: str) -> bool:
        """The token the session was made with is still the agent's (tokens.json keeps
        one digest per agent: a new token or a revoked one ends older sessions)."""
        v = self.verifier
        v._refresh()
        return bool(agent) and v._by_hash.get(digest) == agent

    def login(self, token: str) -> tuple[str, str, str] | None:
        """(cookie, key, agent) for a token of the hub, else None."""
        agent = self.verifier.agent(token.strip())
        if not agent:
            return None
        s = {"a": agent, "t": tokens.digest(token.strip()), "n": secrets.token_urlsafe(24),
             "e": int(time.time()) + SESSION_SECONDS}
        return self.sign(s), self.key(s), agent


class _Stream(StreamingResponse):
    """A live stream whose place in the count is given back when the response ends,
    however it ends (its body may never start: the client gone before the headers)."""

    def __init__(self, body, closed, **kw):
        super().__init__(body, **kw)
        self.closed = closed

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.closed()


def make_app(hub_path: str, require_login: bool = False, secret: bytes | None = None,
             notifier: bool = True, hosts=LOOPBACK, streams=STREAMS) -> Starlette:
    """The web board of the hub at `hub_path`. `require_login`: every page needs a
    login (for a board bound to an address other machines reach). Without it, the
    board answers only requests addressed to one of `hosts` (see HostGuard).
    `streams`: how many event streams may be open for one login (without one: one
    client address, every loopback address one client), in all."""
    b = Board(hub_path, require_login, secret)
    open_streams: dict[str, int] = {}   # client address: its open event streams

    def who(request) -> str:
        s = b.session(request)
        return s["a"] if s else ""

    def humans_of(room, ids):
        """Which of `ids` are people (register --human), from their own files: who()
        of a room of 10,000 agents is a second."""
        view = room.view()
        return {a for a in set(ids) if model.is_agent_id(a)
                and (view.agent(a) or {}).get("human")}

    def is_human(room, agent):
        return bool(humans_of(room, [agent]))

    def html(text, status=200, headers=None):
        h = {"Content-Security-Policy": "default-src 'self'; style-src 'unsafe-inline'; "
             "script-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
             "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
             "Cache-Control": "no-store"}
        h.update(headers or {})
        return HTMLResponse(text, status_code=status, headers=h)

    def failed(err):
        return html(pages.error(_status(err), err), _status(err))

    def gate(fn):
        """A page: with require_login, none without a session (401 and the login form)."""
        async def page(request):
            if b.require_login and not b.session(request):
                return html(pages.login(need=True), 401)
            try:
                return await fn(request)
            except GitdropError as err:
                return failed(err)
        return page

    async def form_of(request) -> dict:
        """The posted form (urlencoded, as the pages send it), read up to MAX_FORM
        bytes however it comes: a chunked body has no length to check first, and
        /login takes one from anybody."""
        if request.headers.get("content-type", "").split(";")[0].strip().lower() not in \
                ("", "application/x-www-form-urlencoded"):
            raise UsageError("the form must be application/x-www-form-urlencoded",
                             "post it as the page's own form does")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                raise UsageError("the form is too large", "send less")
        # Bytes that are not UTF-8 stay as such: the core refuses them with its rule.
        return dict(urllib.parse.parse_qsl(body.decode("utf-8", "surrogateescape"),
                                           keep_blank_values=True, encoding="utf-8",
                                           errors="surrogateescape"))

    def cross_site(request):
        """403 for a POST whose Origin is another site's (a login and a logout too:
        another site could log you in as its own agent). A POST without Origin is let
        through: requiring it would not stop a replayed cookie (a program sets any
        Origin it likes); the key does (Board.key)."""
        origin = request.headers.get("origin")
        if origin and origin.split("://", 1)[-1] != request.headers.get("host", ""):
            return html(pages.page("403", f"<h1>403</h1><p>cross-site request refused: this "
                                   f"form was sent from a page of {pages.e(origin[:100])}. Open "
                                   "the board at its own address and use its forms.</p>"), 403)
        return None

    def action(fn):
        """A POST that writes: a session and its key, or 403 and nothing written."""
        async def post(request):
            s = b.session(request)
            if not s:
                return html(pages.login("acting needs a login"), 403)
            refused = cross_site(request)
            if refused:
                return refused
            try:
                form = await form_of(request)
            except GitdropError as err:
                return failed(err)
            if not hmac.compare_digest(form.get("csrf", "").encode("utf-8", "surrogateescape"),
                                       b.key(s).encode()):
                return html(pages.page("403", "<h1>403</h1><p>this form did not carry your "
                                       "login's key, which this browser keeps for this board's "
                                       "address once its script has run. Log in again at "
                                       '<a href="/login">/login</a> in this browser, with '
                                       "script on, then use the form again.</p>"), 403)
            try:
                return await fn(request, s["a"], form)
            except GitdropError as err:
                return failed(err)
        return post

    # --- pages ------------------------------------------------------------------
    async def index(request):
        user = who(request)
        rows = await b.call(b.hub.rooms)
        return html(pages.rooms(rows, user))

    def board_page(name, user, err=None, ok=""):
        room = b.room(name)
        data = boardmod.board_data(room)
        return pages.board(data, user, is_human(room, user), err, ok)

    async def board(request):
        user = who(request)
        name = request.path_params["room"]
        ok = request.query_params.get("ok", "")
        return html(await b.call(board_page, name, user, None, ok))

    async def fragment(request):
        room = await b.call(b.room, request.path_params["room"])
        data = await b.call(boardmod.board_data, room)
        return html(pages.board_fragment(data))

    def task_page(name, tid, user, err=None, ok=""):
        room = b.room(name)
        t = room.task(tid)
        hist = room.history(n=500, task=str(t["id"]), messages_only=False, reach=HISTORY_CAP)
        moves = [h for h in hist if h["op"] != "send"]
        msgs = [h for h in hist if h["op"] == "send"]
        humans = humans_of(room, [t["assignee"], t["creator"], t["reviewer"]]
                           + [h["from"] for h in hist])
        return pages.task(name, t, moves, msgs, user, humans, user in humans, err, ok)

    async def task(request):
        user = who(request)
        p = request.path_params
        return html(await b.call(task_page, p["room"], p["id"], user, None,
                                 request.query_params.get("ok", "")))

    def agent_page(name, agent, user):
        room = b.room(name)
        ids = room.view().agent_ids()
        aid = agent if agent in ids else by_short_name(agent, ids)
        if not aid:
            raise NotFound(f"no agent {agent} in room {name!r}", "see the board's agents")
        a = room.who_page(only=[aid])["agents"][0]
        mine = room.list_tasks(assignee=a["agent"], include_done=True)
        hist = room.history(n=HISTORY_CAP, messages_only=False, reach=HISTORY_CAP)
        acts = [h for h in hist if h["from"] == a["agent"]][-50:]
        return pages.agent(name, a, mine, acts, user, is_human(room, user))

    async def agent(request):
        user = who(request)
        p = request.path_params
        return html(await b.call(agent_page, p["room"], p["agent"], user))

    def log_page(name, filters, user, limit=200):
        room = b.room(name)
        task_id = filters.get("task", "").lstrip("#")
        author, op = filters.get("author", ""), filters.get("op", "")
        n = limit if not (author or op) else HISTORY_CAP
        # a filter matching little would walk the whole room, holding the board meanwhile
        hist = room.history(n=n, task=task_id, messages_only=False, reach=HISTORY_CAP)
        if author:
            hist = [h for h in hist if h["from"] == author or h["from"].split("/")[-1] == author]
        if op:
            hist = [h for h in hist if h["op"] == op or h["op"] == "task-" + op]
        return pages.log(name, hist[-limit:], filters, user, is_human(room, user))

    async def log(request):
        user = who(request)
        q = request.query_params
        filters = {k: q.get(k, "") for k in ("author", "op", "task")}
        return html(await b.call(log_page, request.path_params["room"], filters, user))

    def chart_data(name):
        room = b.room(name)
        hist = room.history(n=HISTORY_CAP, messages_only=False)
        headers = room.list_tasks(include_done=True)
        now = int(room.clock())
        return (charts.flow(hist, headers, now), charts.activity(hist, now),
                charts.graph_svg(room.graph(), f"/r/{pages.u(name)}"))

    async def charts_page(request):
        user = who(request)
        name = request.path_params["room"]
        flow, act, graph = await b.call(chart_data, name)
        return html(pages.charts(name, flow, act, graph, user))

    async def chart_svg(request):
        which = {"flow.svg": 0, "activity.svg": 1, "graph.svg": 2}.get(request.path_params["which"])
        if which is None:
            raise NotFound("no such chart", "flow.svg, activity.svg or graph.svg")
        svg = (await b.call(chart_data, request.path_params["room"]))[which]
        return Response(svg, media_type="image/svg+xml",
                        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})

    def commit_page(name, oid, user):
        room = b.room(name)
        if len(oid) != 40 or oid.strip("0123456789abcdef"):
            raise UsageError(f"{oid[:70]!r} is not a full commit id (40 hex digits)",
                             "follow a link of the room's log")
        # Only a commit of this room's history: the hub keeps every room's objects, a
        # destroyed room's too. The walk reads commits only (a tree or blob id is not
        # found, not read as a commit) and goes back as far as the log's filters do.
        reader = room.store.reader
        walk = first_parent_walk(reader, room.store.room_tip(room.name))
        c = next((c for c in itertools.islice(walk, HISTORY_CAP) if c.oid == oid), None)
        if c is None:
            raise NotFound(f"no commit {oid} among the last {HISTORY_CAP} of room {name!r}",
                           "follow a link of the room's log")
        ev = eventsmod.event(reader, c)
        return pages.commit(name, {"id": c.oid, "author": c.author, "time": c.time,
                                   "subject": ev["subject"], "body": c.message}, user)

    async def commit(request):
        user = who(request)
        p = request.path_params
        return html(await b.call(commit_page, p["room"], p["oid"], user))

    def inbox_page(name, user, ok=""):
        room = b.room(name)
        got = room.inbox(user, limit=200, peek=True)
        return pages.inbox(name, got, user, is_human(room, user), ok)

    async def inbox(request):
        user = who(request)
        if not user:
            return html(pages.login("your inbox needs a login"), 401)
        return html(await b.call(inbox_page, request.path_params["room"], user,
                                 request.query_params.get("ok", "")))

    async def mark_read(request, agent, form):
        name = request.path_params["room"]

        def do():
            return b.room(name).inbox(agent, limit=0)
        await b.call(do)
        return acted(request, f"/r/{pages.u(name)}/inbox", "read")

    async def board_js(request):
        return Response(pages.BOARD_JS, media_type="text/javascript",
                        headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"})

    # --- live -------------------------------------------------------------------
    async def stream(request):
        name = request.path_params["room"]
        await b.call(b.room, name)   # NotFound before any stream
        if b.notifier is None:
            raise UsageError("live updates are off", "reload the page")
        # Each open stream holds a socket and wakes every TICK: a cap per login (else
        # per client: every loopback address is one, or a process here took 16 from
        # each 127.x.y.z and filled the board) and one in all keep one client from
        # taking the server's files.
        opened = b.session(request)
        client = f"login {opened.get('a', '')}" if opened else \
            client_key(request.client.host if request.client else "")
        mine, total = open_streams.get(client, 0), sum(open_streams.values())
        if mine >= streams[0] or total >= streams[1]:
            whose = "your login" if opened else "your address"
            why = (f"{mine} live streams are open from {whose} already: close some of "
                   "the board's tabs, then reload" if mine >= streams[0] else
                   f"the board has {total} live streams open already: reload later")
            return Response(why + " (the pages work without live updates meanwhile)\n",
                            status_code=503, media_type="text/plain")
        # Counted here, where it was checked, with no wait in between: counted once
        # the body began, 60 streams asked for at once all passed a check of 0.
        open_streams[client] = mine + 1
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def landed(evs):
            loop.call_soon_threadsafe(q.put_nowait, evs)

        def still():
            """A stream opened with a login ends with it (expired, or its token rotated
            or revoked): checked before each delivery and at each keepalive."""
            return opened is None or b.session(request) is not None

        async def gen():
            # Taken here, not before: a body never started (the client gone before the
            # headers) runs no finally, and would keep its subscription.
            unsubscribe = b.notifier.subscribe(name, WATCHER, landed, every=True)
            try:
                yield ": live\n\n"
                quiet = 0.0
                while not b.stopping.is_set():
                    try:
                        evs = await asyncio.wait_for(q.get(), TICK)
                    except asyncio.TimeoutError:
                        quiet += TICK
                        if await request.is_disconnected():
                            break
                        if quiet >= KEEPALIVE:
                            if not still():
                                break
                            quiet = 0.0
                            yield ": keepalive\n\n"
                        continue
                    if not still():
                        break
                    for ev in evs:
                        data = {k: ev.get(k) for k in ("id", "op", "from", "time", "subject",
                                                        "task", "to")}
                        data["room"] = name
                        yield (f"event: commit\nid: {ev['id']}\n"
                               f"data: {json.dumps(data, ensure_ascii=False)}\n\n")
            finally:
                unsubscribe()

        def closed():
            open_streams[client] -= 1
            if not open_streams[client]:
                del open_streams[client]
        return _Stream(gen(), closed, media_type="text/event-stream",
                       headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    # --- login ------------------------------------------------------------------
    async def login_form(request):
        return html(pages.login())

    async def login(request):
        refused = cross_site(request)
        if refused:
            return refused
        try:
            form = await form_of(request)
        except GitdropError as err:
            return failed(err)
        got = b.login(form.get("token", ""))
        if not got:
            return html(pages.login("that is not a token of this hub: paste the one "
                                    "gitdrop token team/name printed"), 403)
        cookie, key, agent = got
        r = html(pages.logged_in(agent, key))
        r.set_cookie(b.cookie_name(request), cookie, max_age=SESSION_SECONDS, httponly=True,
                     samesite="strict", path="/")
        return r

    async def logout(request):
        refused = cross_site(request)
        if refused:
            return refused
        s = b.session(request)
        if s:
            b.end(s)
        r = RedirectResponse("/", status_code=303)
        r.delete_cookie(b.cookie_name(request), path="/")
        return r

    # --- acting -----------------------------------------------------------------
    def acted(request, where: str, ok: str):
        """Back to `where`, saying `ok`: a code of pages.DONE."""
        return RedirectResponse(f"{where}?ok={ok}", status_code=303)

    def task_move(move):
        async def act(request, agent, form):
            p = request.path_params
            name, tid = p["room"], p["id"]
            kw = {}
            if move == "answer":
                text = form.get("text", "").strip()
                kw = {"answer": text, "note": text}
            elif move == "reject":
                kw = {"note": form.get("reason", "").strip()}

            def do():
                return b.room(name).move_task(agent, tid, move, **kw)
            try:
                await b.call(do)
            except Refusal as err:
                return html(await b.call(task_page, name, tid, agent, err), 409)
            return acted(request, f"/r/{pages.u(name)}/t/{pages.u(tid)}", move)
        return act

    def sender(on_task: bool):
        async def act(request, agent, form):
            p = request.path_params
            name, tid = p["room"], p.get("id", "")
            to, text = form.get("to", "").strip(), form.get("text", "")

            def do():
                return b.room(name).send(agent, to, text, task=tid)
            try:
                await b.call(do)
            except Refusal as err:
                if on_task:
                    return html(await b.call(task_page, name, tid, agent, err), 409)
                return html(await b.call(board_page, name, agent, err), 409)
            where = f"/r/{pages.u(name)}" + (f"/t/{pages.u(tid)}" if on_task else "")
            return acted(request, where, "sent")
        return act

    routes = [
        Route("/", gate(index)),
        Route("/board.js", board_js),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/r/{room}", gate(board)),
        Route("/r/{room}/fragment", gate(fragment)),
        Route("/r/{room}/events", gate(stream)),
        Route("/r/{room}/log", gate(log)),
        Route("/r/{room}/charts", gate(charts_page)),
        Route("/r/{room}/charts/{which}", gate(chart_svg)),
        Route("/r/{room}/t/{id}", gate(task)),
        Route("/r/{room}/a/{agent:path}", gate(agent)),
        Route("/r/{room}/c/{oid}", gate(commit)),
        Route("/r/{room}/inbox", gate(inbox)),
        Route("/r/{room}/inbox/read", action(mark_read), methods=["POST"]),
        Route("/r/{room}/send", action(sender(False)), methods=["POST"]),
        Route("/r/{room}/t/{id}/send", action(sender(True)), methods=["POST"]),
        Route("/r/{room}/t/{id}/answer", action(task_move("answer")), methods=["POST"]),
        Route("/r/{room}/t/{id}/approve", action(task_move("approve")), methods=["POST"]),
        Route("/r/{room}/t/{id}/reject", action(task_move("reject")), methods=["POST"]),
    ]

    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if notifier:
            from ..notifier import Notifier
            b.notifier = Notifier(hub_path).start()
        try:
            yield
        finally:
            b.stopping.set()
            if b.notifier is not None:
                b.notifier.stop()

    guard = [] if require_login else [Middleware(HostGuard, hosts=hosts)]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=guard)
    app.state.board = b
    return app


class HostGuard:
    """A board that reads without a login (bound to this machine) answers only
    requests addressed to this machine by name (the Host header). Otherwise any web
    page the user opens could read it: its name made to resolve to 127.0.0.1 (DNS
    rebinding), the browser takes the board for the page's own site."""

    def __init__(self, app, hosts=LOOPBACK):
        self.app, self.hosts = app, {h.lower() for h in hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            raw = dict(scope.get("headers") or []).get(b"host", b"")
            host = host_of(raw.decode("latin-1"))
            if host not in self.hosts:
                shown = raw.decode("latin-1")[:80]
                body = (f"this board answers to {', '.join(sorted(self.hosts))} only, not "
                        f"{shown!r}: open it at the address gitdrop web printed, or start it "
                        "with --allow-host NAME for a name of your own, a forwarded port's "
                        "(a page that reached it by another name may be reading it for "
                        "someone else)\n").encode()
                await send({"type": "http.response.start", "status": 421,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class _GoneAway:
    """A client that went away mid-request (its body cut off, or closed for taking too
    long: transports/conns.py) is nobody to answer: each such request logged a
    traceback of 45 lines, no login needed to send one."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        from starlette.requests import ClientDisconnect
        try:
            await self.app(scope, receive, send)
        except ClientDisconnect:
            pass


def server(app, host: str, port: int, log_level: str = "warning"):
    """A uvicorn server for the app whose exit (Ctrl-C, or should_exit) also ends the
    open event streams, so it stops at once."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            app.state.board.stopping.set()
            super().handle_exit(sig, frame)

        async def main_loop(self):
            await super().main_loop()     # returns once it should exit
            app.state.board.stopping.set()

    from ..transports.conns import BACKLOG, http_protocol
    # Half-sent requests held open took every descriptor: the board answered nobody
    # and logged a traceback per failed accept (conns.py closes them).
    config = uvicorn.Config(_GoneAway(app), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=2, lifespan="on",
                            http=http_protocol(), backlog=BACKLOG)
    return Server(config)
