"""The verb layer: one method per thing an agent does. The CLI, the MCP server
and the notifier call these; each write is one commit checked by the rules."""

import contextvars
import functools
import itertools
import json
import os
import time

from . import combine, deps, events, fmt, machine, model, rules, taskindex
from .errors import Ambiguous, Conflict, GitdropError, NotFound, Refusal, UsageError
from .view import RoomView, first_parent_walk, render_file

HEALTH = ((120, "healthy"), (600, "stale"))
_ALIVE_UNTIL: dict = {}    # (hub, room, agent) -> until when it is known alive (_dead_hints)
LEASE_TTL = 1800           # seconds a path lease runs unless told (gitdrop lease take --ttl)


def default_hub() -> str:
    return os.environ.get("GITDROP_HUB") or os.path.expanduser("~/.gitdrop/hub.git")


def _now() -> int:
    return int(time.time())


def _subject_text(text: str, width: int = 60) -> str:
    line = " ".join(text.strip().split("\n", 1)[0].split())
    return line if len(line) <= width else line[: width - 1] + "…"


def count_arg(what: str, value, least: int | None = 0) -> int:
    """A whole number of at least `least` (None: any) given for `what` (a count, an
    offset, seconds), or a UsageError: a negative count read as "all but the last"
    or "nothing yet", and a negative time as a moment already past."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value).strip())
        except ValueError:
            raise UsageError(f"{what} must be a whole number, not {str(value)[:40]!r}",
                             f"give {what} as a number" + (f" of at least {least}"
                                                           if least is not None else "")) \
                from None
    if least is not None and value < least:
        raise UsageError(f"{what} must be at least {least}, not {value}",
                         f"give {what} as a number of at least {least}")
    return value


def _ago(seconds: int) -> str:
    return (f"{seconds} s" if seconds < 120 else f"{seconds // 60} min" if seconds < 7200
            else f"{seconds // 3600} h" if seconds < 172800 else f"{seconds // 86400} days")


def by_short_name(name: str, ids) -> str:
    """The one id among `ids` whose name part is `name` ("" if none); refuses an
    ambiguous short name, since two teams may each have a spartan."""
    found = sorted({i for i in ids if model.short(i) == name})
    if len(found) > 1:
        raise Ambiguous(f"AMBIGUOUS: {name!r} matches {', '.join(found)}.",
                        f"Use full name (team/agent): {' or '.join(found[:4])}"
                        + (", ..." if len(found) > 4 else ""))
    return found[0] if found else ""


_Replayed = combine.Replayed   # an operation with this idempotency key is in the room

# The verb being called (name, arguments, room), for its one write: another
# process's writer may make that write for it (gitdrop.combine), rebuilt from these.
_CALL: contextvars.ContextVar = contextvars.ContextVar("gitdrop_call", default=None)
_CAPTURE: contextvars.ContextVar = contextvars.ContextVar("gitdrop_capture", default=False)
_COMBINABLE: set = set()
_PREPARED: set = set()


def combinable(fn=None, prepared: bool = False):
    """Marks a verb that makes exactly one write, whose arguments are plain data
    (JSON): the turn's holder can rebuild it from its name and arguments.
    `prepared`: its build reads the room's files alone (not its history), so
    the caller builds it before it asks, on the tree it sees, and the holder
    uses that while the tree is the same (see Room._prepare)."""
    if fn is None:
        return lambda f: combinable(f, prepared)
    _COMBINABLE.add(fn.__name__)
    if prepared:
        _PREPARED.add(fn.__name__)

    @functools.wraps(fn)
    def verb(self, *args, **kw):
        token = _CALL.set((fn.__name__, args, kw, self))
        try:
            return fn(self, *args, **kw)
        finally:
            _CALL.reset(token)
    return verb


class _Captured(Exception):
    def __init__(self, build, agent):
        super().__init__("captured")
        self.build, self.agent = build, agent


def _rebuild(store, ref: str, payload: bytes, view=None):
    """(build, author, now) of a request another writer left in `ref`'s slots
    (combine.py): the verb is called again here with its arguments and stopped at
    its write. `view`: the room as the turn found it, read by every request of
    the turn before its write (the write itself builds on the tip as it is then)."""
    name, verb, args, kw, now, *made = json.loads(payload)
    if verb not in _COMBINABLE or store.room_ref(name) != ref:
        raise UsageError(f"{verb!r} in room {name!r} cannot be written here",
                         "its caller writes it itself")
    if made and verb in _PREPARED and _made_ok(made[0]):
        return _from_made(store, ref, [name, verb, args, kw, now], made[0]), made[0][1], now
    room = Room(store, name, clock=lambda: now)
    room._at_hand = view
    token = _CAPTURE.set(True)
    try:
        getattr(room, verb)(*args, **kw)
    except _Captured as c:
        return c.build, c.agent, now
    finally:
        _CAPTURE.reset(token)
    raise RuntimeError(f"{verb} made no write")   # the asker writes it itself


def _made_ok(made) -> bool:
    """[tree, author, changes, message, result], as Room._prepare sends it."""
    return isinstance(made, list) and len(made) == 5 and \
        all(isinstance(x, str) for x in made[:2]) and isinstance(made[3], str) and \
        isinstance(made[4], dict) and isinstance(made[2], dict) and \
        all(isinstance(k, str) and (v is None or isinstance(v, str))
            for k, v in made[2].items())


def _from_made(store, ref: str, call: list, made: list):
    """The build of a prepared request: what its caller built, while the room's
    files are the ones it built on; else the verb again, on the view at hand (an
    author it now resolves otherwise is not this request: its caller writes it)."""
    tree, author, changes, message, result = made

    def build(view, tip):
        if view.tree == tree:
            return changes, message, result
        again, who, _ = _rebuild(store, ref, json.dumps(call).encode(), view)
        if who != author:
            raise RuntimeError("the author resolves otherwise now")
        return again(view, tip)
    return build


class _Key(str):
    """An idempotency key with the operation and payload digest it names."""

    def __new__(cls, key: str, op: str, digest: str):
        self = super().__new__(cls, key)
        self.op, self.digest = op, digest
        return self


class Room:
    """One room of a hub, seen by whoever calls: each write names its agent."""

    # lead_claim(room, agent), set by the hub: a registration with the lead role
    # asks the team registry for it (gitdrop.hub.Hub.claim_lead).
    lead_claim = None
    _at_hand = None   # a view of the tip to read instead of a fresh one (_rebuild)

    def __init__(self, store, name: str, clock=_now):
        self.store = store
        self.name = name
        self.ref = store.room_ref(name)
        self.clock = clock

    # --- reading ---------------------------------------------------------------
    def view(self, at: str = "") -> RoomView:
        if not at and self._at_hand is not None:
            return self._at_hand
        return self.store.view(self.name, at)

    def resolve(self, name: str, view: RoomView | None = None) -> str:
        """A full agent id for `name` (team/name, or a short name if unambiguous)."""
        view = view or self.view()
        if not name:
            raise UsageError("no agent given", "say who you are (--as / GITDROP_AGENT)")
        if "/" in name:
            if view.agent(name) is None:
                if model.is_hub_identity(name):   # no agent: it registers nowhere
                    raise NotFound(f"{name} is the hub's own identity: it runs rooms "
                                   "(room settings, archive, pin) and reviews what no lead "
                                   "may, but is no agent in them",
                                   "act as a registered agent (--as team/name; gitdrop who)")
                team = model.split_agent(name)[0]
                if model.is_name(team) and not model.member_team(view.room, team):
                    # "register it" was refused in turn: the room does not take its team
                    raise NotFound(*rules.team_outside(view.room, self.name, team))
                raise NotFound(f"{name!r} is not registered in room {self.name!r}",
                               f"register it (gitdrop register {name}) or check gitdrop who")
            return name
        found = by_short_name(name, view.agent_ids())
        if not found:
            raise NotFound(f"{name!r} is not registered in room {self.name!r}",
                           f"register it with its team (gitdrop register team/{name}) or "
                           "check gitdrop who")
        return found

    def _target(self, view, name: str) -> str:
        if name in (model.ALL, "*"):
            return model.ALL
        if name.startswith("@"):
            model.check_name("team", name[1:])
            return name
        try:
            return self.resolve(name, view)
        except NotFound as e:
            raise Refusal("unknown-recipient", e.reason, "use gitdrop who to see who is "
                          "here (names are team/name; @team for a team, all for everyone)")

    # --- writing ---------------------------------------------------------------
    def _write(self, agent: str, build, key: str = ""):
        now, recipe, call = self.clock(), None, _CALL.get()
        if key:  # checked on every (re)build, so a racing twin that landed first counts
            inner = build

            def build(view, tip):
                done = self._replayed(agent, key, tip, now)
                if done is not None:
                    raise _Replayed(done)
                return inner(view, tip)
        if call is not None and call[3] is self:
            _CALL.set(None)   # one write per verb call: a second one goes by itself
            if _CAPTURE.get():
                raise _Captured(build, agent)
            try:
                payload = json.dumps([self.name, call[0], call[1], call[2], now]).encode()
                if call[0] in _PREPARED and not key:
                    build, payload = self._prepare(agent, build, payload)
                recipe = combine.Recipe(payload, _rebuild)
            except (TypeError, ValueError):
                recipe = None
        try:
            oid, result = self.store.write(self.ref, build, agent, now=now, recipe=recipe)
        except _Replayed as r:
            return r.result
        if isinstance(result, dict):
            result.setdefault("commit", oid)
        return result

    def _prepare(self, agent: str, build, payload: bytes):
        """Build now, on the tip as this caller sees it, before asking for the
        room's turn: inside the turn, every writer of the room waits for the
        build; a message changes no file, so the tree is mostly still the same
        then. Returns the build to write with (this one's output while the tree
        is the same) and the request with it (the holder's side: _from_made)."""
        tip = self.store.tip(self.ref)
        if not tip:
            return build, payload
        view = self.store._view_at(self.name, tip)
        try:
            changes, message, result = build(view, tip)
        except GitdropError:
            return build, payload   # said again, by the write itself
        tree, inner = view.tree, build

        def prepared(v, t):
            return (changes, message, result) if v.tree == tree else inner(v, t)
        made = json.dumps([tree, agent, changes, message, result]).encode()
        if len(payload) + len(made) + 1 > combine.MOST:
            return prepared, payload
        return prepared, payload[:-1] + b"," + made + b"]"

    @staticmethod
    def _keyed(key: str, op: str, *payload) -> "_Key | str":
        """An idempotency key bound to one operation and its payload: the key, and
        a digest of (op, payload) that goes into the commit beside it."""
        if not key:
            return ""
        model.check_name("idempotency key", key, 80)
        import hashlib
        return _Key(key, op, hashlib.sha256(repr((op,) + payload).encode(
            "utf-8", "surrogateescape")).hexdigest()[:16])

    def _replayed(self, agent: str, key, tip: str, at: int):
        """The result of the operation this key already made, or None; refuses a key
        that was used for another operation or another payload."""
        c = rules.keyed_before(self.store.reader, tip, agent, key, at, self.name)
        if c is None:
            return None
        op, digest = getattr(key, "op", c.op), getattr(key, "digest", "")
        if rules.same_keyed(c, op, digest or fmt.trailer(c.trailers, "digest")):
            return self._result_of(c)
        raise rules.key_reused(c, str(key), op)

    def _result_of(self, c) -> dict:
        """What the operation a commit made returned, rebuilt from the commit (for a
        replayed operation, so the caller reads the same answer twice)."""
        task = fmt.trailer(c.trailers, "task")
        hs = fmt.trailer(c.trailers, "handshake")
        out = {"commit": c.oid, "replayed": True, "task": task, "id": task or hs,
               "to": fmt.trailer_values(c.trailers, "to"),
               "cc": fmt.trailer_values(c.trailers, "cc")}
        if task:
            now = self.view(c.oid).task(task)
            was = self.view(c.parent).task(task) if c.parent else None
            if now:
                out.update(state=now[0]["state"], assignee=now[0]["assignee"],
                           **{"from": was[0]["state"] if was else now[0]["state"]})
        return out

    @staticmethod
    def _msg(subject, body, op, key="", **extra):
        tr = [("op", op)] + [(k.replace("_", "-"), str(v)) for k, v in extra.items() if v]
        if key:
            tr.append(("id", str(key)))
            if getattr(key, "digest", ""):
                tr.append(("digest", key.digest))
        for k, v in tr:   # one line each: a newline would add a trailer of its own
            if not v.isprintable():
                raise UsageError(f"{k} {v[:60]!r} contains a newline or control character",
                                 f"give {k} as one line of text")
        return fmt.format_message(subject, body, tr)

    # --- agents ----------------------------------------------------------------
    def register(self, agent_id: str, roles=(), description: str = "", key: str = "",
                 new_only: bool = False, caps=None, human: bool | None = None) -> dict:
        """Join the room, or update one's roles and description. new_only: refuse if
        the agent exists, decided inside the compare-and-swap loop (two sessions
        registering one new name at once: exactly one joins, the other changes nothing)."""
        model.check_agent_id(agent_id)
        roles = [r.strip() for r in roles if r.strip()]
        caps = None if caps is None else list(dict.fromkeys(c.strip() for c in caps if c.strip()))
        key = self._keyed(key, "register", agent_id, roles, description,
                          *((caps,) if caps is not None else ()),
                          *((f"human={human}",) if human is not None else ()))
        if "lead" in roles:
            if self.lead_claim is None:
                raise UsageError("the lead role is given by the hub's team registry, which "
                                 "this room was opened without", "register through the hub")
            self.lead_claim(self.name, agent_id)

        def build(view, tip):
            now = self.clock()
            old = view.agent(agent_id)
            if old is not None and new_only:
                raise Conflict(f"{agent_id} was registered by another session just now",
                               f"ask the hub's owner for its token (gitdrop token {agent_id})")
            if old is not None:  # an upsert: roles and description change in place
                new = dict(old, roles=roles or old["roles"],
                           description=description or old["description"], last_seen=now,
                           caps=old["caps"] if caps is None else caps,
                           human=old["human"] if human is None else bool(human))
                return ({view.agent_path(agent_id): render_file("agent", new)},
                        self._msg(f"{model.short(agent_id)} updated its profile", "", "status"),
                        {"agent": agent_id, "updated": True})
            doc = model.with_defaults("agent", {"id": agent_id, "roles": roles,
                                                "description": description,
                                                "registered": now, "last_seen": now,
                                                "cursor": tip, "caps": caps or [],
                                                "human": bool(human)})
            return ({view.agent_path(agent_id): render_file("agent", doc)},
                    self._msg(f"{model.short(agent_id)} joined {self.name}"
                              + (f" as {', '.join(roles)}" if roles else ""), description,
                              "register", key),
                    {"agent": agent_id, "updated": False})
        return self._write(agent_id, build, key)

    def deregister(self, agent: str, who: str = "") -> dict:
        agent = self.resolve(agent)
        target = self.resolve(who) if who else agent

        def build(view, tip):
            if view.agent(target) is None:
                raise NotFound(f"{target} is not registered", "check the name with gitdrop who")
            return ({view.agent_path(target): None},
                    self._msg(f"{model.short(target)} left {self.name}", "", "deregister"),
                    {"agent": target})
        r = self._write(agent, build)
        # What it still holds: anyone may reap those now (its lease ends as it leaves);
        # said, since a lead could neither assign nor release them.
        r["held"] = [str(t["id"]) for t in self.list_tasks(assignee=target)
                     if t["state"] in machine.MOVES["reap"][0]]
        return r

    @combinable(prepared=True)
    def _update_agent(self, agent, op, subject, **fields):
        agent = self.resolve(agent)

        def build(view, tip):  # a change to nothing (same second) writes no commit
            old = view.agent(agent)
            if old is None:
                raise NotFound(f"{agent} is not registered", "register first")
            new = dict(old, **fields)
            return ({view.agent_path(agent): render_file("agent", new)},
                    self._msg(subject.format(name=model.short(agent)), "", op),
                    {"agent": agent, **fields})
        return self._write(agent, build)

    def set_status(self, agent: str, status: str) -> dict:
        return self._update_agent(agent, "status", "{name} is " + _subject_text(status or "idle"),
                                  status=status, last_seen=self.clock())

    def ping(self, agent: str) -> dict:
        return self._update_agent(agent, "ping", "{name} pinged", last_seen=self.clock())

    def who(self) -> list[dict]:
        """Each agent with its health, from its last act in the room (its latest
        commit, or its last ping/status, whichever is later), and its work: the
        tasks it holds, the last it claimed and the last it completed."""
        return self.who_page()["agents"]

    def who_page(self, offset: int = 0, limit: int = 0, only=None, walk: int = 5000) -> dict:
        """who() for the agents from `offset` on, at most `limit` of them (0: all),
        by id: {"agents", "total", "offset", "more" (how many follow)}; `only`: of
        these agents alone (those registered). Only the page's agent files are
        read, and the walk for last acts goes at most `walk` commits back (past it,
        an agent's last act is its file's last_seen)."""
        offset, limit = count_arg("offset", offset), count_arg("limit", limit)
        view, now = self.view(), self.clock()
        ids = view.agent_ids()
        if only is not None:
            only = set(only)
            ids = [a for a in ids if a in only]
        offset = max(0, int(offset))
        page = ids[offset:offset + limit] if limit > 0 else ids[offset:]
        agents = view.agents(page)
        acts, claimed = self._last_acts(view, {a["id"] for a in agents}, walk)
        holding, completed = {}, {}
        for t in self._headers(view):
            if not t["assignee"]:
                continue
            if t["state"] == "completed":
                if t["updated"] >= completed.get(t["assignee"], ("", -1))[1]:
                    completed[t["assignee"]] = (t["id"], t["updated"])
            elif t["state"] not in machine.TERMINAL and t["state"] != "failed":
                holding.setdefault(t["assignee"], []).append(str(t["id"]))
        out = []
        for a in agents:
            last = max(a["last_seen"], min(acts.get(a["id"], 0), now))
            age = now - last if last else None
            health = "unknown" if age is None else next(
                (h for limit, h in HEALTH if age < limit), "dead")
            out.append({"agent": a["id"], "name": model.short(a["id"]),
                        "team": model.split_agent(a["id"])[0], "roles": a["roles"],
                        "status": a["status"], "description": a["description"],
                        "lead": model.is_lead(a, view.room), "health": health,
                        "last_seen": a["last_seen"], "last_act": last,
                        "tasks": holding.get(a["id"], []),
                        "last_claimed": claimed.get(a["id"], ""),
                        "last_completed": str(completed.get(a["id"], ("",))[0]),
                        "caps": a["caps"], "human": a["human"]})
        return {"agents": out, "total": len(ids), "offset": offset,
                "more": max(0, len(ids) - offset - len(page))}

    def _last_acts(self, view, ids, limit: int = 5000):
        """({agent: time of its latest commit}, {agent: task it last claimed}), from
        at most `limit` commits back (claims: `limit` // 5 once every act is found)."""
        acts, claimed = {}, {}
        for n, c in enumerate(first_parent_walk(self.store.reader, view.commit)):
            if n >= limit or (len(acts) >= len(ids) and (len(claimed) >= len(ids) or
                                                         n >= limit // 5)):
                break
            if c.author in ids:
                acts.setdefault(c.author, c.time)
                if c.op == "task-claim":
                    claimed.setdefault(c.author, fmt.trailer(c.trailers, "task"))
        return acts, claimed

    # --- messages --------------------------------------------------------------
    @combinable(prepared=True)
    def send(self, agent: str, to, text: str, cc=(), task: str = "", reply_to: str = "",
             key: str = "") -> dict:
        agent = self.resolve(agent)
        to = [to] if isinstance(to, str) else list(to)
        to = [x.strip() for t in to for x in t.split(",") if x.strip()]
        cc = [x.strip() for t in ([cc] if isinstance(cc, str) else cc) for x in t.split(",")
              if x.strip()]
        if not to:
            raise UsageError("no recipient", "name one: team/name, a short name, @team or all")
        task = str(task or "").lstrip("#")
        if task:
            model.check_name("task", task, 80)
        reply_to = str(reply_to or "")
        key = self._keyed(key, "send", to, cc, text, task, reply_to)
        if reply_to and not (4 <= len(reply_to) <= 40 and not reply_to.strip("0123456789abcdef")):
            raise UsageError(f"reply_to {reply_to[:60]!r} is not a commit id",
                             "give the id of the message you answer (as gitdrop inbox shows it)")

        def build(view, tip):
            rto = list(dict.fromkeys(self._target(view, t) for t in to))
            rcc = [x for x in dict.fromkeys(self._target(view, t) for t in cc) if x not in rto]
            shown = ", ".join(x if x.startswith("@") or x == model.ALL else model.short(x)
                              for x in rto)
            subject = f"{model.short(agent)} → {shown}: {_subject_text(text)}"
            msg = self._msg(subject, text, "send", key, to=", ".join(rto), cc=", ".join(rcc),
                            task=task, reply_to=reply_to)
            return {}, msg, {"to": rto, "cc": rcc}
        r = self._write(agent, build, key)
        hints = self._dead_hints(list(r.get("to", [])) + list(r.get("cc", [])))
        if hints:
            r["hints"] = hints
        return r

    def _dead_hints(self, ids, then: str = "it may not read this soon") -> list[str]:
        """A line for each agent among `ids` that looks dead (no act for HEALTH's last
        limit): it may not read a message soon. Cheap first (its last ping and the
        time of the commit its cursor points at), and a walk only for the doubtful."""
        now = self.clock()
        # An agent seen alive at `last` is alive until last + the limit, whatever it
        # does meanwhile: known here, a send does not read its file again.
        ids = [a for a in ids if model.is_agent_id(a)   # not @team, all
               and _ALIVE_UNTIL.get((self.store.path, self.name, a), 0) <= now]
        if not ids:
            return []
        view, out = self.view(), []
        for a in ids:
            doc = view.agent(a)
            if doc is None:
                continue
            last = doc["last_seen"]
            if doc["cursor"]:
                try:
                    last = max(last, self.store.reader.commit(doc["cursor"]).time)
                except KeyError:
                    pass
            if now - last < HEALTH[-1][0]:
                if len(_ALIVE_UNTIL) > 50000:
                    _ALIVE_UNTIL.clear()
                _ALIVE_UNTIL[(self.store.path, self.name, a)] = last + HEALTH[-1][0]
                continue
            last = max(last, self._last_acts(view, {a}, limit=2000)[0].get(a, 0))
            if now - last >= HEALTH[-1][0]:
                out.append(f"{a} looks dead (last act {_ago(now - last)} ago): {then}")
        return out

    def sent(self, agent: str, n: int = 10, message: str = "", limit: int = 5000) -> list[dict]:
        """`agent`'s last `n` messages (or just `message`, a commit id), newest first, each
        with its recipients and whether each has read it (its read cursor is at or past
        the message). Agents that joined after a message are not counted."""
        n = count_arg("n", n)
        agent = self.resolve(agent)
        view, reader = self.view(), self.store.reader
        want = self.store.resolve(message) if message else ""
        agents = view.agents()
        passed, joined, out = set(), set(), []   # joined: registered after the commit at hand
        for i, c in enumerate(first_parent_walk(reader, view.commit)):
            if i >= limit or len(out) >= n:
                break
            if (c.oid == want or (not want and c.author == agent)) and rules.is_message(reader, c):
                to, cc = rules.recipients(c)
                got = []
                for a in agents:
                    if a["id"] in joined:
                        continue
                    how = rules.reaches(c.author, to, cc, a["id"],
                                        lambda a=a: model.is_lead(a, view.room))
                    if how:
                        got.append({"agent": a["id"], "via": how,
                                    "read": a["cursor"] == c.oid or a["cursor"] in passed})
                out.append({"id": c.oid, "from": c.author, "time": c.time, "to": to, "cc": cc,
                            "text": c.body or c.subject, "recipients": got,
                            "read": sum(g["read"] for g in got)})
                if want:
                    break
            passed.add(c.oid)
            if c.op == "register":
                joined.add(c.author)
        if want and not out:
            raise NotFound(f"{message} is not a message in room {self.name!r} (within the last "
                           f"{limit} commits)", "give a message id from gitdrop sent or inbox")
        return out

    def _events_since(self, view: RoomView, cursor: str, agent: str, moving: bool = False):
        """`moving`: the caller moves the cursor past whatever is found, so a walk
        that finds something is never asked for again and is not memoized."""
        lead = view.is_lead(agent)
        me = view.agent(agent)
        caps = tuple(me["caps"]) if me else ()
        reader = self.store.reader
        # What concerns the agent between its cursor and a tip T is memoized by
        # commit ids (store.Reader.walks, kept between processes): an agent that
        # nothing concerns never moves its cursor, and would walk back to it on
        # every call. Only the walk from the tip down to T is new work.
        memo = getattr(reader, "walks", None)
        key = ("inbox", agent, cursor, lead) + caps
        got = memo.get(key) if memo is not None else None
        found = []  # "oid:how", newest first
        for c in first_parent_walk(reader, view.commit):
            if c.oid == cursor:
                break
            if got is not None and c.oid == got[0]:
                found.extend(got[1])
                break
            if c.author == agent:
                continue
            how = events.concerns(events.event(reader, c, copy=False), agent, lead, caps)
            if how:
                found.append(f"{c.oid}:{how}")
        if memo is not None and len(found) <= 500 and not (moving and found):
            memo[key] = (view.commit, found)
            getattr(memo, "flush", lambda: None)()
        out = []
        for item in reversed(found):
            oid, _, how = item.partition(":")
            ev = events.event(reader, reader.commit(oid))
            ev["via"] = how
            out.append(ev)
        return out

    def inbox(self, agent: str, limit: int = 20, peek: bool = False, fits=None,
              shown_first=None, again: bool = False) -> dict:
        """Unread messages and notices, oldest first; marks what it returns as read.
        `fits`: given those `limit` lets through, how many of them (from the first)
        to return; the rest stay unread, counted in `remaining`. `shown_first(result)`,
        with `cursor` (where the read cursor then moves), is called before the mark:
        shown first, a process killed between the two shows them again, never loses
        them (the command line printed after the mark, and a kill there lost them).
        `again`: what the agent's last read marked read, once more, marking nothing
        (`read_at`: when): an answer that never reached its caller (a client killed,
        a connection dropped: nothing tells a server) lost them, else."""
        limit = count_arg("limit", limit)
        view = self.view()
        agent = self.resolve(agent, view)
        me = view.agent(agent)
        if again:   # all the last read marked, whatever this call's limit (it had its own)
            return self._read_again(view, agent, me["cursor"], fits)
        evs = self._events_since(view, me["cursor"], agent, moving=not peek)
        shown = self._people(view, evs[:limit] if limit else evs)
        if fits is not None and shown:
            shown = shown[:max(1, fits(shown))]
        remaining = len(evs) - len(shown)
        result = {"agent": agent, "messages": shown, "remaining": remaining,
                  "unread": len(evs)}
        if peek or not evs:
            return result
        new_cursor = shown[-1]["id"] if remaining else view.commit
        if shown_first is not None:
            shown_first(dict(result, cursor=new_cursor))
        n = sum(1 for e in shown if e["op"] == "send")
        result["commit"] = self._mark_read(agent, new_cursor, n, len(shown) - n).get("commit", "")
        return result

    @staticmethod
    def _people(view, evs: list) -> list:
        """`evs`, a message from a person marked so (register --human): a person's
        word, not another program's."""
        for e in evs:
            sender = view.agent(e["from"]) if e["op"] == "send" else None
            if sender is not None and sender["human"]:
                e["person"] = True
        return evs

    def _read_again(self, view, agent: str, cursor: str, fits) -> dict:
        """The events between the cursor the agent's last read moved and where it
        moved it, as that read saw them (the room then)."""
        out = {"agent": agent, "messages": [], "remaining": 0, "again": True, "read_at": 0,
               "unread": len(self._events_since(view, cursor, agent))}
        if not cursor:
            return out
        for c in first_parent_walk(self.store.reader, view.commit):
            if c.oid == cursor:   # its last read is older than where its cursor is
                return out
            if c.author == agent and c.op == "read":
                break
        else:
            return out
        before = self.view(c.parent).agent(agent) if c.parent else None
        evs = self._events_since(self.view(cursor), before["cursor"] if before else "", agent)
        shown = self._people(view, evs)
        if fits is not None and shown:
            shown = shown[:max(1, fits(shown))]
        return dict(out, messages=shown, remaining=len(evs) - len(shown), read_at=c.time)

    @combinable(prepared=True)
    def _mark_read(self, agent: str, cursor: str, messages: int, notices: int) -> dict:
        def build(v, tip):
            cur = v.agent(agent)
            if cur is None:
                raise NotFound(f"{agent} is not registered", "register first")
            return ({v.agent_path(agent): render_file("agent", dict(cur, cursor=cursor))},
                    self._msg(f"{model.short(agent)} read {messages} message(s)"
                              + (f" and {notices} notice(s)" if notices else ""),
                              "", "read"), {})
        return self._write(agent, build)

    def waiting(self, agent: str) -> dict:
        """What waits for an agent, marking nothing read: unread events, tasks
        assigned to it and not started (unless they wait on another task), reviews
        and handshake acks it owes. Also `ready`: the unassigned tasks it may take now
        (deps.ready), and `ready_at`: when the first one a retry's backoff holds back
        may be taken (0: none)."""
        from .rules import reviewer_ok
        agent = self.resolve(agent)
        view = self.view()
        lead = view.is_lead(agent)
        tasks, reviews = [], []
        pool, states = taskindex.ready_pool(view)

        def lookup(d):
            return {"state": states[d]} if d in states else None
        for t in pool:
            if t["state"] == "assigned" and t["assignee"] == agent and \
                    not deps.waiting_on(lookup, t):
                tasks.append(t["id"])
        able = [t for t in deps.ready(lookup, pool, agent, self._caps(view, agent))
                if not t["assignee"]]
        now = self.clock()
        ready = [t["id"] for t in able if t["not_before"] <= now]
        later = [t["not_before"] for t in able if t["not_before"] > now]
        for t in self._headers(view):
            if t["state"] == "review" and reviewer_ok(view, t, agent, lead):
                reviews.append(t["id"])
        acks = []
        for hid in view.handshake_ids():
            h = view.handshake(hid)[0]
            if h["status"] == "pending" and agent in h["targets"] and agent not in h["acks"]:
                acks.append(hid)
        return {"agent": agent, "room": self.name, "tip": view.commit,
                "unread": self._events_since(view, view.agent(agent)["cursor"], agent),
                "tasks": tasks, "reviews": reviews, "handshakes": acks,
                "ready": ready, "ready_at": min(later, default=0)}

    def history(self, n: int = 10, task: str = "", messages_only: bool = True,
                reach: int | None = None) -> list[dict]:
        """The last `n` messages (or acts), those about `task` only if given, from the
        last `reach` commits at most (None: back to the room's start)."""
        n, out = count_arg("n", n), []
        walk = first_parent_walk(self.store.reader, self.store.room_tip(self.name))
        for c in itertools.islice(walk, reach):
            if len(out) >= n:
                break
            if messages_only and c.op != "send" and c.op:
                continue
            ev = events.event(self.store.reader, c)
            if messages_only and ev["op"] != "send":
                continue
            if task and ev.get("task") != str(task):
                continue
            out.append(ev)
        out.reverse()
        return out

    def log(self, n: int = 20, at: str = "") -> list[dict]:
        n, out = count_arg("n", n), []
        tip = self.store.resolve(at) if at else self.store.room_tip(self.name)
        for c in first_parent_walk(self.store.reader, tip):
            if len(out) >= n:
                break
            out.append({"id": c.oid, "author": c.author, "time": c.time, "subject": c.subject,
                        "op": c.op})
        out.reverse()
        return out

    # --- tasks ------------------------------------------------------------------
    def _next_id(self, view, names) -> int:
        nums = [int(x) for x in names if str(x).isdigit()]
        return max(nums, default=0) + 1

    @combinable
    def create_task(self, agent: str, title: str, body: str = "", assignee: str = "",
                    priority: int = 0, tags=(), handshake: int = 0, max_retries=None,
                    project: str = "", reviewer: str = "", key: str = "", after=(),
                    requires=(), parent: str = "", review: bool = True,
                    brief: bool = False) -> dict:
        """`after`: ids of tasks this one waits on; `requires`: capabilities its
        assignee must have; `parent`: the task it is part of."""
        agent = self.resolve(agent)
        handshake = count_arg("handshake", handshake or 0)
        if max_retries is not None:
            max_retries = count_arg("max_retries", max_retries)
        after = [str(a).lstrip("#") for a in after if str(a).strip()]
        requires = [r for r in requires if r]
        parent = str(parent or "").lstrip("#")
        key = self._keyed(key, "task-create", title, body, assignee, priority, list(tags),
                          handshake, max_retries, project, reviewer,
                          *((after, requires, parent) if after or requires or parent else ()),
                          *(("no-review",) if not review else ()),
                          *(("brief",) if brief else ()))

        def build(view, tip):
            tid = str(self._next_id(view, view.task_ids()))
            who = self._target(view, assignee) if assignee else ""
            rev = self._target(view, reviewer) if reviewer else ""
            now = self.clock()
            doc = model.with_defaults("task", {
                "id": tid, "title": title.strip(), "creator": agent,
                "state": "assigned" if who else "pending", "assignee": who, "reviewer": rev,
                "priority": int(priority), "tags": [t for t in tags if t], "project": project,
                "max_retries": view.settings["max_retries"] if max_retries is None else int(max_retries),
                "handshake": int(handshake or 0), "created": now, "updated": now,
                "after": after, "requires": requires, "parent": parent, "review": bool(review),
                "brief": bool(brief)})
            subject = f"task {tid} created by {model.short(agent)}: {_subject_text(title)}"
            if who:
                subject = f"task {tid} created and assigned to {model.short(who)}: {_subject_text(title, 40)}"
            return ({view.task_path(tid): render_file("task", doc, body)},
                    self._msg(subject, "", "task-create", key, task=tid),
                    {"id": tid, "task": tid, "state": doc["state"], "assignee": who})
        return self._write(agent, build, key)

    @combinable
    def move_task(self, agent: str, task_id, move: str, note: str = "", assignee: str = "",
                  question: str = "", answer: str = "", key: str = "", lease: int = 0,
                  **edits) -> dict:
        """Make one move of the state machine (see machine.MOVES). `lease`: seconds a
        renew holds the task for (default the room's task_lease)."""
        if not (move in machine.HUB_MOVES and model.is_hub_identity(agent)):
            agent = self.resolve(agent)
        task_id = str(task_id).lstrip("#")
        lease = count_arg("lease", lease or 0)
        if edits.get("retry_in"):
            edits["retry_in"] = count_arg("retry_in", edits["retry_in"])
        if move not in machine.MOVES:
            raise UsageError(f"unknown move {move!r}", "moves: " + ", ".join(machine.MOVES))
        key = self._keyed(key, "task-" + move, task_id, note, assignee, question, answer,
                          sorted(edits.items()), *((lease,) if lease else ()))

        def build(view, tip):
            doc = view.task(task_id)
            if doc is None:
                raise NotFound(f"no task {task_id} in room {self.name!r}",
                               "list tasks with gitdrop task list")
            old, body = doc
            now = self.clock()
            # An approval without words keeps what the doer handed in: the note is the
            # result a dependent task's worker reads as its input (it came through empty).
            kept = old["note"] if move == "approve" else ""
            new = dict(old, updated=now, note=note or kept)
            s = view.settings
            frm_state = old["state"]
            # An illegal move is still built as asked, so that the rules judge and word it.
            if frm_state in machine.MOVES[move][0]:
                new["state"] = machine.target(move, old)
            else:
                new["state"] = machine.MOVES[move][1] if machine.MOVES[move][1] in machine.STATES else frm_state
            if move == "assign":
                new["assignee"] = self._target(view, assignee) if assignee else ""
                new["signoffs"] = []
            elif move == "claim":
                new["assignee"] = agent
            elif move == "retry":
                new["retries"] = old["retries"] + 1
                if assignee:
                    new["assignee"] = self._target(view, assignee)
                new["signoffs"] = []
            elif move == "block":
                new["resume"] = old["state"]
            elif move == "unblock":
                new["resume"] = ""
            elif move == "ask":
                new["question"], new["answer"] = question or note, ""
                new["resume"] = old["state"]
            elif move == "answer":
                new["answer"] = answer or note
                new["resume"] = ""
            elif move == "sign":
                new["signoffs"] = old["signoffs"] + [agent]
            elif move == "reap":
                failing = new["state"] == "failed"
                new.update(retries=old["retries"] + (0 if failing else 1), signoffs=[],
                           assignee=old["assignee"] if failing else "", lease_until=0)
                if not note:
                    new["note"] = (f"the lease of {old['assignee'] or 'nobody'} expired"
                                          + (f"; retries used up ({old['retries']} of "
                                             f"{old['max_retries']})" if failing else ""))
            elif move == "renew":
                new["lease_until"] = now + min(int(lease or s["task_lease"]), s["max_task_lease"])
            elif move == "release":   # edits: failed (counts a retry), retry_in (backoff, s)
                new.update(assignee="", lease_until=0, signoffs=[],
                           retries=old["retries"] + (1 if edits.get("failed") else 0),
                           not_before=now + int(edits["retry_in"]) if edits.get("retry_in") else 0)
            elif move == "edit":
                for k, v in edits.items():
                    if k not in model.TASK_FIELDS and k != "body":
                        raise UsageError(f"a task has no field {k!r}", "see gitdrop task edit --help")
                    if k == "body":
                        body = v
                    elif v is not None:
                        new[k] = v
            if move in ("assign", "claim", "start", "retry") and new["assignee"]:
                new["lease_until"] = now + s["task_lease"]
            subject = (f"task {task_id} {frm_state} → {new['state']} by {model.short(agent)}"
                       if new["state"] != frm_state else
                       f"task {task_id} {move}{'ed' if move == 'sign' else ''} by {model.short(agent)}")
            if move in ("assign", "retry") and new["assignee"]:
                subject += f" (to {model.short(new['assignee'])})"
            return ({view.task_path(task_id): render_file("task", new, body)},
                    self._msg(subject, new["note"] or question or answer, "task-" + move, key,
                              task=task_id),
                    {"id": task_id, "task": task_id, "state": new["state"], "from": frm_state,
                     "assignee": new["assignee"]})
        return self._write(agent, build, key)

    def move_task_to(self, agent: str, task_id, status: str, note: str = "",
                     assignee: str = "") -> dict:
        """Take a task to a target state by the one move that leads there."""
        task = self.task(task_id)
        move = machine.move_to(task, status)
        if not move or (status == task["state"] and not assignee):
            raise Refusal("task-state-machine", f"task {task['id']} is {task['state']}; no move "
                          f"takes it to {status!r}", machine.legal_moves(task["state"]))
        return self.move_task(agent, task_id, move, note=note, assignee=assignee,
                              question=note if move == "ask" else "",
                              answer=note if move == "answer" else "")

    def lease(self, task_id, view: RoomView | None = None) -> dict:
        """A task's lease as of the clock: {"until", "last_act", "expired"} (until 0:
        the task is in no state a lease applies to)."""
        from . import rules
        view = view or self.view()
        doc = view.task(str(task_id).lstrip("#"))
        if doc is None:
            raise NotFound(f"no task {task_id} in room {self.name!r}", "gitdrop task list")
        t, now = doc[0], self.clock()
        if t["state"] not in machine.MOVES["reap"][0]:
            return {"until": 0, "last_act": 0, "expired": False}
        until, last = rules.lease_expiry(self.store.reader, view.settings, t, view.commit, now)
        waiting = deps.lease_waits_on(deps.lookup(view), t)  # a waiting task is not abandoned
        return {"until": until, "last_act": last, "expired": now >= until and not waiting,
                "waiting_on": waiting}

    def reap_leases(self, agent: str = "hub/reaper") -> list[dict]:
        """Reap every task whose lease has expired (by the clock); the rules judge
        each again. Returns the moves made."""
        from .errors import GitdropError
        view, out, now = self.view(), [], self.clock()
        for t in self._headers(view):
            tid = str(t["id"])
            # A lease_until still ahead holds whatever the history says: no walk (a
            # walk per held task, each round of every worker, cost seconds in a busy room).
            if t["state"] in machine.MOVES["reap"][0] and t["lease_until"] <= now and \
                    self.lease(tid, view)["expired"]:
                try:
                    out.append(self.move_task(agent, tid, "reap"))
                except GitdropError:   # renewed or moved meanwhile: judged again next round
                    continue
        return out

    def task(self, task_id) -> dict:
        view = self.view()
        doc = view.task(str(task_id).lstrip("#"))
        if doc is None:
            raise NotFound(f"no task {task_id} in room {self.name!r}", "gitdrop task list")
        tasks = deps.lookup(view)
        return dict(doc[0], body=doc[1], waiting_on=deps.waiting_on(tasks, doc[0]),
                    blocked_by=deps.blocked_by(tasks, doc[0]))

    def list_tasks(self, state: str = "", assignee: str = "", tag: str = "", project: str = "",
                   include_done: bool = False, able: str = "") -> list[dict]:
        """Tasks by state, assignee, tag and project; `able`: only those that agent
        has the required capabilities for. Each carries `waiting_on` (dependencies
        not completed) and `blocked_by` (a dependency that failed or was cancelled)."""
        return self.task_page(state, assignee, tag, project, include_done, able)["tasks"]

    def task_page(self, state: str = "", assignee: str = "", tag: str = "", project: str = "",
                  include_done: bool = False, able: str = "", offset: int = 0,
                  limit: int = 0) -> dict:
        """list_tasks from `offset` on, at most `limit` of them (0: all), the filters
        applied first: {"tasks", "total", "offset", "more" (how many follow)}. Only
        the page's tasks are copied and given their dependencies."""
        offset, limit = count_arg("offset", offset), count_arg("limit", limit)
        view = self.view()
        if assignee and assignee != "none" and not ("/" in assignee and
                                                    model.is_agent_id(assignee)):
            # a full name as it is: the tasks an agent that left still holds are listed
            assignee = self.resolve(assignee, view)
        caps = self._caps(view, able) if able else None
        headers = self._headers(view)
        tasks = self._lookup(headers)
        states = {s.strip() for s in state.split(",") if s.strip()}
        hits = []
        for t in headers:
            if states and t["state"] not in states:
                continue
            if not states and not include_done and t["state"] in machine.TERMINAL:
                continue
            if assignee and t["assignee"] != ("" if assignee == "none" else assignee):
                continue
            if tag and tag not in t["tags"]:
                continue
            if project and t["project"] != project:
                continue
            if caps is not None and deps.missing_caps(caps, t):
                continue
            hits.append(t)
        hits.sort(key=lambda t: (-t["priority"], int(t["id"]) if str(t["id"]).isdigit() else 0))
        offset = max(0, int(offset))
        page = hits[offset:offset + limit] if limit > 0 else hits[offset:]
        return {"tasks": [dict(taskindex.full(t), waiting_on=deps.waiting_on(tasks, t),
                               blocked_by=deps.blocked_by(tasks, t)) for t in page],
                "total": len(hits), "offset": offset,
                "more": max(0, len(hits) - offset - len(page))}

    def task_headers(self, view: RoomView | None = None) -> list[dict]:
        """Every task's header from the task index, cheaply: shared and possibly slim
        dicts (read fields with [], copy with taskindex.full before changing one)."""
        return taskindex.headers(view or self.view())

    _headers = staticmethod(taskindex.headers)

    @staticmethod
    def _lookup(headers):
        byid = {str(h["id"]): h for h in headers}
        return byid.get

    def _caps(self, view, agent: str) -> list[str]:
        a = view.agent(self.resolve(agent, view))
        return a["caps"] if a else []

    def ready(self, agent: str, tag: str = "", limit: int = 20) -> list[dict]:
        """The tasks `agent` may take now, best first (see deps.ready)."""
        limit = count_arg("limit", limit)
        agent = self.resolve(agent)
        view = self.view()
        pool, states = taskindex.ready_pool(view)
        got = deps.ready(lambda d: {"state": states[d]} if d in states else None, pool, agent,
                         self._caps(view, agent), tag, now=self.clock())
        return [taskindex.full(t) for t in (got[:limit] if limit else got)]

    def claim_next(self, agent: str, tag: str = "", tries: int = 200, skip=()) -> dict:
        """Claim the best ready task for `agent`: {"task": id, "claimed": True, ...};
        its own assigned or in-progress task if it has one ({"claimed": False}); {"task": ""}
        when nothing is ready. `skip`: ids to pass over (a worker's, for a while). A claim
        the rules refuse passes its task over and the next best is tried: under a race
        each task has exactly one winner, and a task no claim fits (a file at the room's
        max_file) must not stop the tasks behind it."""
        agent = self.resolve(agent)
        passed = {str(t) for t in skip}
        lost = set()
        for _ in range(tries):
            best = [t for t in self.ready(agent, tag, limit=0)
                    if str(t["id"]) not in lost and str(t["id"]) not in passed]
            if not best:
                return {"task": "", "id": "", "claimed": False, "lost": len(lost)}
            t = best[0]
            if t["assignee"] == agent:
                return {"task": str(t["id"]), "id": str(t["id"]), "claimed": False,
                        "state": t["state"], "title": t["title"], "lost": len(lost)}
            try:
                got = self.move_task(agent, t["id"], "claim")
            except Refusal as e:
                if e.rule in ("registered-author", "room-membership"):
                    raise   # about the agent, not the task: every claim would be refused
                lost.add(str(t["id"]))  # someone else won it, or it cannot be claimed now
                continue
            return dict(got, claimed=True, title=t["title"], lost=len(lost))
        raise Conflict(f"{tries} ready tasks were taken by others first or refused",
                       "try again (gitdrop ready --claim)")

    def questions(self) -> list[dict]:
        """Open questions: tasks waiting in feedback, oldest first, with who asked
        and who may answer (the creator, or any lead)."""
        out = []
        for t in self._headers(self.view()):
            if t["state"] == "feedback":
                out.append({"task": str(t["id"]), "title": t["title"], "question": t["question"],
                            "asked_by": t["assignee"], "for": t["creator"], "since": t["updated"]})
        out.sort(key=lambda q: (q["since"], deps._num(q["task"])))
        return out

    def graph(self, root: str = "") -> dict:
        view = self.view()
        root = str(root or "").lstrip("#")
        if root and view.task(root) is None:
            raise NotFound(f"no task {root} in room {self.name!r}", "gitdrop task list")
        headers = [taskindex.full(t) for t in self._headers(view)]
        return deps.graph(self._lookup(headers), headers, root)

    # --- handshakes ----------------------------------------------------------
    @combinable
    def start_handshake(self, agent: str, plan: str, targets=(), key: str = "") -> dict:
        agent = self.resolve(agent)
        targets = [x.strip() for t in ([targets] if isinstance(targets, str) else targets)
                   for x in t.split(",") if x.strip()]
        key = self._keyed(key, "handshake-start", plan, targets)

        def build(view, tip):
            hid = self._next_id(view, view.handshake_ids())
            tg = [self._target(view, t) for t in targets] if targets else \
                [a for a in view.agent_ids() if a != agent]
            tg = list(dict.fromkeys(x for x in tg if x != agent))
            if any(x.startswith("@") or x == model.ALL for x in tg):
                raise UsageError("handshake targets are agents", "name each agent (team/name)")
            doc = model.with_defaults("handshake", {"id": hid, "initiator": agent, "targets": tg,
                                                    "created": self.clock()})
            return ({model.handshake_path(hid): render_file("handshake", doc, plan)},
                    self._msg(f"handshake {hid} started by {model.short(agent)}: "
                              f"{_subject_text(plan, 50)}", "", "handshake-start", key,
                              handshake=hid),
                    {"id": hid, "handshake": hid, "targets": tg, "status": "pending"})
        r = self._write(agent, build, key)
        # GO needs every target's ack: one that looks dead may never give it
        hints = self._dead_hints(list(r.get("targets", [])),
                                 "GO waits for its ack, which may not come soon")
        if hints:
            r["hints"] = hints
        return r

    @combinable
    def ack_handshake(self, agent: str, hid) -> dict:
        agent = self.resolve(agent)
        hid = int(hid)

        def build(view, tip):
            doc = view.handshake(hid)
            if doc is None:
                raise NotFound(f"no handshake {hid}", "list them with gitdrop handshake status")
            old, plan = doc
            acks = old["acks"] + [agent]
            status = "go" if set(acks) >= set(old["targets"]) else "pending"
            new = dict(old, acks=acks, status=status)
            subject = f"handshake {hid} acked by {model.short(agent)}" + (
                " — GO" if status == "go" else f" ({len(acks)}/{len(old['targets'])})")
            return ({model.handshake_path(hid): render_file("handshake", new, plan)},
                    self._msg(subject, "", "handshake-ack", handshake=hid),
                    {"id": hid, "handshake": hid, "status": status, "acks": acks})
        return self._write(agent, build)

    def handshake(self, hid) -> dict:
        doc = self.view().handshake(int(hid))
        if doc is None:
            raise NotFound(f"no handshake {hid} in room {self.name!r}",
                           "gitdrop handshake status lists the room's handshakes")
        h, plan = doc
        return dict(h, plan=plan, acked=h["acks"],
                    pending=[t for t in h["targets"] if t not in h["acks"]])

    def handshakes(self) -> list[dict]:
        view = self.view()
        return [self.handshake(h) for h in view.handshake_ids()]

    # --- contracts and context -------------------------------------------------
    @combinable
    def declare_contract(self, agent: str, name: str, spec: str, kind: str = "other",
                         project: str = "") -> dict:
        agent = self.resolve(agent)
        if not model.KEY_RE.match(name or ""):
            raise UsageError(f"bad contract name {name!r}", "use letters, digits, '.', '_', '-'")

        def build(view, tip):
            doc = view.contract(name)
            if doc is None:
                new = model.with_defaults("contract", {"name": name, "owner": agent,
                                                       "kind": kind or "other", "version": 1,
                                                       "project": project,
                                                       "updated": self.clock()})
            else:
                new = dict(doc[0], kind=kind or doc[0]["kind"], version=doc[0]["version"] + 1,
                           project=project or doc[0]["project"], updated=self.clock())
            return ({model.contract_path(name): render_file("contract", new, spec)},
                    self._msg(f"contract {name} v{new['version']} declared by "
                              f"{model.short(agent)}", "", "contract-declare", contract=name),
                    {"name": name, "version": new["version"], "owner": new["owner"]})
        return self._write(agent, build)

    def contracts(self, project: str = "", owner: str = "", kind: str = "") -> list[dict]:
        view = self.view()
        out = []
        for name in view.contract_names():
            c, spec = view.contract(name)
            if (project and c["project"] != project) or (kind and c["kind"] != kind) or \
                    (owner and c["owner"] != owner and model.short(c["owner"]) != owner):
                continue
            out.append(dict(c, spec=spec))
        return out

    def contract(self, name: str) -> dict:
        doc = self.view().contract(name)
        if doc is None:
            raise NotFound(f"no contract {name!r}", "gitdrop contract list")
        return dict(doc[0], spec=doc[1])

    @combinable
    def set_context(self, agent: str, key: str, value: str | None) -> dict:
        agent = self.resolve(agent)
        if not model.KEY_RE.match(key or ""):
            raise UsageError(f"bad context key {key!r}", "use letters, digits, '.', '_', '-'")

        def build(view, tip):
            text = None if value is None else value.rstrip("\n") + "\n"
            return ({model.context_path(key): text},
                    self._msg(f"context {key} {'cleared' if value is None else 'set'} by "
                              f"{model.short(agent)}", "", "context-set"),
                    {"key": key})
        return self._write(agent, build)

    def context(self, key: str = "") -> dict:
        view = self.view()
        if key:
            v = view.context(key)
            if v is None:
                raise NotFound(f"no context {key!r}", "gitdrop context get (lists the keys)")
            return {key: v.rstrip("\n")}
        return {k: (view.context(k) or "").rstrip("\n") for k in view.context_keys()}

    # --- path leases on the work repository -----------------------------------
    @combinable
    def take_lease(self, agent: str, glob: str, shared: bool = False,
                   ttl: int = LEASE_TTL) -> dict:
        """Reserve `glob` of the work repository for `ttl` seconds (refused, naming
        the holder, where another agent's live lease conflicts)."""
        agent = self.resolve(agent)
        problem = model.glob_problem(glob)
        if problem:
            raise UsageError(f"bad lease glob {str(glob)[:60]!r}: {problem}",
                             "give a path of the work repository, e.g. 'src/api/**'")
        if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
            raise UsageError(f"bad ttl {ttl!r}", "give a time to live such as 30m, 2h or 600")
        import secrets
        lid = secrets.token_hex(4)
        mode = "shared" if shared else "exclusive"

        def build(view, tip):
            now = self.clock()
            lease = model.with_defaults("lease", {"id": lid, "holder": agent, "glob": glob,
                                                  "mode": mode, "until": now + ttl,
                                                  "taken": now})
            return ({model.lease_path(lid): render_file("lease", lease)},
                    self._msg(f"lease {lid} on {glob} ({mode}) taken by {model.short(agent)}",
                              "", "lease-take", lease=lid), dict(lease))
        return self._write(agent, build)

    @combinable
    def release_lease(self, agent: str, which: str) -> dict:
        """Release a lease by its id, or the author's live leases on exactly this glob."""
        agent = self.resolve(agent)

        def build(view, tip):
            leases = view.leases()
            hit = [x for x in leases if x["id"] == which] or \
                [x for x in leases if x["glob"] == which and x["holder"] == agent]
            if not hit:
                raise NotFound(f"no lease {which!r} in room {self.name!r}",
                               "gitdrop lease list shows the leases and their ids")
            if len(hit) > 1:
                raise Ambiguous(f"{len(hit)} of your leases are on {which!r}",
                                "release one by its id (gitdrop lease list)")
            lease = hit[0]
            return ({model.lease_path(lease["id"]): None},
                    self._msg(f"lease {lease['id']} on {lease['glob']} released by "
                              f"{model.short(agent)}", "", "lease-release", lease=lease["id"]),
                    dict(lease))
        return self._write(agent, build)

    def leases(self, live: bool = True) -> list[dict]:
        """The room's leases (only those not expired by this clock, unless live=False),
        each with `live` and `left` (seconds to go)."""
        now = self.clock()
        out = [dict(x, live=x["until"] > now, left=max(0, x["until"] - now))
               for x in self.view().leases()]
        return sorted((x for x in out if x["live"] or not live),
                      key=lambda x: (x["glob"], x["id"]))

    # --- the room itself -------------------------------------------------------
    def update_room(self, agent: str, op: str, subject: str, **fields) -> dict:
        agent_id = agent if "/" in agent else self.resolve(agent)

        def build(view, tip):
            room = dict(view.room)
            for k, v in fields.items():
                room[k] = v(room) if callable(v) else v
            return ({model.ROOM_FILE: render_file("room", room)},
                    self._msg(subject, "", op), {"room": self.name})
        return self._write(agent_id, build)
