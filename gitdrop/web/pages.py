"""The web board's pages: HTML from plain f-strings, every value from the
repository passed through `e()` (titles, bodies, names and messages are anyone's
words: hostile until escaped)."""

from html import escape
from urllib.parse import quote

from .. import fmt
from ..board import TITLES

CSS = """
body{font-family:system-ui,sans-serif;margin:0;background:#fafafa;color:#222}
header{background:#263238;color:#eee;padding:.5em 1em;display:flex;gap:1em;align-items:center}
header a{color:#eee}main{padding:1em}
.cols{display:flex;gap:.6em;overflow-x:auto}.col{flex:1;min-width:150px;background:#fff;
border:1px solid #ddd;border-radius:6px;padding:.4em}
.col h3{margin:.2em 0;font-size:1em}.card{border-top:1px solid #eee;padding:.3em 0;font-size:.9em}
.reason{color:#c62828}.dim{color:#777}.person{color:#6a1b9a;font-weight:bold}
table{border-collapse:collapse}td,th{padding:.2em .6em;text-align:left;border-bottom:1px solid #eee;
vertical-align:top}pre{white-space:pre-wrap;background:#fff;border:1px solid #ddd;padding:.6em}
.refusal{background:#ffebee;border:1px solid #c62828;padding:.6em;margin:.6em 0}
.ok{background:#e8f5e9;border:1px solid #2e7d32;padding:.6em;margin:.6em 0}
.side{display:flex;gap:1em;flex-wrap:wrap}.side>section{flex:1;min-width:300px}
form.inline{display:inline}textarea{width:100%;max-width:40em}
"""


def e(v) -> str:
    return escape("" if v is None else str(v), quote=True)


def u(v) -> str:
    return quote(str(v), safe="")


def when(ts) -> str:
    return fmt.stamp(ts, "%Y-%m-%d %H:%M:%S", local=True) if ts else "-"


def page(title: str, body: str, user: str = "", room: str = "", human: bool = False) -> str:
    nav = '<a href="/">rooms</a>'
    if room:
        r = "/r/" + u(room)
        nav += (f' <a href="{r}">board</a> <a href="{r}/log">log</a> '
                f'<a href="{r}/charts">charts</a>')
    who = (f'signed in as <b>{e(user)}</b>{" (person)" if human else ""} '
           + (f'<a href="/r/{u(room)}/inbox">inbox</a> ' if room else "") +
           '<form class="inline" method="post" action="/logout">'
           '<button>log out</button></form>') if user else '<a href="/login">log in</a>'
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{e(title)} · gitdrop'
            f'</title><meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<style>{CSS}</style></head><body><header><b>gitdrop</b> {nav}'
            f'<span style="margin-left:auto">{who}</span></header><main>{body}</main>'
            f'{SCRIPT}</body></html>')


def refusal(err) -> str:
    if err is None:
        return ""
    fix = f"<div>fix: {e(err.fix)}</div>" if getattr(err, "fix", "") else ""
    return (f'<div class="refusal" id="refusal"><b>refused by rule <code class="rule">'
            f'{e(err.rule)}</code></b><div>why: {e(err.reason)}</div>{fix}</div>')


# What `?ok=` may say: a code of these, never words from the link (anyone can send
# a link that would make the board say anything).
DONE = {"answer": "answer done", "approve": "approve done", "reject": "reject done",
        "sent": "message sent", "read": "inbox marked read"}


def done(code: str) -> str:
    text = DONE.get(code, "")
    return f'<div class="ok">{e(text)}</div>' if text else ""


def agent_link(room: str, agent: str, humans=()) -> str:
    if not agent:
        return '<span class="dim">unassigned</span>'
    mark = ' <span class="person">(person)</span>' if agent in humans else ""
    return f'<a href="/r/{u(room)}/a/{u(agent)}">{e(agent)}</a>{mark}'


def task_link(room: str, tid, title: str = "") -> str:
    return f'<a href="/r/{u(room)}/t/{u(tid)}">#{e(tid)}</a>' + (f" {e(title)}" if title else "")


def commit_link(room: str, oid: str) -> str:
    return f'<a class="commit" href="/r/{u(room)}/c/{u(oid)}"><code>{e(oid[:10])}</code></a>'


def rooms(rows: list[dict], user: str = "", human: bool = False) -> str:
    body = ["<h1>Rooms</h1><table><tr><th>room</th><th>teams</th><th>health</th>"
            "<th>last activity</th></tr>"]
    for r in rows:
        body.append(f'<tr><td><a href="/r/{u(r["room"])}">{e(r["room"])}</a></td>'
                    f'<td>{e(", ".join(r.get("teams", [])))}</td><td>{e(r["health"])}</td>'
                    f'<td>{e(when(r.get("last_activity")))}</td></tr>')
    body.append("</table>")
    return page("rooms", "".join(body), user, human=human)


