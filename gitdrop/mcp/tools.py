"""The MCP tools' bodies: each maps its parameters to one core call (gitdrop/core.py,
gitdrop/hub.py) and its result back as a typed dict. No mcp import here: the
server (server.py) registers these methods and carries them over the wire.

Who is calling comes from the session, not from the parameters: `CALLER` is set
per request by the server (the agent bound with `--as` over stdio, the agent of
the bearer token over HTTP). `agent_name`/`from_agent`/`creator` may be omitted
and, when given, must name that agent.
"""

import contextvars
import inspect
import json
import re
import threading
import time
from dataclasses import dataclass

from typing_extensions import NotRequired, TypedDict

from .. import model, tokens
from ..core import LEASE_TTL, count_arg
from ..errors import Conflict, GitdropError, NotFound, Refusal, UsageError
from ..opener import open_hub


@dataclass(frozen=True)
class Caller:
    agent: str = ""     # the authenticated agent (team/name), or ""
    error: str = ""     # why there is none when one was presented or needed
    presented: bool = False  # a bearer token came with the call
    peer: str = ""      # the client's address (HTTP), for the limit on new agents
    token: str = ""     # the presented bearer token's digest: what an HTTP session is bound to


CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("gitdrop_caller", default=Caller())

MAX_INBOX = 100  # check_inbox never returns more than this at once
# Nor more than this many bytes of records (messages, tasks, agents, contracts, notes) in
# one answer, as JSON writes them (escapes and all): an answer carries each twice
# (structured content, and the text copy, where the JSON is escaped once more), about
# three times this on the wire, under the 1 MiB SSE event the SDK's HTTP client accepts.
# At least one record is always returned; a page that stops short says so in `more`.
MAX_PAGE_BYTES = 256 * 1024
MAX_INBOX_BYTES = MAX_PAGE_BYTES   # check_inbox's, the same

# New agents one address may register over HTTP without a token: a burst of
# JOIN_BURST, then one every JOIN_EVERY seconds. Without it, a loop reaching the
# server registered agents (and teams on the hub branch) as fast as commits go.
JOIN_BURST, JOIN_EVERY = 60, 1.0


class Joins:
    """A token bucket per client address for registrations without a token."""

    def __init__(self, burst: int = JOIN_BURST, every: float = JOIN_EVERY):
        self.burst, self.every = burst, every
        self.level: dict[str, tuple[float, float]] = {}   # peer -> (tokens, when)
        self.lock = threading.Lock()

    def take(self, peer: str, now: float | None = None) -> float:
        """0 (and one registration counted) if `peer` may register now, else the
        seconds until it may."""
        now = time.monotonic() if now is None else now
        from ..transports.httpd import client_key
        peer = client_key(peer)
        with self.lock:
            left, at = self.level.get(peer, (self.burst, now))
            left = min(self.burst, left + (now - at) / self.every)
            if left < 1:
                return (1 - left) * self.every
            if len(self.level) > 10000:   # forget the addresses whose bucket is full again
                self.level = {k: v for k, v in self.level.items()
                              if v[0] + (now - v[1]) / self.every < self.burst}
            self.level[peer] = (left - 1, now)
            return 0.0

# The next call to make, per refused rule, in the tools' own words (the core's
# fix names CLI commands).
NEXT = {
    "unread-before-send": "call check_inbox, then send again",
    "unknown-recipient": "call who for the names here (team/name, @team, or all)",
    "not-found": "check the name or id (who, list_tasks, list_contracts, list_rooms, "
                 "path_lease list); if you are the one not registered, call register",
    "ambiguous": "repeat the call with the full name (team/agent)",
    "registered-author": "call register first",
    "room-membership": "ask a lead of the room to call join_room for your team",
    "lead-only": "ask a lead (who shows them) to do it",
    "handshake-go": "if you are a target that has not acked, call ack_handshake first; "
                    "else handshake_status shows who has not acked yet",
    "handshake-ack-once": "call handshake_status",
    "contract-owner": "ask the owner (list_contracts) or a lead to change it",
    "token": "call register without a token to get one (new agents), then send it on every "
             "call as the HTTP header Authorization: Bearer <token>",
    "identity": "omit agent_name/from_agent (the session says who you are), or connect as "
                "that agent",
}


# Commands the core's fixes name, in the tools' words (for rules without a NEXT),
# tried in order (a longer command first); {id} stands for a task id.
CLI_TOOLS = [
    ("gitdrop room settings loop_cap N", 'room_settings with settings={"loop_cap": N}'),
    ("gitdrop handshake ack", "ack_handshake"), ("gitdrop handshake status", "handshake_status"),
    ("gitdrop inbox", "check_inbox"), ("gitdrop who", "who"),
    ("gitdrop task sign {id}", "update_task(task_id={id}, status='sign')"),
    ("gitdrop task renew ID --for SECONDS", "update_task(status='renew')"),
    ("gitdrop task cancel", "update_task(status='cancelled')"),
    ("gitdrop task submit {id}", "submit_for_review(task_id={id}, summary=...)"),
    ("gitdrop task fail {id} --reason ...",
     "update_task(task_id={id}, status='failed', result=...)"),
    ("gitdrop task graph shows the graph", "list_tasks shows each task's after"),
    ("gitdrop task list --state pending", "claim_task without task_id"),
    ("gitdrop task list", "list_tasks"),
    ("gitdrop ready --claim", "claim_task without task_id"),
    ("gitdrop ready", "claim_task without task_id, or list_tasks(ready=true)"),
    ("gitdrop register --cap", "register(caps=...)"),
    ("gitdrop lease take GLOB --ttl ...", "path_lease(action='take', ttl_seconds=...)"),
    ("gitdrop lease list", "path_lease(action='list')"),
    ("(or --shared)", "(or shared=true)"),
    ("gitdrop room restore {room}", "restore_room(room_name='{room}')"),
    ("; its history reads with gitdrop room show {room}", ""),   # no tool reads an archive
    ("read it with gitdrop room show {room}; ", ""),
]
_CLI_TOOLS = [(re.compile(re.escape(cli).replace(re.escape("{id}"), r"(\w+)")
                          .replace(re.escape("{room}"), r"([\w.-]*\w)")),
               tool.replace("{id}", r"\1").replace("{room}", r"\1")) for cli, tool in CLI_TOOLS]
