"""Workers end to end, with real processes: a lead creates 20 tasks with dependencies,
tags and capabilities; three `gitdrop work` processes with different capabilities and
tags run one shell handler. One task fails twice and then succeeds, one always fails
(failed for good past its retries), one asks a person (the test answers as the lead,
with `gitdrop feedback answer`), some go through review (the test approves them). One
worker is killed with -9 right after it starts a task: that task is reaped by another
worker once its lease runs out, and done again. Everything is judged afterwards from
`git log` of the room's branch, then re-checked by `gitdrop verify`."""

import json
import os
import signal
import subprocess
import time

from gitdrop import hub as hubmod

from cli_helpers import ENTRY, OWN_ENV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEAD = "core/juno"
LEASE = 4                       # seconds: the killed worker's task comes back after this
ANSWER = "use the blue one"

# One handler for every task, by its title. stdout is the result, the exit code decides.
HANDLER = r"""#!/bin/sh
set -u
cat > "{dir}/stdin-$GITDROP_TASK_ID.json"           # the task, as JSON
case "$GITDROP_TASK_TITLE" in
  flaky*)
    f="{dir}/count-$GITDROP_TASK_ID"
    n=$(( $(cat "$f" 2>/dev/null || echo 0) + 1 ))
    echo "$n" > "$f"
    if [ "$n" -le 2 ]; then echo "flaky failure $n of $GITDROP_TASK_ID" >&2; exit 3; fi
    echo "worked on attempt $n" ;;
  doomed*)
    echo "noise" ; echo "doomed: the disk is full" >&2 ; exit 7 ;;
  ask*)
    a=$({entry} task ask "$GITDROP_TASK_ID" -q "which colour?" --wait --timeout 60) || exit 9
    echo "answered: $a" ;;
  slow*)
    if [ "$GITDROP_TASK_RETRIES" = 0 ]; then sleep 30; fi   # the first attempt dies here
    echo "slow one redone by $GITDROP_AGENT" ;;
  *)
    echo "$GITDROP_TASK_TITLE done by $GITDROP_AGENT [$GITDROP_TASK_TAGS]" ;;
esac
"""

# name: (after, requires, tags, review, extra). Tags route: backend → core/a,
# frontend → core/b, misc → both; requires db → core/a only, ui → core/b only.
TASKS = {
    "slow": ([], [], ["misc"], False, {"priority": 9}),
    "schema": ([], ["db"], ["backend"], False, {}),
    "api": (["schema"], ["db"], ["backend"], False, {}),
    "shell": ([], ["ui"], ["frontend"], False, {}),
    "pages": (["shell"], ["ui"], ["frontend"], False, {}),
    "flaky import": (["schema"], [], ["misc"], False, {"max_retries": 3}),
    "ask colour": ([], [], ["frontend"], False, {}),
    "doomed": ([], [], ["misc"], False, {"max_retries": 1}),
    "docs": ([], [], ["misc"], True, {}),
    "api docs": (["api"], [], ["misc"], True, {}),
    "publish docs": (["api docs"], [], ["misc"], False, {}),
    "after flaky": (["flaky import"], [], ["backend"], False, {}),
    "styles": (["ask colour"], ["ui"], ["frontend"], False, {}),
    "after slow": (["slow"], [], ["misc"], False, {}),
    "wire": (["pages", "api"], [], ["misc"], False, {}),
    "indexes": ([], ["db"], ["misc"], False, {}),
    "icons": ([], ["ui"], ["misc"], False, {}),
    "changelog": ([], [], ["misc"], True, {}),
    "notes": (["changelog"], [], ["misc"], False, {}),
    "release": (["publish docs", "after flaky", "styles", "after slow", "wire"], [], ["misc"],
                False, {}),
}
# agent: (caps, tags); the victim starts first, takes the slow task and is killed
WORKERS = {"core/c": ([], []),
           "core/a": (["db"], ["backend", "misc"]),
           "core/b": (["ui"], ["frontend", "misc"])}
