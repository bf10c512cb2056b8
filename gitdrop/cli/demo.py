"""`gitdrop demo`: a lead and two coders play the protocol on a throwaway hub.

Each step is one call of the core (plus one task file written and pushed with
plain git); the demo checks each outcome, so it doubles as a smoke test.
"""

import os
import shutil
import subprocess
import tempfile

from ..errors import GitdropError

LEAD, API, WEB = "core/juno", "core/spartan", "core/ada"

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

    def __init__(self, narrate: bool, out=print):
        self.steps = []
        self.narrate = narrate
        self.out = out

    def say(self, text: str = "") -> None:
        if self.narrate:
            self.out(text)

    def step(self, title: str, fn, expect: str = "ok"):
        """Run fn; `expect` is "ok" or the rule a refusal must name."""
        self.say(f"\n── {len(self.steps) + 1}. {title}")
        rec = {"step": len(self.steps) + 1, "title": title, "expect": expect}
        try:
            result = fn()
            rec.update(outcome="ok", detail=_brief(result))
            self.say(f"   ✔ {rec['detail']}")
        except GitdropError as e:
            result = None
            rec.update(outcome=e.rule, detail=e.reason, fix=e.fix)
            self.say(f"   ✘ refused by rule {e.rule}: {e.reason}")
            if e.fix:
                self.say(f"     next step: {e.fix}")
        rec["ok"] = rec["outcome"] == expect
        if not rec["ok"]:
            self.say(f"   !! expected {expect}, got {rec['outcome']}")
        self.steps.append(rec)
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
    return ", ".join(f"{k}={v}" for k, v in shown.items()) + (f" [{commit[:10]}]" if commit else "")


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
    os.makedirs(os.path.join(work, "tasks"), exist_ok=True)
    with open(os.path.join(work, "tasks", "3.md"), "w") as f:
        f.write(HAND_TASK)
    _git("add", "tasks/3.md", cwd=work)
    _git("-c", f"user.name={LEAD}", "-c", "user.email=juno@core.example", "commit", "-q",
         "-m", "task 3: document GET /users", cwd=work)
    p = subprocess.run(["git", "push", "origin", "HEAD:rooms/lobby"], cwd=work,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"the push was refused: {p.stderr.strip()}")
    return "pushed tasks/3.md: " + _git("log", "-1", "--format=%h %an %s", cwd=work).strip()


def run(keep: bool = False, narrate: bool = True, out=print) -> list[dict]:
    from .. import hub as hubmod

    tmp = tempfile.mkdtemp(prefix="gitdrop-demo-")
    story = Story(narrate, out)
    s = story.step
    try:
        hub_path = os.path.join(tmp, "hub.git")
        story.say(f"A throwaway hub at {hub_path}: a bare git repository; the room "
                  "'lobby' is the branch rooms/lobby.")
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
        s("juno writes tasks/3.md by hand, commits it with git and pushes (the hook checks it)",
          lambda: _push_task_by_hand(hub_path, os.path.join(tmp, "juno-clone")))
        s("ada claims task 3, which arrived by git push", lambda: r.move_task(WEB, "3", "claim"))
        s("the whole room re-checks from its first commit",
          lambda: f"{len(h.verify('lobby'))} commits, every one accepted")

        ok = sum(st["ok"] for st in story.steps)
        story.say(f"\n{ok} of {len(story.steps)} steps went as expected"
                  + (f"; the hub is kept at {hub_path}." if keep else "."))
        fmt_ = "%h %<(13)%an %s"
        story.say("Every act above is a commit; the room's history is plain git:\n"
                  f"$ git --git-dir {hub_path} log --reverse --format='{fmt_}' rooms/lobby\n")
        story.say(_git("--git-dir", hub_path, "log", "--reverse", f"--format={fmt_}",
                       "rooms/lobby").rstrip())
    except Exception as e:  # a step that cannot run at all ends the story
        story.steps.append({"step": len(story.steps) + 1, "title": "unexpected error",
                            "expect": "ok", "outcome": "error", "ok": False,
                            "detail": f"{type(e).__name__}: {e}"})
        story.say(f"   !! {type(e).__name__}: {e}")
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return story.steps