# A closed room's refusal of an agent its team's lead has not named (rules._check_register).
_TEAM_ADD = (re.compile(r"gitdrop team add ([\w.-]+) ([\w.-]+) --as ([\w.-]+/[\w.-]+)"),
             r"register_team(team_name='\1', leader='\3', members='\2'), called by \3 (over "
             r"HTTP the hub's owner then mints this agent's token: gitdrop token \1/\2)")


def _tool_words(fix: str) -> str:
    for cli, tool in _CLI_TOOLS:
        fix = cli.sub(tool, fix)
    return fix


def render_error(e: GitdropError) -> str:
    """A refusal as text an agent can act on: the rule, why, the next call."""
    text = f"REFUSED by rule {e.rule}: {e.reason}"
    if e.commit:
        text += f" [commit {e.commit}]"
    nxt = e.fix
    if nxt and _TEAM_ADD[0].search(nxt):
        nxt = _TEAM_ADD[0].sub(_TEAM_ADD[1], nxt)
    elif e.rule in NEXT and e.rule not in ("token", "identity") and \
            (not nxt or "gitdrop " in nxt) and "operator" not in nxt and \
            "gitdrop room restore" not in nxt:   # a person's act; an archived room's own step
        nxt = NEXT[e.rule]  # the core's fix names a CLI command: name the tool instead
    elif nxt:
        nxt = _tool_words(nxt)
    if nxt:
        text += f"\nNext: {nxt}"
    return text


# The parameters that name the caller: redundant where the session says who calls
# (stdio --as, HTTP tokens), so tools/list leaves them out there; calls that pass
# them are still taken (and checked against the session). register's agent_name
# is the name to register, not one of them.
IDENTITY = ("agent_name", "from_agent", "creator")

# Parameters many tools take, described once; a tool's docstring may describe its
# own (see describe).
PARAMS = {
    "agent_name": "you (optional)", "from_agent": "you (optional)", "creator": "you (optional)",
    "task_id": "task id", "handshake_id": "handshake id", "room_name": "default: this room",
    "team_name": "the team", "project": "a project name",
    "key": "retries with it apply once",
}


def describe(fn) -> tuple[str, dict[str, str]]:
    """A tool's description and its parameters': the docstring's first paragraph,
    then its `parameter: text` lines (a line that starts otherwise goes on the one
    before); a parameter the docstring does not describe takes PARAMS'."""
    head, _, rest = inspect.cleandoc(fn.__doc__ or "").partition("\n\n")
    names = [n for n in inspect.signature(fn).parameters if n != "self"]
    own: dict[str, str] = {}
    last = ""
    for line in rest.splitlines():
        name, sep, text = line.partition(": ")
        if sep and name in names:
            own[name], last = text.strip(), name
        elif last and line.strip():
            own[last] += " " + line.strip()
    return " ".join(head.split()), {n: own.get(n) or PARAMS.get(n, "") for n in names}


# --- typed results ------------------------------------------------------------
class Registered(TypedDict):
    agent: str
    updated: bool
    token: str
    next: str


class AgentInfo(TypedDict):
    agent: str
    roles: list[str]
    status: str
    lead: bool
    health: str
    last_seen: int
    caps: list[str]
    tasks: list[str]        # the open tasks it holds
    last_claimed: str       # task ids, "" for none
    last_completed: str


class Agents(TypedDict):
    agents: list[AgentInfo]
    more: int               # agents past this page (ask again with offset)


class Done(TypedDict):
    agent: str
    commit: str


Message = TypedDict("Message", {
    "id": str, "op": str, "from": str, "to": list[str], "cc": list[str], "time": int,
    "text": str, "task": str, "handshake": str, "via": str,
    "person": NotRequired[bool]})   # from a person (register --human), not a program


class Sent(TypedDict):
    to: list[str]
    cc: list[str]
    commit: str
    hints: NotRequired[list[str]]   # a recipient that looks dead may not read it soon


class Inbox(TypedDict):
    messages: list[Message]
    remaining: int


class History(TypedDict):
    messages: list[Message]


class Task(TypedDict):
    id: str
    title: str
    state: str
    creator: str
    assignee: str
    reviewer: str
    priority: int
    tags: list[str]
    project: str
    handshake: int
    retries: int
    note: str
    question: str
    answer: str
    description: str
    after: list[str]        # the tasks it waits on
    requires: list[str]     # capabilities its assignee needs
    parent: str
    waiting_on: list[str]   # of after, those not completed yet
    blocked_by: str         # a dependency that failed or was cancelled, "" for none


class Tasks(TypedDict):
    tasks: list[Task]
    more: int               # tasks past this page (ask again with offset)


class TaskMove(TypedDict):
    id: str
    state: str
    assignee: str
    commit: str


class Claimed(TaskMove):
    title: NotRequired[str]  # claim_task without task_id: the task taken ("" id: none ready)
    description: NotRequired[str]  # and its body (a brief, when it is one)