VICTIM = "core/c"


def _git_log(hub_path):
    """The room's commits, oldest first: (op, task, author, time, subject, body)."""
    fmt_ = "%x1e%an%x1f%at%x1f%(trailers:key=Gitdrop-Op,valueonly,separator=)%x1f" \
           "%(trailers:key=Gitdrop-Task,valueonly,separator=)%x1f%s%x1f%b"
    p = subprocess.run(["git", "--git-dir", hub_path, "log", "--first-parent", "--reverse",
                        f"--format={fmt_}", "rooms/lobby"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    out = []
    for rec in p.stdout.split("\x1e")[1:]:
        author, at, op, task, subject, body = rec.split("\x1f")
        out.append((op.strip(), task.strip(), author, int(at), subject, body.strip()))
    return out


def _events(path):
    got = []
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    got.append(json.loads(line))
    except FileNotFoundError:
        pass
    return got


def test_three_gitdrop_work_processes_and_a_killed_one(tmp_path):
    t0 = time.monotonic()
    hub = hubmod.init(str(tmp_path / "hub.git"), fsync=False)
    room = hub.room("lobby")
    room.register(LEAD, ["lead"])
    hub.room_settings("lobby", by="hub/admin", changes={"task_lease": LEASE})
    ids = {}
    for name, (after, requires, tags, review, extra) in TASKS.items():
        ids[name] = room.create_task(LEAD, name, after=[ids[a] for a in after],
                                     requires=requires, tags=tags, review=review,
                                     **extra)["id"]
    name_of = {tid: n for n, tid in ids.items()}
    deps = {ids[n]: {ids[a] for a in spec[0]} for n, spec in TASKS.items()}
    handler = tmp_path / "handler.sh"
    handler.write_text(HANDLER.format(dir=tmp_path, entry=" ".join(ENTRY)))
    env = {k: v for k, v in os.environ.items() if k not in OWN_ENV}
    env.update(GITDROP_HUB=hub.path, GITDROP_ROOM="lobby", NO_COLOR="1")

    procs, logs = {}, {}

    def spawn(agent):
        caps, tags = WORKERS[agent]
        logs[agent] = str(tmp_path / f"{agent.replace('/', '-')}.jsonl")
        args = [*ENTRY, "work", "--as", agent, "--json", "--idle", "6", "--backoff", "1"]
        args += [x for c in caps for x in ("--cap", c)] + [x for t in tags for x in ("--tag", t)]
        with open(logs[agent], "w") as out, open(logs[agent] + ".err", "w") as err:
            procs[agent] = subprocess.Popen([*args, "--", "sh", str(handler)], stdout=out,
                                            stderr=err, stdin=subprocess.DEVNULL, cwd=ROOT,
                                            env=env, start_new_session=True)

    victim_task, answered, approved, killed_at = "", [], [], 0.0
    try:
        spawn(VICTIM)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            evs = _events(logs[VICTIM])
            if any(e["event"] == "claimed" for e in evs) and len(procs) == 1:
                spawn("core/a")            # the others join while the victim starts
                spawn("core/b")
            started = [e for e in evs if e["event"] == "started"]
            if started:
                victim_task = started[0]["task"]
                os.kill(procs[VICTIM].pid, signal.SIGKILL)
                killed_at = time.monotonic()
                assert procs[VICTIM].wait(10) == -signal.SIGKILL
                try:    # its orphaned handler, if it got that far
                    os.killpg(procs[VICTIM].pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                break
            time.sleep(0.02)
        assert victim_task, "the victim never started a task"
        if len(procs) == 1:
            spawn("core/a")
            spawn("core/b")
        while time.monotonic() < deadline:
            # the lead answers questions and approves what is in review
            for q in room.questions():
                if q["task"] not in answered:
                    p = subprocess.run([*ENTRY, "feedback", "list", "--json"], env=dict(
                        env, GITDROP_AGENT=LEAD), capture_output=True, text=True,
                        stdin=subprocess.DEVNULL)
                    assert p.returncode == 0, p.stderr
                    listed = json.loads(p.stdout)["questions"]
                    assert [(x["task"], x["question"], x["for"]) for x in listed] == \
                        [(q["task"], "which colour?", LEAD)]
                    p = subprocess.run([*ENTRY, "feedback", "answer", q["task"], ANSWER],
                                       env=dict(env, GITDROP_AGENT=LEAD), capture_output=True,
                                       text=True, stdin=subprocess.DEVNULL)
                    assert p.returncode == 0, p.stderr
                    answered.append(q["task"])
            for t in room.list_tasks(state="review"):
                room.move_task(LEAD, t["id"], "approve", note="looks right")
                approved.append(t["id"])
            if all(p.poll() is not None for p in procs.values()):
                break
            time.sleep(0.1)
        rcs = {a: p.poll() for a, p in procs.items()}
        ended = time.monotonic()
    finally:
        for a, p in procs.items():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)
    evs = {a: _events(path) for a, path in logs.items()}

    def report():
        return "\n".join(f"{a}: rc {rcs.get(a)}: " + " | ".join(
            f"{e['event']} {e['task']}" for e in evs[a]) + "\n" +
            open(logs[a] + ".err").read()[-1500:] for a in procs)
    assert rcs == {VICTIM: -signal.SIGKILL, "core/a": 0, "core/b": 0}, report()
    assert name_of[victim_task] == "slow"
    for a in ("core/a", "core/b"):
        assert evs[a][-2:][0]["event"] == "idle" and evs[a][-1]["event"] == "stopped", report()
    assert [e["event"] for e in evs[VICTIM] if e["event"] != "registered"] == [
        "claimed", "started"], report()

    # every task ended as designed
    final = {t["id"]: t for t in room.list_tasks(include_done=True)}
    assert set(final) == set(name_of)
    want = {tid: "failed" if name_of[tid] == "doomed" else "completed" for tid in name_of}
    assert {tid: t["state"] for tid, t in final.items()} == want, report()

    # the story, from git log of the room's branch
    log = _git_log(hub.path)
    moves = {}     # each task's moves but renewals (a worker renews while it works)
    for op, tid, author, at, subject, body in log:
        if op.startswith("task-") and op not in ("task-create", "task-renew"):
            moves.setdefault(tid, []).append((op[5:], author))
    caps = {a: c for a, (c, _t) in WORKERS.items()}
    tags = {a: t for a, (_c, t) in WORKERS.items()}
    done_at, holder = {}, {}
    for i, (op, tid, author, at, subject, body) in enumerate(log):
        move = op[5:] if op.startswith("task-") else ""
        if move in ("claim", "start"):
            early = [name_of[d] for d in deps[tid] if d not in done_at]
            assert not early, f"{move} of {name_of[tid]} by {author} before {early} completed"
        if move == "claim":
            assert holder.get(tid) is None, f"{name_of[tid]} claimed twice at once"
            holder[tid] = author
            spec = TASKS[name_of[tid]]
            assert set(spec[1]) <= set(caps[author]), f"{name_of[tid]} claimed by {author}"
            assert not tags[author] or set(spec[2]) & set(tags[author]), \
                f"{name_of[tid]} (tags {spec[2]}) claimed by {author}"
        elif move in ("start", "renew", "submit", "complete", "ask", "fail"):
            assert author == holder.get(tid), f"{move} of {name_of[tid]} by {author}"
        if move in ("release", "reap", "fail"):
            holder[tid] = None
        if move in ("complete", "approve"):
            assert tid not in done_at, f"{name_of[tid]} completed twice"
            done_at[tid] = i
    assert set(done_at) == {tid for tid in name_of if want[tid] == "completed"}

    # the killed worker's task: claim, start, reaped by a worker, then claimed and done
    # by a live one (the reaper, or the other worker if it was woken first)
    story = moves[victim_task]
    reaper, other = story[2][1], story[3][1]
    assert reaper in ("core/a", "core/b") and other in ("core/a", "core/b")
    assert story == [("claim", VICTIM), ("start", VICTIM), ("reap", reaper),
                     ("claim", other), ("start", other), ("complete", other)], story
    reap = [x for x in log if x[1] == victim_task and x[0] == "task-reap"][0]
    start = [x for x in log if x[1] == victim_task and x[0] == "task-start"][0]
    assert reap[3] - start[3] >= LEASE - 1 and f"lease of {VICTIM} expired" in reap[5]
    assert final[victim_task]["retries"] == 1
    assert final[victim_task]["note"] == f"slow one redone by {other}"

    # the flaky one: twice given back with its stderr and a retry counted, then done
    flaky = ids["flaky import"]
    fl = moves[flaky]
    w = fl[0][1]
    assert [m for m, _a in fl] == ["claim", "start", "release"] * 2 + \
        ["claim", "start", "complete"], fl
    notes = [x[5] for x in log if x[1] == flaky and x[0] == "task-release"]
    assert "exited 3" in notes[0] and f"flaky failure 1 of {flaky}" in notes[0], notes
    assert f"flaky failure 2 of {flaky}" in notes[1], notes
    assert final[flaky]["retries"] == 2 and final[flaky]["note"] == "worked on attempt 3"
    assert w in ("core/a", "core/b")
    # the doomed one: given back once, then failed for good with its stderr's tail
    doomed = ids["doomed"]
    assert [m for m, _a in moves[doomed]] == ["claim", "start", "release",
                                              "claim", "start", "fail"], moves[doomed]
    assert "exited 7" in final[doomed]["note"] and "the disk is full" in final[doomed]["note"]
    assert "noise" not in final[doomed]["note"] and final[doomed]["retries"] == 1
    # the question: asked by the worker's handler, answered by the lead
    ask = ids["ask colour"]
    asker = moves[ask][0][1]
    assert moves[ask] == [("claim", asker), ("start", asker), ("ask", asker),
                          ("answer", LEAD), ("complete", asker)], moves[ask]
    assert answered == [ask] and final[ask]["note"] == f"answered: {ANSWER}"
    # reviewed ones: submitted by a worker, approved by the lead
    reviewed = {ids[n] for n, spec in TASKS.items() if spec[3]}
    assert sorted(approved) == sorted(reviewed)
    for tid in reviewed:
        assert [m for m, _a in moves[tid]] == ["claim", "start", "submit", "approve"]
        assert moves[tid][-1][1] == LEAD
    for tid in set(name_of) - reviewed - {victim_task, flaky, doomed, ask}:
        assert [m for m, _a in moves[tid]] == ["claim", "start", "complete"], \
            (name_of[tid], moves[tid])
    # the handler got the task as JSON on stdin
    got = json.loads((tmp_path / f"stdin-{ids['wire']}.json").read_text())
    assert got["title"] == "wire" and sorted(got["after"]) == sorted(deps[ids["wire"]])
    # both live workers worked
    for a in ("core/a", "core/b"):
        assert any(e["event"] == "done" for e in evs[a]), report()

    v = subprocess.run([*ENTRY, "--hub", hub.path, "verify", "lobby", "--json"],
                       capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    assert v.returncode == 0, v.stderr
    doc = json.loads(v.stdout)
    assert doc["verified"] is True and doc["commits"] == len(log)
    print(f"\n20 tasks by 3 workers: {ended - t0:.1f} s; victim's task {victim_task} "
          f"killed, reaped and redone by {other}; the end {ended - killed_at:.1f} s after "
          f"the kill; "
          f"done per worker {({a: sum(e['event'] == 'done' for e in evs[a]) for a in procs})}")
