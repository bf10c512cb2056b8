"""`gitdrop demo`: a lead and two coders play the protocol on a throwaway hub, then a
second team joins them in a closed room for a task both leads must sign, and the
loop guard stops a burst of messages.

Each step is one call of the core (plus one task file written and pushed with
plain git); the demo checks each outcome, so it doubles as a smoke test.
"""

import os
import shutil
import subprocess
import sys
import tempfile

from .. import model
from ..errors import GitdropError, UsageError
from .base import paint

LEAD, API, WEB = "core/juno", "core/spartan", "core/ada"
UI_LEAD, UI = "ui/lyra", "ui/finn"     # the second team
STRANGER = "ops/max"                   # of a team the closed room does not hold
ROOM = "launch"                        # the closed room of both teams
STEPS = 44                             # how many steps the story has (the progress bar's end)

PLAN = """Plan for the users page:
1. spartan declares the contract api.users, then builds GET /users (task 1).
2. ada builds the page that lists users against that contract (task 2).
Nobody starts before everyone has acked this plan (GO)."""

HAND_TASK = """+++
id = "3"
title = "Document GET /users in the README"
state = "pending"
creator = "core/juno"
priority = 1
tags = ["docs"]
+++
Describe the endpoint, its parameters and one example response.
"""


class Story:
    """Runs the steps, narrates them and records what each one did."""

    def __init__(self, narrate: bool, out=print, progress=None):
        self.steps = []
        self.narrate = narrate
        self.out = out
        self.progress = progress or (lambda done, total=None, what=None: None)

    def say(self, text: str = "") -> None:
        if self.narrate:
            self.out(text)

    @staticmethod
    def paint(text: str, colour: str) -> str:
        return paint(text, colour, sys.stdout)

    def act(self, title: str) -> None:
        self.say("\n" + self.paint(title, "bold"))

    def step(self, title: str, fn, expect: str = "ok"):
        """Run fn; `expect` is "ok" or the rule a refusal must name."""
        self.say(self.paint(f"\n── {len(self.steps) + 1}. {title}", "bold"))
        rec = {"step": len(self.steps) + 1, "title": title, "expect": expect}
        try:
            result = fn()
            rec.update(outcome="ok", detail=_brief(result))
            self.say(f"   {self.paint('✔', 'green')} {rec['detail']}")
        except GitdropError as e:
            result = None
            rec.update(outcome=e.rule, detail=e.reason, fix=e.fix)
            self.say(f"   {self.paint('✘ refused by rule ' + e.rule, 'yellow')}: {e.reason}")
            if e.fix:
                self.say(self.paint(f"     next step: {e.fix}", "dim"))
        rec["ok"] = rec["outcome"] == expect
        if not rec["ok"]:
            self.say(self.paint(f"   !! expected {expect}, got {rec['outcome']}", "red"))
        self.steps.append(rec)
        self.progress(len(self.steps), STEPS)
        return result


def _brief(result) -> str:
    if isinstance(result, str):
        return result
    if not isinstance(result, dict):
        return "done"
    if "messages" in result:
        return f"{len(result['messages'])} new: " + "; ".join(
            (m["text"] if m["op"] == "send" else m["subject"])[:60] for m in result["messages"])
    keys = ("agent", "id", "state", "status", "to", "name", "version")
    shown = {k: result[k] for k in keys if result.get(k) not in (None, "", [])}
    commit = result.get("commit", "")
    return ", ".join(f"{k}: {', '.join(map(str, v)) if isinstance(v, list) else v}"
                     for k, v in shown.items()) + (f" [{commit[:10]}]" if commit else "")


def _git(*args, cwd=None):
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(k, None)
    p = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {p.stderr.strip()}")
    return p.stdout


def _push_task_by_hand(hub_path: str, work: str) -> str:
    """What any agent with git can do: clone the room, add a task file, push."""
    _git("clone", "-q", "-b", "rooms/lobby", hub_path, work)
    path = model.task_path(3)   # tasks/<bucket>/3.md (docs/PROTOCOL.md)
    os.makedirs(os.path.join(work, os.path.dirname(path)), exist_ok=True)
    with open(os.path.join(work, path), "w") as f:
        f.write(HAND_TASK)
    _git("add", path, cwd=work)
    _git("-c", f"user.name={LEAD}", "-c", "user.email=juno@core.example", "commit", "-q",
         "-m", "task 3: document GET /users", cwd=work)
    p = subprocess.run(["git", "push", "origin", "HEAD:rooms/lobby"], cwd=work,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"the push was refused: {p.stderr.strip()}")
    return f"pushed {path}: " + _git("log", "-1", "--format=%h %an %s", cwd=work).strip()


