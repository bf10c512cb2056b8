"""The auto-responder: answers an agent's messages while it is away.

    from gitdrop.autorespond import Responder, load_rules
    r = Responder("~/.gitdrop/hub.git", "lobby", "core/spartan", load_rules("away.toml"))
    r.run_once()        # what is unread now; r.run() until stopped

Each round reads the away agent's unread messages (Room.inbox, which marks them
read: the rules refuse a send while a message to its author is unread) and, for
each message sent to it:

- a plain message gets an acknowledgement;
- a question, or a request for a decision, is passed on (escalated) to the lead
  of the agent's team or to a named agent, as a task assigned to them or as a
  message, and the sender is told where it went;
- nothing answers a message that is itself an automatic one (so two responders
  never answer each other), the agent's own messages, or a sender who had
  `per_sender` answers in the last `window` seconds (counted from the room's
  history, so the cap holds across restarts).

Every automatic act carries an idempotency key naming the message it answers
(Gitdrop-Id: autoreply-<commit> or autoescalate-<commit>), and every automatic
message starts with AUTO_PREFIX: that is how a responder knows one, and how the
cap is counted. The rules' loop guard stays the backstop: a refusal is reported
as an event, never raised. An agent registered as a person (`register --human`)
answers for itself: a Responder refuses to start for it.

Each message is answered at least once and never twice, even when the responder
is killed. It cannot answer before it reads (the rules refuse that send), so the
ids of the messages it is about to mark read are written down first, in a
pending file beside the hub (PENDING); each leaves the file once handled, and the
next round handles what a killed responder left there. The keys make an answer
given twice land once.

The rules file is TOML; see docs/AUTORESPOND.md.
"""

import os
import re
import threading
import time
import tomllib

from . import events, files, fmt, model
from .errors import GitdropError, NotFound, Refusal, UsageError
from .view import first_parent_walk
from .worker import catch_stop_signals, restore_signals

AUTO_PREFIX = "[auto-reply] "
KEY_ACK = "autoreply-"
KEY_ESCALATE = "autoescalate-"
QUOTE_MAX = 4000        # characters of the message quoted in an escalation
HISTORY_MAX = 20000     # commits read back when counting the answers in the window
SAFETY = 30.0           # seconds between rounds when nothing wakes the loop
SEND_TRIES = 10         # sends retried after reading what arrived meanwhile
PENDING_MAX = 8 << 20   # bytes of the pending file read (ids of 100,000 messages)
# Refusals that pass: a message whose ack or escalation was refused so stays pending
# for the next round. Taken for handled, the questions of a flood (the loop guard
# refusing the responder's sends) were read and reached nobody.
LATER = ("loop-guard", "unread-before-send", "conflict", "unreachable", "storage")
PENDING = "gitdrop/autorespond"   # in the hub (or a URL's mirror): <room>/<team>/<name>.pending

QUESTION_WORDS = ["who", "what", "when", "where", "why", "how", "which", "can", "could",
                  "should", "would", "will", "is", "are", "do", "does", "did", "may",
                  "shall"]
DECISION_WORDS = ["decide", "decision", "approve", "approval", "which option", "ok to",
                  "okay to", "sign off", "sign-off", "go ahead", "green light",
                  "choose between"]
KINDS = {"message": "message", "question": "question", "decision": "decision request"}
REACH = ("to", "cc", "team", "all")

DEFAULTS = {
    "away": "back later",
    "answer": ["to"],
    "status": True,
    "ack": {
        "text": "{agent} is away: {away}. Your message is recorded and {name} will read it.",
        "escalated": "{agent} is away: {away}. Your {kind} has been passed on to {to}"
                     "{task_ref}.",
    },
    "escalate": {"questions": "lead", "decisions": "lead", "as": "task", "tags": [],
                 "priority": 0},
    "limits": {"per_sender": 3, "window": 3600},
    "classify": {"questions": QUESTION_WORDS, "decisions": DECISION_WORDS},
}
FIELDS = ("agent", "name", "away", "sender", "kind", "to", "task", "task_ref")


# --- the rules file -----------------------------------------------------------------