class Lease(TypedDict):
    id: str
    holder: str
    glob: str
    mode: str               # exclusive or shared
    until: int
    left: int               # seconds to go


class Leases(TypedDict):
    leases: list[Lease]
    commit: str


class Handshake(TypedDict):
    id: int
    status: str
    initiator: str
    targets: list[str]
    acked: list[str]
    pending: list[str]
    plan: str


class HandshakeAck(TypedDict):
    id: int
    status: str
    acks: list[str]
    commit: str


class Contract(TypedDict):
    name: str
    owner: str
    type: str
    version: int
    project: str
    spec: str


class Contracts(TypedDict):
    contracts: list[Contract]


class Declared(TypedDict):
    name: str
    version: int
    owner: str
    commit: str


class ContextSet(TypedDict):
    key: str
    commit: str


class SharedContext(TypedDict):
    context: dict[str, str]


class Team(TypedDict):
    name: str
    lead: str
    members: list[str]


class Teams(TypedDict):
    teams: list[Team]


class TeamChanged(Team):
    handed_over_in: NotRequired[list[str]]   # rooms whose lead entry went to the new lead


class RoomInfo(TypedDict):
    room: str
    status: str
    teams: list[str]
    pinned: bool
    health: str
    last_activity: int


class Rooms(TypedDict):
    rooms: list[RoomInfo]


class RoomChange(TypedDict):
    room: str
    done: bool


class RoomDestroyed(RoomChange):
    waiting_for: NotRequired[list[str]]  # leads whose consent is still missing


class RoomSettings(TypedDict):
    room: str
    settings: dict[str, int]
    overrides: dict[str, int]   # what the room sets; the rest are defaults


class RoomStatus(TypedDict):
    room: str
    teams: list[str]
    leads: dict[str, str]
    pinned: bool
    agents: list[str]       # the first 50 (who pages through all)
    agents_more: int
    open_tasks: int
    tasks: int
    last_activity: int
    last: str


# --- converters -----------------------------------------------------------------
def _split(s: str) -> list[str]:
    return [x.strip() for x in (s or "").split(",") if x.strip()]


def _message(ev: dict) -> Message:
    text = ev["text"] if ev["op"] == "send" else (
        ev["subject"] + (f"\n\n{ev['text']}" if ev.get("text") else ""))
    return {"id": ev["id"], "op": ev["op"], "from": ev["from"], "to": ev["to"], "cc": ev["cc"],
            "time": ev["time"], "text": text, "task": str(ev.get("task") or ""),
            "handshake": str(ev.get("handshake") or ""), "via": ev.get("via", ""),
            **({"person": True} if ev.get("person") else {})}