def form(action: str, inner: str, button: str) -> str:
    """A form that acts: /board.js puts the login's key in its csrf field as it is
    submitted (the key is never in a page: see app.Board.key)."""
    return (f'<form method="post" action="{e(action)}"><input type="hidden" name="csrf" '
            f'value="">{inner}<button>{e(button)}</button></form>')


def board_fragment(data: dict) -> str:
    room = data["room"]
    humans = {a["agent"] for a in data["agents"] if a.get("human")}
    out = [f'<div id="board" data-tip="{e(data["tip"])}"><p class="dim">'
           f'{data["agents_total"]} agents · {data["tasks_total"]} tasks · '
           f'{len(data["questions"])} open questions · {len(data["handshakes"])} '
           f'handshakes waiting · as of {e(when(data["now"]))}</p>']
    out.append('<h2>Agents</h2><table id="agents"><tr><th>agent</th><th>health</th><th>on</th>'
               '<th>last act</th></tr>')
    for a in data["agents"]:
        cur = a["current"]
        on = (task_link(room, cur["id"], cur["title"]) + f' <span class="dim">'
              f'{e(cur["state"])}</span>') if cur else f'<span class="dim">{e(a["status"] or "idle")}</span>'
        out.append(f'<tr><td>{agent_link(room, a["agent"], humans)}{" ★" if a["lead"] else ""}'
                   f'</td><td>{e(a["health"])}</td><td>{on}</td><td><span class="dim">'
                   f'{e(a["last_act_age"])}</span> {e(a["last_act_subject"])}</td></tr>')
    if data["agents_more"]:   # a big room: the busy and recent ones are shown
        out.append(f'<tr class="more"><td colspan="4" class="dim">… {data["agents_more"]} more '
                   f'(<code>gitdrop who</code> lists them all)</td></tr>')
    out.append('</table><h2>Tasks</h2><div class="cols">')
    for c in data["columns"]:
        out.append(f'<div class="col" data-state="{e(c["state"])}"><h3>{e(TITLES[c["state"]])} '
                   f'{c["count"]}</h3>')
        for t in c["tasks"]:
            pri = f' <b>P{e(t["priority"])}</b>' if t["priority"] else ""
            reason = f'<div class="reason">{e(t["reason"])}</div>' if t["reason"] else ""
            out.append(f'<div class="card" data-task="{e(t["id"])}">'
                       f'{task_link(room, t["id"])}{pri} {e(t["title"])}'
                       f'<div class="dim">{agent_link(room, t["assignee"], humans)} · '
                       f'{e(t["age"])}</div>{reason}</div>')
        if c["count"] > len(c["tasks"]):
            out.append(f'<div class="dim">… {c["count"] - len(c["tasks"])} more</div>')
        out.append("</div>")
    out.append('</div><div class="side"><section><h2>Questions for people</h2>')
    for q in data["questions"]:
        out.append(f'<div class="card">{task_link(room, q["task"], q["title"])}<div>'
                   f'{agent_link(room, q["asked_by"], humans)} asks: {e(q["question"])}'
                   f'</div></div>')
    if not data["questions"]:
        out.append('<p class="dim">none</p>')
    out.append("<h2>Handshakes waiting on acks</h2>")
    for h in data["handshakes"]:
        out.append(f'<div class="card">#{e(h["id"])} {e(h["plan"])}<div class="reason">'
                   f'owed by {e(", ".join(h["owed_by"]))}</div></div>')
    if not data["handshakes"]:
        out.append('<p class="dim">none</p>')
    out.append('</section><section><h2>Last events</h2><table id="events">')
    for ev in reversed(data["events"]):
        out.append(f'<tr><td class="dim">{e(when(ev["time"]))}</td><td>'
                   f'{e(ev["author"])}</td><td>{e(ev["subject"])}</td></tr>')
    out.append("</table></section></div></div>")
    return "".join(out)


BOARD_JS = """(function(){
var k=document.querySelector('meta[name=gitdrop-key]');
if(k){localStorage.setItem('gitdrop-key',k.content);location.replace('/');return}
document.addEventListener('submit',function(ev){var f=ev.target.elements.csrf;
if(f){f.value=localStorage.getItem('gitdrop-key')||''}},true);
if(!document.getElementById('board')){return}
var busy=false,again=false;
function refresh(){if(busy){again=true;return}busy=true;
fetch(location.pathname.replace(/\\/$/,'')+'/fragment',{credentials:'same-origin'})
.then(function(r){return r.ok?r.text():null}).then(function(t){
if(t!==null){var b=document.getElementById('board');if(b){b.outerHTML=t}}
busy=false;if(again){again=false;refresh()}}).catch(function(){busy=false})}
var es=new EventSource(location.pathname.replace(/\\/$/,'')+'/events');window.gitdropEvents=es;
var opened=false;es.addEventListener('open',function(){if(opened){refresh()}opened=true});
es.addEventListener('commit',refresh);})();
"""
SCRIPT = '<script src="/board.js"></script>'   # on every page: the forms and the live board