def load_rules(path: str) -> dict:
    """The rules file at `path`, checked and completed with the defaults."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise UsageError(f"cannot read the rules file {path}: {e.strerror}",
                         "give the path of a TOML file (see docs/AUTORESPOND.md)") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"the rules file {path} is not TOML: {e}",
                         "see docs/AUTORESPOND.md for its format") from None
    return check_rules(data, path)


def check_rules(data: dict, where: str = "the rules") -> dict:
    """`data` (a parsed rules file) with the defaults filled in; UsageError names a
    key that is unknown or has a bad value."""
    def bad(key, why):
        raise UsageError(f"{where}: {key} {why}", "see docs/AUTORESPOND.md for the format")

    out = {}
    for key, default in DEFAULTS.items():
        given = data.get(key, {} if isinstance(default, dict) else default)
        if isinstance(default, dict):
            if not isinstance(given, dict):
                bad(key, "is a table ([" + key + "])")
            extra = sorted(set(given) - set(default))
            if extra:
                bad(f"{key}.{extra[0]}", "is not a key of the rules "
                    f"(known: {', '.join(default)})")
            out[key] = dict(default, **given)
        else:
            out[key] = given
    extra = sorted(set(data) - set(DEFAULTS))
    if extra:
        bad(extra[0], f"is not a key of the rules (known: {', '.join(DEFAULTS)})")
    if not isinstance(out["away"], str):
        bad("away", "is text")
    if not isinstance(out["status"], bool):
        bad("status", "is true or false")
    if not isinstance(out["answer"], list) or not out["answer"] or \
            any(x not in REACH for x in out["answer"]):
        bad("answer", f"is a list of {', '.join(REACH)}")
    for k in ("text", "escalated"):
        t = out["ack"][k]
        if not isinstance(t, str):
            bad(f"ack.{k}", "is text")
        try:
            t.format_map({f: "x" for f in FIELDS})
        except (KeyError, ValueError, IndexError) as e:
            bad(f"ack.{k}", f"has a bad placeholder ({e}); the known ones are "
                + ", ".join("{" + f + "}" for f in FIELDS))
    esc = out["escalate"]
    for k in ("questions", "decisions"):
        v = esc[k]
        if not isinstance(v, str) or not (v in ("lead", "none") or (
                v.startswith("person:") and model.is_agent_id(v[len("person:"):]))):
            bad(f"escalate.{k}", "is lead, none or person:team/name")
    if esc["as"] not in ("task", "message"):
        bad("escalate.as", "is task or message")
    if not isinstance(esc["tags"], list) or not all(isinstance(t, str) for t in esc["tags"]):
        bad("escalate.tags", "is a list of tags")
    if not isinstance(esc["priority"], int) or isinstance(esc["priority"], bool):
        bad("escalate.priority", "is a whole number")
    for k in ("per_sender", "window"):
        v = out["limits"][k]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            bad(f"limits.{k}", "is a whole number of at least 1")
    for k in ("questions", "decisions"):
        v = out["classify"][k]
        if not isinstance(v, list) or not all(isinstance(w, str) and w.strip() for w in v):
            bad(f"classify.{k}", "is a list of words")
    return out


# --- what a message is --------------------------------------------------------------

def classify(text: str, rules: dict | None = None) -> str:
    """"decision", "question" or "message". A decision request names a decision
    (decide, approve, which option, ok to, ...); a question has a sentence ending in
    '?' or starts with a question word (who, what, can, should, ...)."""
    words = (rules or DEFAULTS)["classify"]
    low = " ".join(text.lower().split())
    for phrase in words["decisions"]:
        if re.search(r"(?<![\w-])" + re.escape(phrase.lower().strip()) + r"(?![\w-])", low):
            return "decision"
    # From the first '?' of a run only: tried at each, 16,000 of them took 7 s.
    if re.search(r"(?<!\?)\?+[\"')\]]*(\s|$)", low):
        return "question"
    first = re.match(r"[^\w]*(\w+)", low)
    if first and first.group(1) in {w.lower().strip() for w in words["questions"]}:
        return "question"
    return "message"


def is_auto(reader, ev: dict) -> bool:
    """A message some responder wrote: its key names a message it answers, or its
    text starts with AUTO_PREFIX."""
    if ev.get("text", "").startswith(AUTO_PREFIX.strip()):
        return True
    try:
        trailers = reader.commit(ev["id"]).trailers
    except Exception:
        return False
    key = next((v for k, v in trailers if k == "id"), "")
    return key.startswith((KEY_ACK, KEY_ESCALATE))


def _quote(text: str) -> str:
    if len(text) > QUOTE_MAX:
        text = text[:QUOTE_MAX] + " […]"
    return "\n".join("> " + ln if ln else ">" for ln in text.strip().splitlines())


def _first_line(text: str, width: int) -> str:
    line = " ".join(text.strip().split("\n", 1)[0].split())
    return line if len(line) <= width else line[: width - 1] + "…"


# --- the responder -----------------------------------------------------------------

class Responder:
    def __init__(self, hub, room: str, agent: str, rules: dict, on_event=None):
        """`hub`: a Hub, or a path or git URL. `rules`: from load_rules (or a dict
        checked by check_rules). `on_event(dict)`: told of every act (ack, escalated,
        skipped, refused, error) and of started/stopped. Refuses (UsageError) an agent
        registered as a person, and (NotFound) one not in the room."""
        from .opener import open_hub
        self.hub = open_hub(hub, create=False) if isinstance(hub, str) else hub
        self.hub_spec = hub if isinstance(hub, str) else self.hub.path
        self.room = self.hub.room(room)
        self.rules = check_rules(rules)
        self.on_event = on_event or (lambda ev: None)
        view = self.room.view()
        self.agent = self.room.resolve(agent, view)
        me = view.agent(self.agent)
        if me.get("human"):
            raise UsageError(f"{self.agent} is a person (registered with --human): a person "
                             "answers for themselves, and is never answered for",
                             "run the auto-responder for an agent, not for a person")
        for k in ("questions", "decisions"):
            target = self.rules["escalate"][k]
            if target.startswith("person:"):
                who = target[len("person:"):]
                if who == self.agent:
                    raise UsageError(f"escalate.{k} names {who}, the agent who is away",
                                     "name someone else, or lead")
                if view.agent(who) is None:
                    raise NotFound(f"escalate.{k} names {who}, who is not registered in "
                                   f"room {self.room.name!r}", "check gitdrop who")
        self._senders: dict[str, str] = {}   # message commit -> its author
        self.pending_path = os.path.join(self.room.store.path, PENDING, self.room.name,
                                         *model.split_agent(self.agent)) + ".pending"
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self.handled = 0

    # --- one round ----------------------------------------------------------------
    def run_once(self) -> list[dict]:
        """Answer what a killed responder left pending, and what is unread now; the
        events of this round."""
        out = []
        queue = self._left_pending()
        known = {e["id"] for e in queue}
        queue += [e for e in self._read() if e["id"] not in known]
        counts = self._counts()
        while queue:
            ev = queue.pop(0)
            got = self._handle(ev, counts, queue)
            out += got
            if any(e["event"] == "refused" and e.get("rule") in LATER for e in got):
                continue   # left pending: a later round tries again (what was done replays)
            self._handled(ev["id"])
        return out

    def _read(self) -> list[dict]:
        """The unread messages, marked read once their ids are pending (a kill between
        the read and the answer loses none); notices after the last message stay
        unread (nothing needs them read to send)."""
        evs = self.room.inbox(self.agent, limit=0, peek=True)["messages"]
        last = max((i for i, e in enumerate(evs) if e["op"] == "send"), default=-1)
        if last < 0:
            return []
        self._write_pending(self._pending() + [e["id"] for e in evs[:last + 1]
                                               if e["op"] == "send"], sync=True)
        got = self.room.inbox(self.agent, limit=last + 1)["messages"]
        return [e for e in got if e["op"] == "send"]

    # --- the pending file: read, not yet handled -----------------------------------
    def _pending(self) -> list[str]:
        """The ids in the pending file. Only a plain file of it is read, and only as
        much as ids take: a FIFO planted there hung every round, a folder raised, a
        link to /dev/zero read until memory ran out."""
        data = files.read_plain(self.pending_path, PENDING_MAX) or b""
        try:
            return [x for x in data.decode("ascii").split() if len(x) in (40, 64)]
        except UnicodeDecodeError:
            return []

    def _write_pending(self, ids: list[str], sync: bool = False) -> None:
        """`sync`: on the device before the read it announces (a handled id that
        comes back after a crash is answered again, and lands once: its key)."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            try:
                os.unlink(self.pending_path)
            except FileNotFoundError:
                pass
            return
        folder = os.path.dirname(self.pending_path)
        os.makedirs(folder, exist_ok=True)
        files.write_whole(self.pending_path, ("\n".join(ids) + "\n").encode(), sync=sync)
        if sync:
            fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _handled(self, oid: str) -> None:
        left = self._pending()
        if oid in left:
            self._write_pending([x for x in left if x != oid])

    def _left_pending(self) -> list[dict]:
        """The messages a killed responder had marked read (or was about to) and not
        handled, as the inbox shows them; an id that names no message to this agent
        is dropped."""
        ids = self._pending()
        if not ids:
            return []
        reader = self.room.store.reader
        view = self.room.view()
        me = view.agent(self.agent)
        caps = me["caps"] if me else []
        out = []
        for oid in ids:
            try:
                ev = events.event(reader, reader.commit(oid))
            except Exception:   # not in this hub (a mirror made again, say)
                ev = None
            how = events.concerns(ev, self.agent, lambda: view.is_lead(self.agent), caps) \
                if ev is not None and ev["op"] == "send" else ""
            if how:
                out.append(dict(ev, via=how))
            else:
                self._handled(oid)
        return out

    def _counts(self) -> dict[str, int]:
        """Messages answered per sender in the last `window` seconds, from the room's
        history: the automatic acts of this agent, each naming the message it answers."""
        window = self.rules["limits"]["window"]
        since = self.room.clock() - window
        reader = self.room.store.reader
        answered = {}
        tip = self.room.store.room_tip(self.room.name)
        for n, c in enumerate(first_parent_walk(reader, tip)):
            if n >= HISTORY_MAX or c.time < since:
                break
            if c.author != self.agent:
                continue
            key = next((v for k, v in c.trailers if k == "id"), "")
            for prefix in (KEY_ACK, KEY_ESCALATE):
                if key.startswith(prefix):
                    answered[key[len(prefix):]] = c.time
        senders = {oid: self._sender(oid) for oid in answered}
        # What this machine's responders answered, kept beside the pending file: the
        # walk reads back HISTORY_MAX commits at most, and in a room that busy the
        # answers before them fell out of the count, past per_sender.
        for when, sender, oid in self._answered_here():
            if when >= since:
                senders.setdefault(oid, sender)
        counts: dict[str, int] = {}
        for sender in senders.values():
            if sender:
                counts[sender] = counts.get(sender, 0) + 1
        return counts

    def _answered_here(self) -> list[tuple[int, str, str]]:
        data = files.read_plain(self.pending_path[:-len(".pending")] + ".answered", PENDING_MAX)
        out = []
        for line in (data or b"").decode("utf-8", "replace").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].isdigit() and model.is_agent_id(parts[1]):
                out.append((int(parts[0]), parts[1], parts[2]))
        return out

    def _note_answered(self, sender: str, oid: str) -> None:
        """Keep this answer (and those still in the window) for _counts."""
        since = self.room.clock() - self.rules["limits"]["window"]
        kept = [x for x in self._answered_here() if x[0] >= since] + \
            [(self.room.clock(), sender, oid)]
        try:
            os.makedirs(os.path.dirname(self.pending_path), exist_ok=True)
            files.write_whole(self.pending_path[:-len(".pending")] + ".answered",
                              "".join(f"{w} {a} {o}\n" for w, a, o in kept).encode(), 0o600)
        except OSError:
            pass   # the walk counts it, as before

    def _sender(self, oid: str) -> str:
        if oid not in self._senders:
            try:
                self._senders[oid] = self.room.store.reader.commit(oid).author
            except Exception:
                self._senders[oid] = ""
        return self._senders[oid]

    def _handle(self, ev: dict, counts: dict, queue: list) -> list[dict]:
        sender, oid = ev["from"], ev["id"]
        base = {"message": oid, "from": sender}
        self._senders[oid] = sender
        if sender == self.agent:
            return [self._emit("skipped", base, reason="own")]
        if ev.get("via") not in self.rules["answer"]:
            return [self._emit("skipped", base, reason=f"not-direct ({ev.get('via')})")]
        if is_auto(self.room.store.reader, ev):
            return [self._emit("skipped", base, reason="auto-reply")]
        cap = self.rules["limits"]["per_sender"]
        if counts.get(sender, 0) >= cap:
            return [self._emit("skipped", base, reason="capped",
                               cap=cap, window=self.rules["limits"]["window"])]
        kind = classify(ev.get("text", ""), self.rules)
        base["kind"] = kind
        out = []
        fields = {"agent": self.agent, "name": model.short(self.agent),
                  "away": self.rules["away"], "sender": sender, "kind": KINDS[kind],
                  "to": "", "task": "", "task_ref": ""}
        answered = replayed = False
        template = self.rules["ack"]["text"]
        if kind != "message":
            target, why = self._target(kind)
            if not target:
                out.append(self._emit("skipped", base, reason=why, action="escalate"))
            else:
                done = self._escalate(ev, kind, target, queue)
                out.append(done)
                if done["event"] == "escalated":
                    answered, replayed = True, done["replayed"]
                    template = self.rules["ack"]["escalated"]
                    fields.update(to=target, task=done.get("task", ""),
                                  task_ref=f" as task {done['task']}" if done.get("task")
                                  else "")
        if template:
            text = AUTO_PREFIX + template.format_map(fields)
            done = self._try(lambda: self.room.send(
                self.agent, sender, text, reply_to=oid, key=KEY_ACK + oid), queue)
            if isinstance(done, GitdropError):
                out.append(self._refused(base, "ack", done))
            else:
                answered, replayed = True, replayed or bool(done.get("replayed"))
                out.append(self._emit("ack", base, commit=done.get("commit", ""),
                                      replayed=replayed))
        if answered:
            if not replayed:   # else the history's count has it (one per message)
                counts[sender] = counts.get(sender, 0) + 1
                self._note_answered(sender, oid)
            self.handled += 1
        return out

    def _target(self, kind: str) -> tuple[str, str]:
        """(who gets a question or decision, or "" and why not)."""
        rule = self.rules["escalate"]["questions" if kind == "question" else "decisions"]
        if rule == "none":
            return "", "not escalated (rules say none)"
        view = self.room.view()
        if rule == "lead":
            who = model.lead_of_team(view.room, model.split_agent(self.agent)[0])
            if not who or who == self.agent or view.agent(who) is None:
                return "", "no lead to escalate to"
            return who, ""
        who = rule[len("person:"):]
        return (who, "") if view.agent(who) is not None else ("", f"{who} is not registered")

    def _escalate(self, ev: dict, kind: str, target: str, queue: list) -> dict:
        sender, oid = ev["from"], ev["id"]
        base = {"message": oid, "from": sender, "kind": kind, "to": target}
        esc = self.rules["escalate"]
        when = fmt.stamp(ev.get("time") or 0, "%Y-%m-%d %H:%M UTC")
        quoted = _quote(ev.get("text", ""))
        where = (f"Message {oid} in room {self.room.name} ({when}); "
                 f"`git show {oid}` in the hub shows it, `gitdrop history` lists it.")
        if esc["as"] == "task":
            max_title = self.room.view().settings["max_title"]
            head = f"{KINDS[kind].capitalize()} from {model.short(sender)} for " \
                   f"{model.short(self.agent)}: "
            title = head + _first_line(ev.get("text", ""), max(10, max_title - len(head)))
            body = (f"{sender} wrote to {self.agent}, who is away ({self.rules['away']}):\n\n"
                    f"{quoted}\n\n{where}\n\n"
                    f"Answer {sender} directly (gitdrop send {sender} -m ...), then complete "
                    "this task.\n")
            done = self._try(lambda: self.room.create_task(
                self.agent, title, body=body, assignee=target, priority=esc["priority"],
                tags=esc["tags"], review=False, key=KEY_ESCALATE + oid), queue)
            if isinstance(done, GitdropError):
                return self._refused(base, "escalate", done)
            return self._emit("escalated", base, **{"as": "task"}, task=str(done.get("id", "")),
                              commit=done.get("commit", ""), replayed=bool(done.get("replayed")))
        text = (f"{AUTO_PREFIX}{sender} sent {self.agent} a {KINDS[kind]}, and "
                f"{model.short(self.agent)} is away ({self.rules['away']}):\n\n"
                f"{quoted}\n\n{where} Please answer {sender} directly.")
        done = self._try(lambda: self.room.send(self.agent, target, text,
                                                key=KEY_ESCALATE + oid), queue)
        if isinstance(done, GitdropError):
            return self._refused(base, "escalate", done)
        return self._emit("escalated", base, **{"as": "message"}, task="",
                          commit=done.get("commit", ""), replayed=bool(done.get("replayed")))

    def _try(self, act, queue: list):
        """act()'s result, or the GitdropError that refused it. A send refused because
        a message arrived meanwhile reads it (into `queue`, answered in turn) and
        tries again; a key already used answers as done."""
        for _ in range(SEND_TRIES):
            try:
                return act()
            except Refusal as e:
                if e.rule == "unread-before-send":
                    queue.extend(self._read())
                    continue
                if e.rule == "idempotency-key":   # answered before (other rules then)
                    return {"replayed": True, "commit": e.commit.split(" ")[0]}
                return e
            except GitdropError as e:
                return e
        return Refusal("unread-before-send", "messages kept arriving while answering",
                       "the next round answers them")

    def _refused(self, base: dict, action: str, err: GitdropError) -> dict:
        return self._emit("refused", base, action=action, rule=err.rule, reason=err.reason,
                          fix=err.fix)

    # --- the loop ------------------------------------------------------------------
    def run(self) -> int:
        """Answer until stopped (SIGTERM, SIGINT or stop()), sleeping on the notifier
        between rounds; the number of messages answered."""
        from .notifier import Notifier
        old = catch_stop_signals(self.stop)
        held = self._hold()
        n = Notifier(self.hub_spec)
        n.subscribe(self.room.name, self.agent, lambda evs: self._wake.set())
        n.start()
        before = self._set_status()
        self._emit("started", {}, away=self.rules["away"])
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                try:
                    self.run_once()
                except GitdropError as e:   # the hub moved under us, say: next round
                    self._emit("error", {}, rule=e.rule, reason=e.reason)
                if self._stopping.is_set():
                    break
                self._wake.wait(SAFETY)
        finally:
            n.stop()
            self._restore_status(before)
            restore_signals(old)
            os.close(held)
        self._emit("stopped", {}, handled=self.handled)
        return self.handled

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def _hold(self) -> int:
        """This agent's responder lock, held while it runs (flock on <pending>.lock):
        two responders for one agent shared its pending file, and each put back
        the other's "away" status as the agent's own."""
        import fcntl
        os.makedirs(os.path.dirname(self.pending_path), exist_ok=True)
        fd = os.open(self.pending_path[:-len(".pending")] + ".lock",
                     os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | files.NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UsageError(f"an auto-responder is already answering for {self.agent} in "
                             f"room {self.room.name!r} on this machine",
                             "stop that one first (SIGTERM), or leave it running") from None
        return fd

    def _set_status(self):
        """Says "away: ..." in the agent's status (rules: status = true); the status
        it had, to put back, or None. That one is kept in <pending>.status until it
        is put back: a responder killed with -9 left "away: ..." as the status, and
        the next one took that for the agent's own and put it back for good."""
        if not self.rules["status"]:
            return None
        kept = self.pending_path[:-len(".pending")] + ".status"
        try:
            old = self.room.view().agent(self.agent)["status"]
            new = f"away: {self.rules['away']}"[:200]
            saved = files.read_plain(kept, 4096)
            if saved is not None:
                before = saved.decode("utf-8", "replace")
            else:
                before = "" if old == new else old
                files.write_whole(kept, before.encode(), 0o600)
            if old != new:
                self.room.set_status(self.agent, new)
            return before
        except (GitdropError, OSError):
            return None

    def _restore_status(self, old) -> None:
        if old is None:
            return
        try:
            self.room.set_status(self.agent, old)
            os.unlink(self.pending_path[:-len(".pending")] + ".status")
        except (GitdropError, OSError):
            pass   # kept: the next responder puts it back

    def _emit(self, what: str, base: dict, **extra) -> dict:
        ev = dict({"event": what, "agent": self.agent, "room": self.room.name,
                   "time": int(time.time())}, **base, **extra)
        try:
            self.on_event(ev)
        except Exception:
            pass
        return ev