def where(hub: str = "") -> str:
    """The path a demo builds its hub at, given --hub: a new or empty directory on this
    machine (else a UsageError before anything runs)."""
    from ..transports.remote import is_url
    if is_url(hub):
        raise UsageError(f"{hub} is a git URL; the demo builds a hub on this machine",
                         "give a new directory: gitdrop demo --hub /tmp/demo.git")
    path = os.path.abspath(os.path.expanduser(hub))
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise UsageError(f"{path} exists and is not empty; the demo builds a new hub",
                         "give a new or empty directory: gitdrop demo --hub /tmp/demo.git "
                         "(or leave --hub out for a throwaway one)")
    return path


def run(keep: bool = False, narrate: bool = True, out=print, hub: str = "",
        progress=None) -> dict:
    """Play the story. With `hub` (a new or empty directory, see where()) the hub is
    built there and kept; else in a temporary directory, kept only with `keep`.
    Returns {"steps": [...], "hub": path, "kept": bool}."""
    from .. import hub as hubmod

    hub_path = where(hub) if hub else ""
    keep = keep or bool(hub)
    tmp = tempfile.mkdtemp(prefix="gitdrop-demo-")      # the hub if none is given
    work = tempfile.mkdtemp(prefix="gitdrop-demo-work-")   # juno's clone: always goes
    hub_path = hub_path or os.path.join(tmp, "hub.git")
    story = Story(narrate, out, progress)
    s = story.step
    try:
        story.say(f"A {'' if keep else 'throwaway '}hub at {hub_path}: a bare git repository; "
                  "the room 'lobby' is the branch rooms/lobby.")
        story.act("Act 1: a lead and two coders in the lobby")
        h = s("create the hub", lambda: {"id": hubmod.init(hub_path, fsync=False).path})
        h = hubmod.Hub(hub_path)
        r = h.room("lobby")

        s("juno registers as the lead", lambda: r.register(LEAD, ["lead"], "runs the team"))
        s("spartan registers as a coder (backend)", lambda: r.register(API, ["coder"], "backend"))
        s("ada registers as a coder (frontend)", lambda: r.register(WEB, ["coder"], "frontend"))

        hs = s("juno proposes the plan: a handshake for spartan and ada",
               lambda: r.start_handshake(LEAD, PLAN, [API, WEB]))
        hid = hs["id"] if hs else 1
        t1 = s("juno creates task 1 for spartan, bound to the handshake",
               lambda: r.create_task(LEAD, "Build GET /users", "Return id and name of every "
                                     "user, 50 per page.", assignee=API, handshake=hid,
                                     priority=2, tags=["api"]))
        t2 = s("juno creates task 2 for ada, bound to the handshake",
               lambda: r.create_task(LEAD, "Users page", "List the users from GET /users.",
                                     assignee=WEB, handshake=hid, priority=1, tags=["web"]))
        t1, t2 = (t1 or {}).get("id", "1"), (t2 or {}).get("id", "2")
        s("spartan tries to start task 1 before the plan is agreed",
          lambda: r.move_task(API, t1, "start"), expect="handshake-go")
        s("spartan reads the inbox (the plan and the task)", lambda: r.inbox(API))
        s("spartan acks the plan", lambda: r.ack_handshake(API, hid))
        s("ada reads the inbox and acks: every target has acked, GO",
          lambda: (r.inbox(WEB), r.ack_handshake(WEB, hid))[1])
        s("spartan declares the contract api.users (version 1)",
          lambda: r.declare_contract(API, "api.users", "GET /users?page=N -> "
                                     "[{id: int, name: str}] (50 per page)", "api_endpoint"))
        s("juno tells both coders the contract is up",
          lambda: r.send(LEAD, [API, WEB], "api.users v1 is declared; build against it."))
        s("spartan starts task 1 (GO: allowed now)", lambda: r.move_task(API, t1, "start"))
        s("spartan messages ada without reading juno's message first",
          lambda: r.send(API, WEB, "ping me if the contract is unclear"),
          expect="unread-before-send")
        s("spartan reads the inbox", lambda: r.inbox(API))
        s("spartan sends again: accepted",
          lambda: r.send(API, WEB, "ping me if the contract is unclear"))
        s("spartan submits task 1 for review",
          lambda: r.move_task(API, t1, "submit", note="GET /users done"))
        s("juno rejects it: pagination is missing",
          lambda: r.move_task(LEAD, t1, "reject", note="no pagination: page=N is ignored"))
        s("spartan reworks and submits again",
          lambda: r.move_task(API, t1, "submit", note="page=N honoured, with tests"))
        s("juno approves task 1", lambda: r.move_task(LEAD, t1, "approve"))
        s("ada reads the inbox and starts task 2",
          lambda: (r.inbox(WEB), r.move_task(WEB, t2, "start"))[1])
        s("ada tries to approve her own task 2 (illegal move)",
          lambda: r.move_task(WEB, t2, "approve"), expect="task-state-machine")
        s("ada submits task 2; juno approves",
          lambda: (r.move_task(WEB, t2, "submit", note="page done"),
                   r.move_task(LEAD, t2, "approve"))[1])
        s(f"juno writes {model.task_path(3)} by hand, commits it with git and pushes (the hook "
          "checks it)",
          lambda: _push_task_by_hand(hub_path, os.path.join(work, "juno-clone")))
        s("ada claims task 3, which arrived by git push", lambda: r.move_task(WEB, "3", "claim"))
        s("the whole room re-checks from its first commit",
          lambda: f"{len(h.verify('lobby'))} commits, every one accepted")

        story.act(f"Act 2: a second team, ui, and a closed room '{ROOM}' for both teams")
        s("lyra creates team ui (lead lyra, member finn)",
          lambda: {"name": h.register_team("ui", UI_LEAD, [UI])["name"]})
        s(f"juno creates room {ROOM} for teams core and ui only (a new branch rooms/{ROOM})",
          lambda: (lambda r: f"room={r['room']}, teams={', '.join(r['teams'])}, leads="
                   f"{', '.join(r['leads'].values())} [{r['commit'][:10]}]")(
                       h.create_room(LEAD, ROOM, ["core", "ui"])))
        x = h.room(ROOM)
        s("juno and lyra join it as their teams' leads",
          lambda: ", ".join(x.register(a, ["lead"])["agent"] for a in (LEAD, UI_LEAD))
          + " registered as leads")
        s("finn (ui) joins it as a coder", lambda: x.register(UI, ["coder"], "frontend"))
        s("max, of team ops, tries to join the closed room",
          lambda: x.register(STRANGER, ["coder"]), expect="room-membership")
        t = s("juno creates a task for finn: it crosses teams (core asks, ui does)",
              lambda: x.create_task(LEAD, "Ship the users page", "Put ada's page behind "
                                    "the launch flag.", assignee=UI, priority=1))
        t = (t or {}).get("id", "1")
        s("finn tries to start it before both leads have signed",
          lambda: x.move_task(UI, t, "start"), expect="dual-sign")
        s("juno signs it for core", lambda: x.move_task(LEAD, t, "sign"))
        s("lyra signs it for ui: both teams agree", lambda: x.move_task(UI_LEAD, t, "sign"))
        s("finn starts it: allowed now", lambda: x.move_task(UI, t, "start"))

        story.act("Act 3: the loop guard stops a burst")
        s(f"lyra caps {ROOM} at 3 messages a minute per agent (gitdrop room settings "
          "loop_cap 3)", lambda: (lambda r: f"loop_cap={r['settings']['loop_cap']} (default "
                                   f"{r['defaults']['loop_cap']})")(
              h.room_settings(ROOM, UI_LEAD, {"loop_cap": 3})))
        s("finn reads the inbox", lambda: x.inbox(UI))
        for n in (1, 2, 3):
            s(f"finn sends status update {n} of a burst: accepted",
              lambda n=n: x.send(UI, UI_LEAD, f"status {n}: the page builds"))
        s("finn sends a 4th within the minute: the loop guard refuses it",
          lambda: x.send(UI, UI_LEAD, "status 4: the page builds"), expect="loop-guard")
        s(f"the room {ROOM} re-checks from its first commit",
          lambda: f"{len(h.verify(ROOM))} commits, every one accepted")

        ok = sum(st["ok"] for st in story.steps)
        story.say(f"\n{ok} of {len(story.steps)} steps went as expected.")
        fmt_ = "%h %<(13)%an %s"
        if keep:
            story.say(f"The hub is kept at {hub_path}; look around with\n"
                      f"  export GITDROP_HUB={hub_path}; gitdrop --as {LEAD} --room {ROOM} "
                      "task list --all\n"
                      "Every act above is a commit; the lobby's history is plain git:\n"
                      f"$ git --git-dir {hub_path} log --reverse --format='{fmt_}' rooms/lobby\n")
        else:
            story.say("Every act above is a commit; the lobby's history is plain git (read "
                      "here before the throwaway hub is deleted; gitdrop demo --keep, or "
                      "--hub PATH, keeps it):\n"
                      f"$ git log --reverse --format='{fmt_}' rooms/lobby\n")
        log = _git("--git-dir", hub_path, "log", "--reverse", f"--format={fmt_}",
                   "rooms/lobby").rstrip()
        story.say("\n".join(story.paint(line[:7], "yellow") + line[7:]
                            for line in log.splitlines()))
    except Exception as e:  # a step that cannot run at all ends the story
        story.steps.append({"step": len(story.steps) + 1, "title": "unexpected error",
                            "expect": "ok", "outcome": "error", "ok": False,
                            "detail": f"{type(e).__name__}: {e}"})
        story.say(story.paint(f"   !! {type(e).__name__}: {e}", "red"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not keep or hub:
            shutil.rmtree(tmp, ignore_errors=True)   # empty when the hub is elsewhere
    return {"steps": story.steps, "hub": hub_path, "kept": keep}