def _size(record) -> int:
    return len(json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _fit(records) -> int:
    """How many of `records`, from the first, one answer carries: they add up to at
    most MAX_PAGE_BYTES as JSON (at least one)."""
    count = total = 0
    for r in records:
        total += _size(r)
        if count and total > MAX_PAGE_BYTES:
            break
        count += 1
    return count


def _fitting(evs: list[dict]) -> int:
    """How many of `evs`, from the first, one answer carries, as messages."""
    return _fit(_message(e) for e in evs)


def _page(records: list, more: int) -> tuple[list, int]:
    """A page of `records` cut to what one answer carries, and `more` counting the
    ones cut: the next page starts at offset + len(page), none skipped or repeated."""
    n = _fit(records)
    return records[:n], more + len(records) - n


def _left_out(records: list[dict], field: str, fix: str) -> list[dict]:
    """`records` with `field` (the bulk) replaced, past what one answer carries, by
    a note saying so and how to read it: fix(record) names the call."""
    total, out = 0, []
    for r in records:
        if out and total + _size(r) > MAX_PAGE_BYTES:
            r = dict(r, **{field: f"[left out: one answer holds {MAX_PAGE_BYTES >> 10} KB; "
                           f"{fix(r)}]"})
        total += _size(r)
        out.append(r)
    return out


def _sent(r: dict) -> Sent:
    out = {"to": r["to"], "cc": r["cc"], "commit": r.get("commit", "")}
    if r.get("hints"):
        out["hints"] = r["hints"]
    return out


def _task(t: dict) -> Task:
    out = {k: t[k] for k in Task.__annotations__ if k in t}
    out["id"] = str(t["id"])
    out["description"] = t.get("body", "").rstrip("\n")
    out["parent"] = str(t.get("parent") or "")
    return out


def _lease(x: dict, now: int) -> Lease:
    return {"id": x["id"], "holder": x["holder"], "glob": x["glob"], "mode": x["mode"],
            "until": x["until"], "left": max(0, x["until"] - now)}


def _move(r: dict) -> TaskMove:
    return {"id": str(r["id"]), "state": r["state"], "assignee": r["assignee"],
            "commit": r.get("commit", "")}


def _contract(c: dict) -> Contract:
    return {"name": c["name"], "owner": c["owner"], "type": c["kind"], "version": c["version"],
            "project": c["project"], "spec": c.get("spec", "")}


def _as_int(value, what: str) -> int:
    return count_arg(what, value, None)


def _int_id(value, what: str) -> str:
    s = str(value).strip().lstrip("#")
    if not s:
        raise UsageError(f"no {what} given", f"pass {what}")
    return s


ONBOARDING = ("Registered. Protocol: call check_inbox now and whenever you are notified; "
              "read before you send (send is refused while you have unread messages); "
              "check_inbox(again=true) shows your last read once more (a call that got "
              "no answer, a restart). "
              "Ack handshakes addressed to you before starting bound work. Find work: "
              "claim_task without task_id takes the best task ready for you. Work a task: "
              "update_task(status='in_progress'), then submit_for_review; ask with "
              "request_feedback when blocked; path_lease the files you will edit when "
              "others work in the same repository.")


class ToolBox:
    """One server's view of a hub: its room, the transport, the bound agent."""

    def __init__(self, hub_path: str, room: str, agent: str | None = None,
                 transport: str = "stdio", registration: str = "open"):
        self.hub_spec = hub_path  # a path, or a git URL (a RemoteHub: writes are pushed)
        self.hub = open_hub(hub_path, create=False)
        self.room_name = room
        self.room = self.hub.room(room)
        self.transport = "http" if transport in ("http", "streamable-http") else "stdio"
        self.verifier = tokens.Verifier(self.hub.path)
        # --as (stdio): the process speaks for that agent only; over HTTP tokens decide
        self.fixed = bool(agent) and self.transport == "stdio"
        self.bound = self._full(agent) if self.fixed else ""
        # HTTP: "open" registers a new agent that calls without a token (and hands
        # it its token), at most as fast as `joins` lets one address; "closed"
        # takes only tokens the hub's owner minted.
        self.registration = registration
        self.joins = Joins()
        self.sessions = Joins()   # sessions opened without a token, per address (doors.py)

    def _full(self, name: str) -> str:
        """A full id for --as NAME: as given, or a registered short name resolved."""
        if "/" in name:
            return name
        try:
            return self.room.resolve(name)
        except NotFound:
            return name  # completed by register(team=...)

    # --- who is calling -------------------------------------------------------
    def identify(self, headers, peer: str = "") -> Caller:
        """The caller of one request: the bound agent (stdio) or the token's (HTTP)."""
        if self.transport == "stdio":
            return Caller(self.bound)
        auth = headers.get("authorization", "") if headers is not None else ""
        if not auth:
            return Caller(peer=peer)
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Caller("", "the Authorization header is not 'Bearer <token>'", True, peer)
        sha = tokens.digest(token.strip())
        agent = self.verifier.holder(sha)
        if not agent:
            return Caller("", "the bearer token is not valid for this hub (a token "
                          "rotated or revoked is no longer valid)", True, peer, sha)
        return Caller(agent, "", True, peer, sha)

    def authorize(self, tool: str) -> None:
        """Over HTTP every call but a first register carries a valid token."""
        if self.transport == "http" and tool != "register":
            self.me("", registered=False)

    def caller(self) -> Caller:
        c = CALLER.get()
        if self.transport == "stdio" and not c.agent and self.bound:
            return Caller(self.bound)
        return c

    def me(self, given: str = "", registered: bool = True) -> str:
        """The acting agent: the session's; `given` must name it when present."""
        c = self.caller()
        if c.error or (self.transport == "http" and not c.agent):
            raise Refusal("token", c.error or "no bearer token came with this call",
                          NEXT["token"])
        if c.agent:
            if "/" not in c.agent:
                raise Refusal("registered-author", f"{c.agent!r} is not registered in room "
                              f"{self.room_name!r}", "call register with your team")
            if given and given not in (c.agent, model.short(c.agent)):
                raise Refusal("identity", f"this session acts for {c.agent}; it cannot act "
                              f"for {given!r}", NEXT["identity"])
            return c.agent
        if not given:
            raise UsageError("who is calling? this server is not bound to an agent",
                             "pass agent_name/from_agent, or call register first")
        if not registered and model.is_agent_id(given):
            return given
        return self.room.resolve(given)

    # --- messaging ------------------------------------------------------------------
    def register(self, agent_name: str = "", role: str = "", description: str = "",
                 team: str = "", token: str = "", caps: str = "") -> Registered:
        """Join the room, or update your profile. Over HTTP, returns your token
        (header Authorization: Bearer <token>).

        agent_name: your name, or team/name
        role: comma list (lead, coder, ...)
        description: what you do
        team: your team
        token: yours, if you have one (HTTP)
        caps: your capabilities, comma list (replaces them)
        """
        c = self.caller()
        if c.error:
            raise Refusal("token", c.error, NEXT["token"])
        name = agent_name.strip() or (model.short(c.agent) if c.agent else "")
        if not name:
            raise UsageError("no agent_name given", "pass agent_name (and team)")
        if "/" in name:
            agent_id = name
            if team and model.split_agent(name)[0] != team:
                raise UsageError(f"{name} is not in team {team!r}", "give one team")
        elif team:
            agent_id = f"{team}/{name}"
        elif c.agent and "/" in c.agent and model.short(c.agent) == name:
            agent_id = c.agent
        else:
            agent_id = f"{model.DEFAULT_TEAM}/{name}"
        if c.agent and agent_id != c.agent and not (
                "/" not in c.agent and model.short(agent_id) == c.agent):
            raise Refusal("identity", f"this session acts for {c.agent}; it cannot register "
                          f"{agent_id}", NEXT["identity"])
        mint = False
        if self.transport == "http" and not c.agent:
            if token:
                if self.verifier.agent(token) != agent_id:
                    raise Refusal("token", f"the token is not {agent_id}'s", NEXT["token"])
            elif self.verifier.has(agent_id):
                raise Refusal("token", f"{agent_id} already has a token", "send it as the "
                              "header Authorization: Bearer <token> (or as token=...)")
            else:   # a name someone has anywhere on the hub (tokens are hub-wide)
                here = self.room.view().agent(agent_id) is not None
                where = "" if here else self.hub.where_known(agent_id)
                if here or where:
                    raise Refusal("token", f"{agent_id} is registered"
                                  + (f" on this hub ({where})" if where else "")
                                  + " but has no token",
                                  f"ask the hub's owner to mint one (gitdrop token {agent_id})")
                self._may_join(c, agent_id)
                mint = True
        try:
            r = self.room.register(agent_id, _split(role), description, new_only=mint,
                                   caps=_split(caps) if caps.strip() else None)
        except Conflict as e:  # someone registered the name at the same moment
            raise Refusal("token", e.reason, e.fix) from None
        new_token = tokens.mint(self.hub.path, agent_id) if mint else ""
        if self.transport == "stdio" and (not self.fixed or "/" not in self.bound):
            self.bound = agent_id  # this session now speaks for the registered agent
        return {"agent": agent_id, "updated": bool(r.get("updated")),
                "token": new_token, "next": ONBOARDING}

    def _may_join(self, c: Caller, agent_id: str) -> None:
        """A new agent registering over HTTP without a token: past the burst one
        address may register at once, refused. (A closed server gets no call without
        a token this far: its door, mcp/doors.py, answers 401 first.)"""
        wait = self.joins.take(c.peer)
        if wait:
            raise Refusal("token", f"{c.peer or 'this address'} registered "
                          f"{self.joins.burst} new agents in a short time; this server "
                          f"takes one every {self.joins.every:g}s from one address after that",
                          f"wait {max(1, round(wait))}s and register again, or ask the hub's "
                          f"owner for your token (gitdrop token {agent_id})")

    def deregister(self, agent_name: str = "") -> Done:
        """Leave the room (messages stay)."""
        me = self.me(agent_name)
        r = self.room.deregister(me)
        return {"agent": r["agent"], "commit": r.get("commit", "")}

    def who(self, offset: int = 0) -> Agents:
        """Agents, 50 a page (healthy <120 s, stale <600 s).

        offset: skip N
        """
        r = self.room.who_page(max(0, _as_int(offset or 0, "offset")), PAGE)
        agents, more = _page([{k: a[k] for k in AgentInfo.__annotations__}
                              for a in r["agents"]], r["more"])   # status lines can be long
        return {"agents": agents, "more": more}

    def set_status(self, status: str, agent_name: str = "") -> Done:
        """Set your status line (shown by who).

        status: a short line
        """
        r = self.room.set_status(self.me(agent_name), status)
        return {"agent": r["agent"], "commit": r.get("commit", "")}

    def ping(self, agent_name: str = "") -> Done:
        """Heartbeat for who's health."""
        r = self.room.ping(self.me(agent_name))
        return {"agent": r["agent"], "commit": r.get("commit", "")}

    def send(self, to_agent: str, message: str, from_agent: str = "", cc: str = "",
             task_id: str | int = "", reply_to: str | int = "", key: str = "") -> Sent:
        """Message agents. Refused while you have unread mail.

        to_agent: comma list of team/name (short if unique), @team or all
        message: the text
        cc: as to_agent
        task_id: the task it is about
        reply_to: the message answered (its id)
        """
        r = self.room.send(self.me(from_agent), _split(to_agent), message, _split(cc),
                           task=str(task_id or ""), reply_to=str(reply_to or ""), key=key)
        return _sent(r)

    def broadcast(self, message: str, from_agent: str = "") -> Sent:
        """Message everyone in the room.

        message: the text
        """
        r = self.room.send(self.me(from_agent), [model.ALL], message)
        return _sent(r)

    def check_inbox(self, agent_name: str = "", limit: int = 20, again: bool = False) -> Inbox:
        """Read your unread messages and notices, oldest first (remaining: how many
        more).

        limit: at most 100
        again: your last read again (its answer lost)
        """
        limit = max(1, min(int(limit or 20), MAX_INBOX))   # again: the whole last read
        r = self.room.inbox(self.me(agent_name), limit, fits=_fitting, again=bool(again))
        return {"messages": [_message(e) for e in r["messages"]], "remaining": r["remaining"]}

    def get_history(self, count: int = 10, task_id: str | int = "") -> History:
        """The room's last messages; marks nothing read.

        count: at most 100
        task_id: only this task's
        """
        n = max(1, min(int(count or 10), MAX_INBOX))
        evs = self.room.history(n, str(task_id or ""))[::-1]   # the newest that fit
        return {"messages": [_message(e) for e in evs[:_fitting(evs)][::-1]]}

    # --- tasks ----------------------------------------------------------------------
    def create_task(self, title: str, creator: str = "", description: str = "",
                    assigned_to: str = "", project: str = "", priority: int = 0,
                    tags: str = "", reviewer: str = "", handshake_id: int = 0,
                    key: str = "", after: str = "", requires: str = "",
                    parent: str | int = "", review: bool = True, brief: bool = False) -> TaskMove:
        """New task: pending, or assigned.

        title: one line
        description: the details
        assigned_to: the assignee
        priority: higher first
        tags: comma list
        reviewer: default: a lead
        handshake_id: no start before it is GO
        after: comma list of task ids it waits on
        requires: comma list of capabilities its assignee needs
        parent: the task it is part of
        review: false: no review
        brief: description is a brief
        """
        r = self.room.create_task(self.me(creator), title, description, assigned_to,
                                  priority=priority, tags=_split(tags),
                                  handshake=handshake_id, project=project, reviewer=reviewer,
                                  key=key, after=_split(after), requires=_split(requires),
                                  parent=str(parent or ""), review=review, brief=brief)
        return {"id": str(r["id"]), "state": r["state"], "assignee": r["assignee"],
                "commit": r.get("commit", "")}

    def edit_task(self, task_id: str | int, title: str = "", priority: str = "",
                  tags: str = "", after: str = "", requires: str = "", review: str = "",
                  handshake_id: str = "", agent_name: str = "") -> TaskMove:
        """Change a task. Empty: unchanged; none: empty a list.

        title: new title
        priority: higher first
        tags: comma list
        after: ids it waits on
        requires: capabilities
        review: true or false
        handshake_id: rebind (none: unbind)
        """
        edits: dict = {"title": title} if title else {}
        if priority:
            edits["priority"] = _as_int(priority, "priority")
        if review:
            edits["review"] = review.strip().lower() in ("true", "1", "yes")
        if handshake_id:   # one the room has not, or past 64 bits: the rules refuse it
            hid = str(handshake_id).strip()
            edits["handshake"] = 0 if hid == "none" else _as_int(hid.lstrip("#"),
                                                                 "handshake_id")
        for k, v in (("tags", tags), ("after", after), ("requires", requires)):
            if v:
                edits[k] = [] if v.strip() == "none" else [x.lstrip("#") for x in _split(v)]
        if not edits:
            raise UsageError("nothing to change", "pass title, priority, tags, after, "
                             "requires, review or handshake_id")
        return self._move(agent_name, task_id, "edit", **edits)

    def _move(self, agent_name, task_id, move, **kw) -> TaskMove:
        return _move(self.room.move_task(self.me(agent_name), _int_id(task_id, "task_id"),
                                         move, **kw))

    def update_task(self, task_id: str | int, status: str = "", agent_name: str = "",
                    assigned_to: str = "", result: str = "") -> TaskMove:
        """Move a task to a status (or reassign it).

        status: assigned, in_progress, review, completed, failed, blocked, cancelled; renew (your lease), reap (an expired one), sign (a lead's, cross-team)
        assigned_to: the new assignee
        result: note or reason
        """
        me = self.me(agent_name)
        tid = _int_id(task_id, "task_id")
        if status in ("renew", "reap", "sign"):
            return _move(self.room.move_task(me, tid, status, note=result))
        if not status:
            if not assigned_to:
                raise UsageError("nothing to change", "pass status and/or assigned_to")
            return _move(self.room.move_task(me, tid, "assign", note=result,
                                             assignee=assigned_to))
        return _move(self.room.move_task_to(me, tid, status, note=result, assignee=assigned_to))

    def claim_task(self, task_id: str | int = "", agent_name: str = "",
                   tag: str = "") -> Claimed:
        """Take a pending task; without task_id, the best one ready for you (empty id:
        none is).

        tag: only tasks with it
        """
        if str(task_id).strip():
            return self._move(agent_name, task_id, "claim")
        me = self.me(agent_name)
        r = self.room.claim_next(me, tag)
        if not r["task"]:
            return {"id": "", "state": "", "assignee": "", "commit": "", "title": ""}
        return {"id": r["task"], "state": r["state"], "assignee": r.get("assignee") or me,
                "commit": r.get("commit", ""), "title": r["title"],
                "description": self.room.task(r["task"])["body"].rstrip("\n")}

    def list_tasks(self, status: str = "", assigned_to: str = "", project: str = "",
                   tag: str = "", ready: bool = False, offset: int = 0) -> Tasks:
        """By priority, 50 a page.

        status: comma list; done if named
        assigned_to: a name, or none
        tag: has it
        ready: what you may take
        offset: skip N
        """
        offset = max(0, _as_int(offset or 0, "offset"))
        if ready:
            got = [t for t in self.room.ready(self.me(), tag, limit=0)
                   if not project or t["project"] == project]
            page = got[offset:offset + PAGE]
            more = max(0, len(got) - offset - len(page))
        else:
            r = self.room.task_page(status, assigned_to, tag=tag, project=project,
                                    offset=offset, limit=PAGE)
            page, more = r["tasks"], r["more"]
        tasks, more = _page([_task(self.room.task(t["id"])) for t in page], more)
        return {"tasks": tasks, "more": more}   # descriptions run to 64 KB each

    def submit_for_review(self, task_id: str | int, summary: str, agent_name: str = "",
                          files_changed: str | list[str] = "",
                          test_results: str = "") -> TaskMove:
        """Hand your in_progress task to review.

        summary: what you did
        files_changed: a list, or a comma list
        test_results: how the tests went
        """
        note = summary.strip()
        files = _split(files_changed) if isinstance(files_changed, str) else files_changed
        if files:
            note += f"\n\nFiles changed: {', '.join(files)}"
        if test_results:
            note += f"\n\nTest results: {test_results}"
        return self._move(agent_name, task_id, "submit", note=note)

    def approve_task(self, task_id: str | int, agent_name: str = "", notes: str = "") -> TaskMove:
        """Reviewer: approve a task in review (completed).

        notes: for the assignee
        """
        return self._move(agent_name, task_id, "approve", note=notes)

    def reject_task(self, task_id: str | int, reason: str, agent_name: str = "") -> TaskMove:
        """Reviewer: send a task in review back for rework.

        reason: what to redo
        """
        return self._move(agent_name, task_id, "reject", note=reason)

    def request_feedback(self, task_id: str | int, question: str,
                         agent_name: str = "") -> TaskMove:
        """Ask your task's creator a question (task waits in feedback).

        question: the question
        """
        return self._move(agent_name, task_id, "ask", question=question, note=question)

    def respond_feedback(self, task_id: str | int, answer: str,
                         agent_name: str = "") -> TaskMove:
        """Answer a task's question (back to in_progress).

        answer: the answer
        """
        return self._move(agent_name, task_id, "answer", answer=answer, note=answer)

    # --- handshakes -------------------------------------------------------------------
    def initiate_handshake(self, message: str, agents: str = "",
                           from_agent: str = "") -> Handshake:
        """Lead: propose a plan that targets must ack before bound work starts.

        message: the plan
        agents: comma list (default: everyone else)
        """
        r = self.room.start_handshake(self.me(from_agent), message, _split(agents))
        return self._handshake(r["id"])

    def ack_handshake(self, handshake_id: int, agent_name: str = "") -> HandshakeAck:
        """Ack a handshake's plan (targets, once); GO when all have."""
        r = self.room.ack_handshake(self.me(agent_name), handshake_id)
        return {"id": r["id"], "status": r["status"], "acks": r["acks"],
                "commit": r.get("commit", "")}

    def _handshake(self, hid) -> Handshake:
        h = self.room.handshake(hid)
        return {k: h[k] for k in Handshake.__annotations__}

    def handshake_status(self, handshake_id: int) -> Handshake:
        """A handshake: its plan, who acked, who is pending."""
        return self._handshake(handshake_id)

    # --- contracts and shared context ---------------------------------------------------
    def declare_contract(self, name: str, type: str, spec: str, agent_name: str = "",
                         project: str = "") -> Declared:
        """Declare or change (owner or lead) a shared interface.

        name: e.g. api.users
        type: function, dom_id, css_class, file_path, api_endpoint, event, schema or other
        spec: the interface
        """
        r = self.room.declare_contract(self.me(agent_name), name, spec, type, project)
        return {"name": r["name"], "version": r["version"], "owner": r["owner"],
                "commit": r.get("commit", "")}

    def list_contracts(self, project: str = "", owner: str = "", type: str = "") -> Contracts:
        """Contracts with specs.

        owner: filter
        type: filter
        """
        contracts = [_contract(c) for c in self.room.contracts(project, owner, type)]
        return {"contracts": _left_out(contracts, "spec", lambda c: (
            f"list_contracts with owner={c['owner']!r} and type={c['type']!r} (and "
            "project) lists fewer"))}

    def share_context(self, key: str, value: str, agent_name: str = "") -> ContextSet:
        """Set a room-wide note.

        key: the note's name
        value: text (empty clears)
        """
        r = self.room.set_context(self.me(agent_name), key, value if value else None)
        return {"key": r["key"], "commit": r.get("commit", "")}

    def get_shared_context(self, key: str = "") -> SharedContext:
        """Shared notes.

        key: one (default: all)
        """
        notes = [{"key": k, "value": v} for k, v in self.room.context(key).items()]
        return {"context": {n["key"]: n["value"] for n in _left_out(notes, "value", lambda n: (
            f"get_shared_context with key={n['key']!r} reads it"))}}

    # --- path leases on the work repository ---------------------------------------------
    def path_lease(self, action: str = "list", glob: str = "", shared: bool = False,
                   ttl_seconds: int = LEASE_TTL, agent_name: str = "") -> Leases:
        """Reserve repository paths before editing (refused, naming the holder, if
        another's lease overlaps); release; list live ones.

        action: take, release or list
        glob: e.g. src/api/**; release: it or the lease's id
        shared: others may take shared ones too
        ttl_seconds: how long it holds
        """
        if action == "list":
            now = self.room.clock()
            return {"leases": [_lease(x, now) for x in self.room.leases()], "commit": ""}
        if action == "take":
            r = self.room.take_lease(self.me(agent_name), glob, shared=shared,
                                     ttl=int(ttl_seconds))
        elif action == "release":
            if not glob:
                raise UsageError("nothing to release", "pass glob: the lease's glob or id")
            r = self.room.release_lease(self.me(agent_name), glob)
        else:
            raise UsageError(f"unknown action {action!r}", "use take, release or list")
        # the time left as of now, after the write: read before it, a take that crossed
        # a second's edge was said to hold one second more than it was given
        return {"leases": [_lease(r, self.room.clock())], "commit": r.get("commit", "")}

    # --- rooms and teams ------------------------------------------------------------------
    def register_team(self, team_name: str, leader: str, members: str = "") -> TeamChanged:
        """Create or change (its lead) a team.

        leader: its lead
        members: comma list to add
        """
        t = self.hub.register_team(team_name, leader, _split(members),
                                   by=self.me("", registered=False))
        out: TeamChanged = {"name": t["name"], "lead": t["lead"], "members": t["members"]}
        if t.get("handed_over_in"):
            out["handed_over_in"] = t["handed_over_in"]
        return out

    def list_teams(self) -> Teams:
        """The hub's teams."""
        return {"teams": [{"name": t["name"], "lead": t["lead"], "members": t["members"]}
                          for t in self.hub.teams()]}

    def create_room(self, name: str, teams: str = "", creator: str = "",
                    project: str = "") -> RoomChange:
        """New room for teams.

        name: the room
        teams: comma list (none: open)
        project: unused
        """
        r = self.hub.create_room(self.me(creator, registered=False), name, _split(teams))
        return {"room": r["room"], "done": True}

    def list_rooms(self, status: str = "active") -> Rooms:
        """The hub's rooms.

        status: active, archived or all
        """
        return {"rooms": [{k: r[k] for k in RoomInfo.__annotations__}
                          for r in self.hub.rooms(status or "active")]}

    def join_room(self, team_name: str, room_name: str = "") -> RoomChange:
        """Add a team to a room."""
        r = self.hub.join_room(team_name, room_name or self.room_name,
                               by=self.me("", registered=False))
        return {"room": r["room"], "done": r["joined"]}

    def leave_room(self, team_name: str, room_name: str = "") -> RoomChange:
        """Take a team out of a room."""
        r = self.hub.leave_room(team_name, room_name or self.room_name,
                                by=self.me("", registered=False))
        return {"room": r["room"], "done": r["left"]}

    def archive_room(self, room_name: str) -> RoomChange:
        """Room lead: archive a room (history kept).

        room_name: the room
        """
        r = self.hub.archive_room(room_name, by=self.me("", registered=False))
        return {"room": r["room"], "done": r["archived"]}

    def restore_room(self, room_name: str) -> RoomChange:
        """Room lead: bring an archived room back, as it was.

        room_name: the room
        """
        r = self.hub.restore_room(room_name, by=self.me("", registered=False))
        return {"room": r["room"], "done": not r["archived"]}

    def destroy_room(self, room_name: str) -> RoomDestroyed:
        """Room lead: delete a room for good.

        room_name: the room
        """
        r = self.hub.destroy_room(room_name, by=self.me("", registered=False))
        out: RoomDestroyed = {"room": r["room"], "done": r["destroyed"]}
        if not r["destroyed"]:
            out["waiting_for"] = r.get("waiting_for", [])
        return out

    def room_status(self, room_name: str = "") -> RoomStatus:
        """A room's teams, leads, agents, task counts."""
        r = self.hub.room_status(room_name or self.room_name, 0, PAGE)
        return {k: r[k] for k in RoomStatus.__annotations__}

    def get_my_rooms(self, team_name: str = "") -> Rooms:
        """Rooms of a team.

        team_name: default: yours
        """
        team = team_name or model.split_agent(self.me("", registered=False))[0]
        return {"rooms": [{k: r[k] for k in RoomInfo.__annotations__}
                          for r in self.hub.rooms_of_team(team)]}

    def pin_room(self, room_name: str = "", pinned: bool = True) -> RoomChange:
        """Pin (or unpin) a room: never archived or expired.

        pinned: false unpins
        """
        r = self.hub.pin_room(room_name or self.room_name, by=self.me("", registered=False),
                              pinned=pinned)
        return {"room": r["room"], "done": r["pinned"] == pinned}

    def room_settings(self, settings: dict[str, int] | None = None,
                      room_name: str = "") -> RoomSettings:
        """A room's settings, by name (the answer lists them all).

        settings: {name: number} to change (leads); none: read
        """
        by = self.me("", registered=False) if settings else ""
        r = self.hub.room_settings(room_name or self.room_name, by, settings or {})
        return {"room": r["room"], "settings": r["settings"], "overrides": r["overrides"]}

    # --- resources (JSON text) ----------------------------------------------------------
    def inbox_resource(self, team: str, name: str) -> str:
        agent = f"{team}/{name}"
        me = self.me(agent)
        r = self.room.inbox(me, MAX_INBOX, peek=True, fits=_fitting)
        return _json({"agent": me, "messages": [_message(e) for e in r["messages"]],
                      "remaining": r["remaining"], "unread": r["unread"]})

    def board_resource(self) -> str:
        """The first page of open tasks, as list_tasks gives it (a room of 10,000
        tasks made this megabytes, past a client's limit); `more`: how many follow."""
        self.authorize("")
        r = self.room.task_page(limit=PAGE)
        return _json({"tasks": [_task(dict(t, body="")) for t in r["tasks"]], "more": r["more"]})

    def task_resource(self, task_id: str) -> str:
        self.authorize("")
        return _json(_task(self.room.task(task_id)))

    def room_resource(self) -> str:
        self.authorize("")
        agents = self.room.who_page(0, PAGE)["agents"]
        return _json({"status": self.hub.room_status(self.room_name, 0, PAGE),
                      "agents": agents[:_fit(agents)]})


def _json(data) -> str:
    return json.dumps(data, ensure_ascii=False, indent=1)


def inbox_uri(agent_id: str) -> str:
    return f"gitdrop://inbox/{agent_id}"


# Tool name → the profiles that load it. agent: what every agent needs; lead: plus
# task, handshake and room management; all: everything.
PAGE = 50   # agents in one answer: a room of thousands stays far below a client's limit
PROFILES = ("agent", "lead", "all")
TOOLS = {
    "register": "agent", "who": "agent", "set_status": "agent", "ping": "agent",
    "send": "agent", "check_inbox": "agent", "get_history": "lead",
    "list_tasks": "agent", "claim_task": "agent", "update_task": "agent",
    "submit_for_review": "agent", "request_feedback": "agent",
    "ack_handshake": "agent", "handshake_status": "agent",
    "declare_contract": "agent", "list_contracts": "agent",
    "share_context": "agent", "get_shared_context": "agent", "path_lease": "agent",
    "broadcast": "lead", "deregister": "lead", "create_task": "lead", "approve_task": "lead",
    "edit_task": "lead",
    "reject_task": "lead", "respond_feedback": "lead", "initiate_handshake": "lead",
    "register_team": "lead", "list_teams": "lead", "create_room": "lead",
    "list_rooms": "lead", "join_room": "lead", "leave_room": "lead", "room_status": "lead",
    "get_my_rooms": "lead", "pin_room": "lead", "archive_room": "lead",
    "restore_room": "lead", "room_settings": "lead",
    "destroy_room": "all",
}
READ_ONLY = {"who", "get_history", "list_tasks", "handshake_status", "list_contracts",
             "get_shared_context", "list_teams", "list_rooms", "room_status", "get_my_rooms"}


def tools_for(profile: str) -> list[str]:
    if profile not in PROFILES:
        raise UsageError(f"unknown tool profile {profile!r}", "use agent, lead or all")
    rank = PROFILES.index(profile)
    return [name for name, p in TOOLS.items() if PROFILES.index(p) <= rank]
