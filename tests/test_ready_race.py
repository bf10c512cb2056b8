"""The ready queue under a race of real processes.

4 worker processes race `ready --claim` over 100 tasks with dependencies: every task
is claimed once per lease round, never before its dependencies completed; one worker
is killed with -9 mid-task, and its task is reaped after the lease and done by
another. Three workers claim through the core (Room.claim_next, what `gitdrop ready
--claim` calls), the fourth through the command itself. Everything is judged from
the room's history afterwards, then re-checked by `gitdrop verify`.

And the command alone: 5 `gitdrop ready --claim --json` started at once over 4 ready
tasks: each task has one winner, the fifth hears "nothing ready"."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import namedtuple

from gitdrop import fmt, hub as hubmod
from gitdrop.view import first_parent_walk

from cli_helpers import ENTRY, OWN_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEAD = "core/juno"
LEASE = 4            # seconds: the killed worker's task comes back after this
LAYERS, WIDTH = 10, 10

# A worker: claim the best ready task, start it, work a moment, submit; until no task
# is left that is not completed. `cli`: claims through `gitdrop ready --claim --json`.
# `die`: after starting that many tasks, say which and wait to be killed.
WORKER = r"""
import json, os, random, subprocess, sys, time
from gitdrop import hub as hubmod
from gitdrop.errors import Conflict, Refusal
hub, agent, mode, die, entry = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), \
    json.loads(sys.argv[5])
room = hubmod.Hub(hub).room("lobby")
env = dict(os.environ, GITDROP_HUB=hub, GITDROP_ROOM="lobby", GITDROP_AGENT=agent)
started, end = 0, time.time() + 100

def say(*words):
    print(*words, flush=True)