def board(data: dict, user: str, human: bool = False, err=None, ok: str = "") -> str:
    room = data["room"]
    send = ""
    if user:
        send = ("<h2>Send a message</h2>" + form(
            f"/r/{u(room)}/send",
            '<label>to <input name="to" placeholder="team/name, @team or all" required></label> '
            '<br><textarea name="text" rows="3" required></textarea><br>', "send"))
    return page(f"board · {room}", f"<h1>Room {e(room)}</h1>{refusal(err)}{done(ok)}"
                f"{board_fragment(data)}{send}", user, room, human)


def task(room: str, t: dict, moves: list, messages: list, user: str,
         humans=(), human: bool = False, err=None, ok: str = "") -> str:
    tid = str(t["id"])
    rows = [("state", t["state"]), ("priority", t["priority"]),
            ("assignee", None), ("creator", None), ("reviewer", None),
            ("created", when(t.get("created"))), ("updated", when(t.get("updated")))]
    head = []
    for k, v in rows:
        if k in ("assignee", "creator", "reviewer"):
            cell = agent_link(room, t.get(k) or "", humans) if t.get(k) else '<span class="dim">-</span>'
        else:
            cell = e(v)
        head.append(f"<tr><th>{k}</th><td>{cell}</td></tr>")
    for k in ("tags", "requires"):
        if t.get(k):
            head.append(f"<tr><th>{k}</th><td>{e(', '.join(t[k]))}</td></tr>")
    if t.get("after"):
        head.append("<tr><th>after</th><td>" + ", ".join(task_link(room, a) for a in t["after"])
                    + "</td></tr>")
    for k in ("reason", "question", "answer", "note"):
        if t.get(k):
            head.append(f"<tr><th>{k}</th><td>{e(t[k])}</td></tr>")
    body = [f'<h1>Task #{e(tid)} <span id="title">{e(t["title"])}</span></h1>',
            refusal(err), done(ok), f'<table id="header">{"".join(head)}</table>',
            f'<h2>Brief</h2><pre id="brief">{e(t.get("body") or "(no body)")}</pre>']
    if user:
        base = f"/r/{u(room)}/t/{u(tid)}"
        acts = []
        if t["state"] == "feedback":
            acts.append("<h3>Answer the question</h3>" + form(
                base + "/answer", '<textarea name="text" rows="3" required></textarea><br>',
                "answer"))
        if t["state"] == "review":
            acts.append("<h3>Review</h3>" + form(base + "/approve", "", "approve")
                        + form(base + "/reject",
                               '<input name="reason" placeholder="why" size="50" required> ',
                               "reject"))
        acts.append("<h3>Message about this task</h3>" + form(
            base + "/send", f'<label>to <input name="to" value="'
            f'{e(t.get("assignee") or t.get("creator") or "")}" required></label><br>'
            '<textarea name="text" rows="3" required></textarea><br>', "send"))
        body.append("<h2>Act</h2>" + "".join(acts))
    body.append('<h2>Moves</h2><table id="moves"><tr><th>when</th><th>who</th><th>move</th>'
                '<th>commit</th><th>note</th></tr>')
    for m in moves:
        note = m.get("text", "") if m.get("text") != m.get("subject") else ""
        body.append(f'<tr><td>{e(when(m["time"]))}</td><td>{agent_link(room, m["from"], humans)}'
                    f'</td><td>{e(m["op"])}</td><td>{commit_link(room, m["id"])}</td>'
                    f'<td>{e(m["subject"])}<div class="dim">{e(note)}</div></td></tr>')
    body.append('</table><h2>Messages about it</h2><table id="messages">')
    for m in messages:
        body.append(f'<tr><td>{e(when(m["time"]))}</td><td>{agent_link(room, m["from"], humans)}'
                    f' → {e(", ".join(m.get("to", [])))}</td><td>{commit_link(room, m["id"])}</td>'
                    f'<td><pre>{e(m.get("text", ""))}</pre></td></tr>')
    if not messages:
        body.append('<tr><td class="dim">none</td></tr>')
    body.append("</table>")
    return page(f"#{tid} · {room}", "".join(body), user, room, human)