def claim():
    if mode == "cli":
        p = subprocess.run(entry + ["ready", "--claim", "--json"], env=env,
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if p.returncode == 6:                       # the room kept moving: try again
            raise Conflict("kept moving", "")
        assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
        return json.loads(p.stdout)
    return room.claim_next(agent)

while time.time() < end:
    try:
        r = claim()
    except Conflict:
        say("conflict claim")
        continue
    tid = r["task"]
    if not tid:
        if not room.list_tasks():                   # every task completed: done
            say("done")
            sys.exit(0)
        time.sleep(0.2 if mode == "cli" else 0.05)
        continue
    say("claimed" if r["claimed"] else "mine", tid, "lost", r["lost"])
    try:
        room.move_task(agent, tid, "start")
        started += 1
        if started == die:
            say("started", tid)
            time.sleep(600)                         # mid-task: killed here
        time.sleep(random.uniform(0, 0.05))         # the work
        room.move_task(agent, tid, "submit", note="done")
        say("submitted", tid)
    except (Refusal, Conflict) as e:                # reaped meanwhile, or the room kept moving
        say("gave up", tid, getattr(e, "rule", "conflict"))
say("deadline")
sys.exit(1)
"""


def _env():
    return {k: v for k, v in os.environ.items() if k not in OWN_ENV}


def _dag():
    """{task number: [numbers it waits on]}: 10 layers of 10, each task after the one
    above it, every other one also after a second task of the layer above."""
    after = {}
    for k in range(LAYERS):
        for j in range(WIDTH):
            n = k * WIDTH + j + 1
            after[n] = [] if k == 0 else \
                [(k - 1) * WIDTH + j + 1] + ([(k - 1) * WIDTH + (j + 3) % WIDTH + 1]
                                             if j % 2 == 0 else [])
    return after


Act = namedtuple("Act", "i op task author oid time")


def _history(hub):
    """The room's commits, oldest first, as Acts."""
    tip = hub.store.room_tip("lobby")
    out = list(first_parent_walk(hub.store.reader, tip))
    out.reverse()
    return [Act(i, c.op, fmt.trailer(c.trailers, "task"), c.author, c.oid, c.time)
            for i, c in enumerate(out)]


def _read(path):
    try:
        with open(path) as f:
            return f.read().split("\n")
    except FileNotFoundError:
        return []


def test_workers_race_ready_claim_over_a_dag_and_a_killed_one_is_reaped(tmp_path):
    t0 = time.monotonic()
    hub = hubmod.init(str(tmp_path / "hub.git"), fsync=False)
    room = hub.room("lobby")
    room.register(LEAD, ["lead"])
    workers = {  # agent: (mode, caps, die after starting this many tasks); started in order
        "core/w3": ("core", ["db"], 2),    # killed mid-task
        "core/w1": ("core", ["db"], 0),
        "core/w2": ("core", [], 0),        # lacks db: never gets a task that requires it
        "core/w4": ("cli", ["db"], 0),     # claims through the command
    }
    victim = "core/w3"
    for a, (_m, caps, _d) in workers.items():
        room.register(a, ["coder"], caps=caps)
    hub.room_settings("lobby", by="hub/admin", changes={"task_lease": LEASE})
    after = _dag()
    ids = {}
    for n, deps_ in after.items():
        got = room.create_task(LEAD, f"task {n}", after=[ids[d] for d in deps_],
                               requires=["db"] if n % 7 == 0 else [], max_retries=10,
                               priority=n % 3)
        ids[n] = got["id"]
    want_after = {ids[n]: {ids[d] for d in ds} for n, ds in after.items()}
    needs_db = {ids[n] for n in after if n % 7 == 0}
    built = time.monotonic() - t0

    procs, logs = {}, {}
    victim_task, killed_at, reaped = "", 0.0, []
    conflicts = 0
    try:
        for a, (mode, _caps, die) in workers.items():
            logs[a] = str(tmp_path / f"{a.replace('/', '-')}.log")
            with open(logs[a], "w") as out:
                procs[a] = subprocess.Popen(
                    [sys.executable, "-c", WORKER, hub.path, a, mode, str(die),
                     json.dumps(ENTRY)], stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, cwd=ROOT, env=_env())
        deadline = time.monotonic() + 75
        while time.monotonic() < deadline:
            # the lead reviews, the reaper reaps, and the victim dies once it started
            for t in room.list_tasks(state="review"):
                try:
                    room.move_task(LEAD, t["id"], "approve")
                except Exception as e:   # noqa: BLE001 - "kept moving": next round
                    if type(e).__name__ != "Conflict":
                        raise
                    conflicts += 1
            reaped += hub.reap_tasks()
            if not victim_task:
                line = [x for x in _read(logs[victim]) if x.startswith("started ")]
                if line:
                    victim_task = line[0].split()[1]
                    os.kill(procs[victim].pid, signal.SIGKILL)
                    assert procs[victim].wait(10) == -signal.SIGKILL
                    killed_at = time.monotonic()
            if all(p.poll() is not None for p in procs.values()) and not room.list_tasks():
                break
            time.sleep(0.05)
        rcs = {a: p.poll() for a, p in procs.items()}
        ended = time.monotonic()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
    took = ended - t0
    out = {a: _read(path) for a, path in logs.items()}
    report = "\n".join(f"{a}: rc {rcs[a]}: " + " | ".join(x for x in out[a] if x)[-1500:]
                       for a in workers)
    assert victim_task, "the victim never started a second task:\n" + report
    assert rcs == {"core/w1": 0, "core/w2": 0, "core/w3": -signal.SIGKILL,
                   "core/w4": 0}, report

    # every task completed
    final = {t["id"]: t for t in room.list_tasks(include_done=True)}
    assert set(final) == set(want_after)
    assert {t["state"] for t in final.values()} == {"completed"}, report
    assert {tid: set(t["after"]) for tid, t in final.items()} == want_after

    # the history, move by move
    hist = _history(hub)
    approved = {x.task: x.i for x in hist if x.op == "task-approve"}
    assert set(approved) == set(want_after)
    holder, claims, reaps, done_by = {}, {}, {}, {}
    for i, op, tid, author, oid, _t in hist:
        if not op.startswith("task-") or op == "task-create":
            continue
        move = op[len("task-"):]
        if move in ("claim", "start"):
            early = [d for d in want_after[tid] if approved[d] > i]
            assert not early, f"{move} of task {tid} at {oid[:12]} before {early} completed"
        if move == "claim":
            assert holder.get(tid) is None, \
                f"task {tid} claimed by {author} at {oid[:12]} while {holder[tid]} held it"
            assert author in workers and (tid not in needs_db or "db" in workers[author][1])
            holder[tid] = author
            claims[tid] = claims.get(tid, 0) + 1
        elif move in ("start", "submit"):
            assert author == holder.get(tid), f"{move} of task {tid} by {author} at {oid[:12]}"
            done_by[tid] = author
        elif move == "reap":
            assert holder.get(tid) and author == "hub/reaper", (tid, oid)
            holder[tid] = None
            reaps[tid] = reaps.get(tid, 0) + 1
        elif move == "approve":
            assert author == LEAD and done_by.get(tid) == holder.get(tid)
        else:
            raise AssertionError(f"unexpected move {op} of task {tid} at {oid[:12]}")
    assert {tid: claims.get(tid, 0) for tid in want_after} == \
        {tid: 1 + reaps.get(tid, 0) for tid in want_after}
    assert {tid: final[tid]["retries"] for tid in want_after} == \
        {tid: reaps.get(tid, 0) for tid in want_after}

    # the killed worker's task: claimed and started by it, reaped, then done by another
    acts = [x for x in hist if x.task == victim_task and x.op != "task-create"]
    mine = [(x.op, x.author) for x in acts]
    assert mine[:3] == [("task-claim", victim), ("task-start", victim),
                        ("task-reap", "hub/reaper")], mine
    assert acts[2].time - acts[1].time >= LEASE     # not before the lease ran out
    other = mine[3][1]
    assert other != victim and mine[3:] == [("task-claim", other), ("task-start", other),
                                            ("task-submit", other), ("task-approve", LEAD)]
    assert victim_task in [x["id"] for x in reaped]
    assert final[victim_task]["assignee"] == other

    # the command took part in the race and won some
    per = {a: sum(1 for x in hist if x.op == "task-claim" and x.author == a) for a in workers}
    assert per["core/w4"] >= 1, report

    v = subprocess.run([*ENTRY, "--hub", hub.path, "verify", "lobby", "--json"],
                       capture_output=True, text=True, env=_env(), stdin=subprocess.DEVNULL)
    assert v.returncode == 0, v.stderr
    doc = json.loads(v.stdout)
    assert doc["verified"] is True and doc["commits"] == len(hist)

    lost = sum(int(x.split()[-1]) for a in workers for x in out[a]
               if x.startswith(("claimed ", "mine ")))
    print(f"\n100 tasks: built in {built:.1f}s, all done {took:.1f}s after start; claims "
          f"per worker {per}; lost races {lost}; reaps {sum(reaps.values())}; victim's task "
          f"{victim_task} done {ended - killed_at:.1f}s after the kill; conflicts "
          f"{conflicts}")


def test_five_commands_race_for_four_ready_tasks(tmp_path):
    hub = hubmod.init(str(tmp_path / "hub.git"), fsync=False)
    room = hub.room("lobby")
    room.register(LEAD, ["lead"])
    agents = [f"core/c{i}" for i in range(5)]
    for a in agents:
        room.register(a, ["coder"])
    # all want the same best one first: the losers must move on to the next
    tasks = [room.create_task(LEAD, f"t{i}", priority=10 - i)["id"] for i in range(4)]
    blocked = room.create_task(LEAD, "after all", after=tasks)["id"]
    env = _env()
    procs = [subprocess.Popen([*ENTRY, "ready", "--claim", "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                              env=dict(env, GITDROP_HUB=hub.path, GITDROP_ROOM="lobby",
                                       GITDROP_AGENT=a))
             for a in agents]
    try:
        got = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert [p.returncode for p in procs] == [0] * 5, got
    docs = [json.loads(o) for o, _e in got]
    won = [d["task"] for d in docs if d["task"]]
    assert sorted(won) == sorted(tasks), docs
    assert all(d["claimed"] for d in docs if d["task"])
    nothing = [d for d in docs if not d["task"]]
    assert len(nothing) == 1 and nothing[0]["claimed"] is False
    for a, d in zip(agents, docs):
        if d["task"]:
            assert room.task(d["task"])["assignee"] == a and d["assignee"] == a
    hist = _history(hub)
    claims = [(x.task, x.author) for x in hist if x.op == "task-claim"]
    assert sorted(claims) == sorted((d["task"], a) for a, d in zip(agents, docs) if d["task"])
    assert room.task(blocked)["state"] == "pending"
    assert hub.verify("lobby")
    print(f"\nlost races: {sum(d['lost'] for d in docs)}")