def agent(room: str, a: dict, tasks: list, acts: list, user: str, human: bool = False) -> str:
    rows = "".join(f"<tr><th>{k}</th><td>{e(v)}</td></tr>" for k, v in (
        ("health", a.get("health")), ("status", a.get("status")),
        ("roles", ", ".join(a.get("roles", []))), ("lead", "yes" if a.get("lead") else "no"),
        ("person", "yes" if a.get("human") else "no"), ("last act", when(a.get("last_act")))))
    body = [f'<h1>Agent {e(a["agent"])}{" <span class=person>(person)</span>" if a.get("human") else ""}'
            f'</h1><table>{rows}</table><h2>Tasks</h2><table id="tasks">']
    for t in tasks:
        body.append(f'<tr><td>{task_link(room, t["id"], t["title"])}</td><td>{e(t["state"])}</td></tr>')
    if not tasks:
        body.append('<tr><td class="dim">none</td></tr>')
    body.append('</table><h2>Recent acts</h2>' + log_table(room, acts))
    return page(f"{a['agent']} · {room}", "".join(body), user, room, human)


def log_table(room: str, evs: list) -> str:
    out = ['<table id="log"><tr><th>when</th><th>who</th><th>op</th><th>task</th><th>commit</th>'
           '<th>subject</th></tr>']
    for ev in reversed(evs):
        out.append(f'<tr><td>{e(when(ev["time"]))}</td><td>{agent_link(room, ev["from"])}</td>'
                   f'<td>{e(ev["op"])}</td><td>{task_link(room, ev["task"]) if ev.get("task") else ""}'
                   f'</td><td>{commit_link(room, ev["id"])}</td><td>{e(ev["subject"])}</td></tr>')
    out.append("</table>")
    return "".join(out)


def log(room: str, evs: list, filters: dict, user: str, human: bool = False) -> str:
    inputs = "".join(f'<label>{k} <input name="{k}" value="{e(filters.get(k, ""))}"></label> '
                     for k in ("author", "op", "task"))
    body = (f'<h1>Log of {e(room)}</h1><form method="get">{inputs}<button>filter</button>'
            f'</form><p class="dim">{len(evs)} commits, newest first</p>' + log_table(room, evs))
    return page(f"log · {room}", body, user, room, human)


def charts(room: str, flow: str, activity: str, graph: str, user: str, human: bool = False) -> str:
    body = (f"<h1>Charts of {e(room)}</h1><h2>Cumulative flow of task states</h2>{flow}"
            f"<h2>Activity of each agent</h2>{activity}<h2>Dependencies</h2>{graph}")
    return page(f"charts · {room}", body, user, room, human)


def commit(room: str, c: dict, user: str, human: bool = False) -> str:
    body = (f'<h1>Commit <code>{e(c["id"])}</code></h1><table><tr><th>author</th><td>'
            f'{agent_link(room, c["author"])}</td></tr><tr><th>when</th><td>{e(when(c["time"]))}'
            f'</td></tr></table><h2>{e(c["subject"])}</h2><pre>{e(c["body"])}</pre>')
    return page(f"commit · {room}", body, user, room, human)


def login(err: str = "", need: bool = False) -> str:
    msg = f'<div class="refusal">{e(err)}</div>' if err else ""
    why = "<p>This board needs a login.</p>" if need else ""
    body = (f"<h1>Log in</h1>{why}{msg}<p>Paste a token of this hub (<code>gitdrop token "
            "team/name</code>); you act as that agent.</p><form method=\"post\" action=\"/login\">"
            '<input name="token" type="password" size="60" autocomplete="off" required> '
            "<button>log in</button></form>")
    return page("log in", body)


def logged_in(user: str, key: str) -> str:
    """After a login: /board.js keeps `key` in this browser's storage for this board's
    address, then opens the rooms."""
    body = (f'<meta name="gitdrop-key" content="{e(key)}"><h1>Logged in</h1><p>Signed in as '
            f'<b>{e(user)}</b>. <a href="/">Go on to the rooms</a>. To act from this browser, '
            "its script must run: it keeps your login's key for the forms.</p>")
    return page("logged in", body)


def inbox(room: str, got: dict, user: str, human: bool = False, ok: str = "") -> str:
    rows = []
    for m in got["messages"]:
        rows.append(f'<tr><td>{e(when(m["time"]))}</td><td>{agent_link(room, m["from"])}</td>'
                    f'<td>{e(m["op"])}</td><td>{commit_link(room, m["id"])}</td>'
                    f'<td><pre>{e(m.get("text") or m["subject"])}</pre></td></tr>')
    if not rows:
        rows.append('<tr><td class="dim">nothing unread</td></tr>')
    mark = form(f"/r/{u(room)}/inbox/read", "", "mark all read") if got["unread"] else ""
    body = (f"<h1>Inbox of {e(user)} in {e(room)}</h1>{done(ok)}<p>{got['unread']} unread "
            f"(a message can be sent once they are read)</p>{mark}"
            f'<table id="inbox">{"".join(rows)}</table>')
    return page(f"inbox · {room}", body, user, room, human)


def error(status: int, err) -> str:
    return page(str(status), f"<h1>{status}</h1>{refusal(err)}")
