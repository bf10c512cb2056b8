"""Work keeps moving, against members who would stop it or bend it: a task no claim
fits, a lease held for ever, a reviewer picked by the task's own doer, a lease set at
creation, a commit filed under another task. Each through the core and, where the
hole was a raw push, through a real `git push` into the hook."""

from gitdrop import fmt, model
from gitdrop.core import Room
from gitdrop.errors import Refusal

import pytest

from cli_helpers import Gitdrop
from test_rules_push import attempt, task_doc


def _room(hub, clock):
    return Room(hub.store, "lobby", clock=lambda: clock[0])


def test_a_task_leaves_room_in_its_file_for_a_claim(hub, team, clone):
    """A task made just under max_file could take no claim, yet was offered first by
    ready: fifty of them stopped every claimer. A task's file keeps 256 bytes free."""
    limit = team.view().settings["max_file"]
    with pytest.raises(Refusal) as e:
        team.create_task("core/juno", "padded", body="x" * (limit - 400), priority=9)
    assert e.value.rule == "size-limit" and "256" in e.value.reason
    got = team.create_task("core/juno", "big but claimable", body="x" * (limit - 700),
                           priority=9)
    assert team.claim_next("core/spartan")["task"] == got["task"]
    # and by a raw push, judged the same
    c = clone("core/juno")
    text = task_doc(60, "core/juno", title="padded by hand")
    c.write(model.task_path(60), text + "y" * (limit - 100 - len(text))).commit("padded")
    attempt(hub, c, "size-limit")
    # an edit may not grow a file into the room the moves need
    with pytest.raises(Refusal) as e:
        team.move_task("core/juno", got["task"], "edit", body="x" * (limit - 100))
    assert e.value.rule == "size-limit"


def test_a_task_stuck_on_a_cancelled_dependency_is_reaped(hub, team):
    """An assignee pointed the task it held at a task it had cancelled and went away:
    the reaper left it for ever ("waits on 2"). A dependency that failed or was
    cancelled will never complete: the task is stuck, not waiting."""
    clock = [team.clock()]
    room = _room(hub, clock)
    room.create_task("core/juno", "important work")                    # 1
    room.move_task("core/spartan", "1", "claim")
    room.create_task("core/spartan", "decoy")                          # 2
    room.move_task("core/spartan", "2", "cancel", note="never mind")
    with pytest.raises(Refusal) as e:   # not its assignee's to change any more ...
        room.move_task("core/spartan", "1", "edit", after=["2"])
    assert e.value.rule == "task-state-machine"
    room.move_task("core/juno", "1", "edit", after=["2"])   # ... a lead's mistake, say
    clock[0] += 10 * 86400
    assert room.lease("1")["expired"] and room.lease("1")["waiting_on"] == []
    assert [m["task"] for m in room.reap_leases()] == ["1"]
    assert room.task("1")["assignee"] == "" and room.task("1")["state"] == "pending"
    # one still open holds the lease: that task waits, it is not abandoned
    room.create_task("core/juno", "open dependency")                   # 3
    room.create_task("core/juno", "waiter", after=["3"], assignee="core/kai")   # 4
    clock[0] += 10 * 86400
    assert room.lease("4")["waiting_on"] == ["3"] and not room.lease("4")["expired"]
    with pytest.raises(Refusal) as e:
        room.move_task("hub/reaper", "4", "reap")
    assert e.value.rule == "task-lease"


def test_only_the_creator_or_a_lead_picks_the_reviewer(hub, team):
    """The assignee named a teammate reviewer after submitting, the teammate approved,
    and the lead never saw the work; nor may the doer rewrite the task under review."""
    t = team.create_task("core/juno", "reviewed work")["task"]
    team.move_task("core/spartan", t, "claim")
    team.move_task("core/spartan", t, "start")
    with pytest.raises(Refusal) as e:
        team.move_task("core/spartan", t, "edit", reviewer="core/kai")
    assert e.value.rule == "task-state-machine" and "reviewer" in e.value.reason
    team.move_task("core/spartan", t, "submit", note="done")
    with pytest.raises(Refusal) as e:
        team.move_task("core/spartan", t, "edit", title="what I did instead")
    assert e.value.rule == "task-state-machine" and "in review" in e.value.reason
    team.move_task("core/juno", t, "edit", reviewer="core/kai")   # the creator, a lead
    assert team.task(t)["reviewer"] == "core/kai"


def test_a_new_task_holds_no_lease(hub, team, clone):
    """A raw task-create set lease_until to the year 9999: past max_task_lease, and
    the reaper refused the task for ever."""
    c = clone("core/juno")
    c.write(model.task_path(61), task_doc(61, "core/juno", state="assigned",
                                          assignee="core/kai", lease_until=253402300799))
    c.commit("held until 9999")
    attempt(hub, c, "task-lease")
    c.pull()
    c.write(model.task_path(61), task_doc(61, "core/juno", state="assigned",
                                          assignee="core/kai")).commit("no lease")
    attempt(hub, c, None)


def test_a_task_operation_is_filed_under_its_own_task(hub, team, clone):
    """A commit that changes task 62 but says Gitdrop-Task: 1 was filed under task 1:
    its history, and the last act that renews task 1's lease (a silent assignee's
    task was never reaped)."""
    team.create_task("core/juno", "victim")          # task 1
    c = clone("core/kai")
    c.write(model.task_path(62), task_doc(62, "core/kai"))
    c.commit(fmt.format_message("task 62 created by kai", "",
                                [("op", "task-create"), ("task", "1")]))
    err = attempt(hub, c, "format")
    assert "Gitdrop-Task" in err
    c.pull()
    c.write(model.task_path(62), task_doc(62, "core/kai"))
    c.commit(fmt.format_message("task 62 created by kai", "",
                                [("op", "task-create"), ("task", "62")]))
    attempt(hub, c, None)


def test_task_ids_that_differ_in_case_alone_are_refused(hub, team, clone):
    """Job-A and job-a land in different buckets (a bucket is a hash of the exact id),
    so the file-name check never saw them side by side."""
    c = clone("core/juno")
    c.write(model.task_path("Job-A"), task_doc("Job-A", "core/juno")).commit("Job-A")
    attempt(hub, c, None)
    c.write(model.task_path("job-a"), task_doc("job-a", "core/juno")).commit("job-a")
    err = attempt(hub, c, "format")
    assert "only in case" in err


@pytest.mark.parametrize("path, op", [("handshakes/1.md", "handshake-ack"),
                                      ("contracts/api.md", "contract-declare")])
def test_deleting_a_handshake_or_a_contract_is_refused_by_a_rule(hub, team, clone, path, op):
    """The rules met a deletion with an AttributeError: the push was refused, but
    with no rule and no fix."""
    team.start_handshake("core/juno", "the plan")
    team.declare_contract("core/juno", "api", "GET /x")
    c = clone("core/juno")
    c.delete(path).commit(fmt.format_message(f"remove {path}", "", [("op", op)]))
    err = attempt(hub, c, "one-operation")
    assert "AttributeError" not in err


def test_a_new_task_at_the_end_of_a_long_chain_is_checked_without_walking_it():
    """A new task can close no cycle (nothing waits on it yet): checking one at the
    end of a chain of 2,000 walked and parsed the whole chain, a second a task, and
    a push of a chain took hours of the hub's time."""
    from gitdrop import deps
    chain = {str(i): {"after": [str(i - 1)] if i else [], "state": "pending"}
             for i in range(deps.MAX_REACH - 10)}
    last = str(deps.MAX_REACH - 11)
    asked = []

    def lookup(tid):
        asked.append(tid)
        return chain.get(tid)
    assert deps.problem(lookup, "5000", [last], [], new=True) == ""
    assert asked == [last]   # its dependency exists: nothing more to read
    # an edit may close one, and is walked once, each task read once
    asked.clear()
    chain["0"]["after"] = []
    why = deps.problem(lookup, "0", [last], [])
    assert why.startswith(f"the dependencies would make a cycle: 0 → {last} → ")
    assert len(asked) <= len(chain) + 1 and len(set(asked)) == len(asked) - 1
    # past MAX_REACH tasks up, an edit is refused, not walked to the end
    for i in range(len(chain), 2 * deps.MAX_REACH):
        chain[str(i)] = {"after": [str(i - 1)], "state": "pending"}
    asked.clear()
    why = deps.problem(lookup, "0", [str(2 * deps.MAX_REACH - 1)], [])
    assert f"more than {deps.MAX_REACH} tasks" in why and len(asked) <= deps.MAX_REACH + 2


def test_a_killed_workers_program_is_ended_before_its_task_runs_again(hub, team, tmp_path):
    """`gitdrop work` runs its program in a session of its own (so that a stop ends
    what it started): a worker killed with -9 left it running, and the restarted
    worker gave the task back and ran it again beside it."""
    import os
    import signal
    import subprocess
    import time
    from cli_helpers import ENTRY
    team.create_task("core/juno", "long job", review=False)
    prog = (f"if [ -e {tmp_path}/first ]; then echo second run; else touch {tmp_path}/first; "
            f"echo $$ > {tmp_path}/pid; exec sleep 60; fi")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITDROP")}
    env.update(HOME=str(tmp_path), GITDROP_HUB=hub.path, GITDROP_ROOM="lobby",
               GITDROP_AGENT="core/spartan")
    w = subprocess.Popen([*ENTRY, "work", "--once", "--", "sh", "-c", prog], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text().strip():
        assert time.monotonic() < deadline and w.poll() is None
        time.sleep(0.05)
    orphan = int((tmp_path / "pid").read_text())
    try:
        os.kill(w.pid, signal.SIGKILL)
        w.wait()
        assert os.path.exists(f"/proc/{orphan}")   # out of the kill's reach
        again = subprocess.run([*ENTRY, "work", "--once", "--backoff", "0", "--", "sh", "-c",
                                prog], env=env, capture_output=True, text=True, timeout=120)
        assert "ended the program a killed worker left running" in again.stderr, again.stderr
        assert not os.path.exists(f"/proc/{orphan}") or \
            open(f"/proc/{orphan}/stat").read().split(")")[1].split()[0] == "Z"
        assert team.task("1")["state"] == "completed", again.stderr
        assert "second run" in \
            str(team.task("1")), team.task("1")
    finally:
        try:
            os.killpg(orphan, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_graph_of_a_chain_deeper_than_the_recursion_limit_is_drawn():
    """graph_text recursed once per level: a chain of about 1,000 tasks ended
    `gitdrop task graph` in a RecursionError."""
    from gitdrop import deps
    n = 3000
    headers = [{"id": str(i), "title": f"t{i}", "state": "pending", "assignee": "",
                "after": [str(i - 1)] if i else []} for i in range(n)]
    byid = {t["id"]: t for t in headers}
    g = deps.graph(byid.get, headers, root="1500")
    assert len(g["nodes"]) == n   # all of it is connected to the middle
    text = deps.graph_text(g).splitlines()
    assert len(text) == n and text[0].startswith("#0 ") and text[-1].startswith(
        "  " * deps.INDENT_MOST + f"… #{n - 1} ")   # not 6 KB of indent a line


def test_a_pushed_idempotency_key_is_judged_like_a_written_one(hub, team, clone):
    """The rules never read Gitdrop-Id: a raw push could reuse an agent's key for
    another operation, and the agent's own retry was then refused."""
    team.create_task("core/spartan", "deploy", key="deploy-42")
    c = clone("core/spartan")
    c.commit(fmt.format_message("spartan → juno: hi", "hi", [("op", "send"), ("to", "core/juno"),
                                                           ("id", "deploy-42")]),
             allow_empty=True)
    err = attempt(hub, c, "idempotency-key")
    assert "another operation" in err
    # the agent's own retry still answers from the first commit
    again = team.create_task("core/spartan", "deploy", key="deploy-42")
    assert again["replayed"] and again["task"] == "1"
    assert [t["id"] for t in team.list_tasks()] == ["1"]


@pytest.mark.parametrize("mine, theirs", [("src/API/**", "src/api/**"),
                                          ("README.md", "readme.md"),
                                          ("docs/caf\u00e9.md", "docs/cafe\u0301.md")])
def test_path_leases_that_name_one_file_on_macos_or_windows_conflict(hub, team, mine, theirs):
    """Exclusive leases on src/API and src/api (or a name in its two Unicode forms)
    went to two agents, and the guard let each edit the other's: on a checkout that
    folds case or normalizes names, the two are one file."""
    from gitdrop import guard
    team.take_lease("core/spartan", mine)
    with pytest.raises(Refusal) as e:
        team.take_lease("core/kai", theirs)
    assert e.value.rule == "lease-conflict"
    path = theirs.replace("**", "x.py")
    assert guard.matches(mine, path)


def test_the_reaper_walks_no_history_for_a_lease_still_ahead(hub, team, monkeypatch):
    """Each reap round (of every idle worker) walked the room's history once per held
    task, even for a lease hours from its end: seconds a round in a busy room."""
    from gitdrop import rules
    for i in range(20):
        tid = team.create_task("core/juno", f"job {i}")["task"]
        team.move_task("core/spartan", tid, "claim")
        team.move_task("core/spartan", tid, "start")   # a start sets lease_until ahead
    assert all(t["lease_until"] > team.clock() for t in team.list_tasks(state="in_progress"))
    walks = []
    real = rules.lease_expiry
    monkeypatch.setattr(rules, "lease_expiry", lambda *a, **k: walks.append(1) or real(*a, **k))
    assert team.reap_leases() == [] and walks == []


def test_the_doer_sets_no_retries_and_an_initiator_is_not_its_own_target(hub, team, clone):
    """The assignee raised max_retries to a million, so its failures and reaps never
    failed the task; a raw handshake listed its initiator as its only target, who
    acked it alone to GO."""
    t = team.create_task("core/juno", "work")["task"]
    team.move_task("core/spartan", t, "claim")
    with pytest.raises(Refusal) as e:
        team.move_task("core/spartan", t, "edit", max_retries=1000000)
    assert e.value.rule == "task-state-machine" and "retried" in e.value.reason
    team.move_task("core/juno", t, "edit", max_retries=5)
    c = clone("core/juno")
    from gitdrop.view import render_file
    doc = render_file("handshake", model.with_defaults("handshake", {
        "id": 7, "initiator": "core/juno", "targets": ["core/juno"],
        "created": team.clock()}), "the plan")
    c.write(model.handshake_path(7), doc).commit(fmt.format_message(
        "handshake 7", "", [("op", "handshake-start"), ("handshake", "7")]))
    attempt(hub, c, "handshake-ack-once")


def test_an_approval_without_words_keeps_the_result_a_pipeline_reads(hub, team):
    """A worker hands its result in as the submit note; the approval overwrote it with
    its own (empty) note, and the worker of the task waiting on it got no input."""
    from gitdrop.worker import Worker
    first = team.create_task("core/juno", "find", reviewer="core/juno")["task"]
    team.create_task("core/juno", "use it", after=[first], review=False)
    team.move_task("core/spartan", first, "claim")
    team.move_task("core/spartan", first, "start")
    team.move_task("core/spartan", first, "submit", note="RESULT=42")
    team.move_task("core/juno", first, "approve")
    assert team.task(first)["note"] == "RESULT=42"
    seen = []
    Worker(hub, "lobby", "core/kai", lambda task, ctx: seen.append(task["inputs"]) or "ok").run_once()
    assert seen == [{first: "RESULT=42"}]


def _filler(hub, n: int, when: int, room: str = "lobby") -> None:
    """`n` messages core/kai → core/kai on the room's tip, dated `when`, in one
    `git fast-import` (a busy room, or a member pushing filler, without n hook runs)."""
    import subprocess
    ref = model.ROOM_PREFIX + room
    who = f"core/kai <kai@core.gitdrop> {when} +0000\n"
    parts = []
    for i in range(n):
        msg = fmt.format_message(f"kai → kai: filler {i}", f"filler {i}",
                                 [("op", "send"), ("to", "core/kai")])
        parts.append(f"commit {ref}\nauthor {who}committer {who}"
                     f"data {len(msg.encode())}\n{msg}\n")
        if i == 0:
            parts.append(f"from {hub.store.tip(ref)}\n")
    subprocess.run(["git", "--git-dir", hub.path, "fast-import", "--quiet"],
                   input="".join(parts).encode(), check=True)


def test_an_idempotency_key_outlives_a_flood_of_commits(hub, team, clone):
    """A key was looked for in the room's last 2,000 commits only: 2,001 commits by
    anyone between a call and its retry (a few seconds of a busy room, or a member
    pushing filler) and the retry was applied twice. A key is remembered for a day."""
    import time
    from gitdrop import rules
    first = team.create_task("core/spartan", "deploy", key="deploy-7")
    _filler(hub, rules.KEY_MIN_COMMITS + 500, int(time.time()))
    again = team.create_task("core/spartan", "deploy", key="deploy-7")
    assert again["replayed"] and again["task"] == first["task"]
    assert [t["id"] for t in team.list_tasks()] == [first["task"]]
    # the hook looks as far: the key reused by a raw push for another operation
    c = clone("core/spartan")
    c.commit(fmt.format_message("spartan → juno: hi", "hi", [("op", "send"), ("to", "core/juno"),
                                                           ("id", "deploy-7")]),
             allow_empty=True)
    assert "another operation" in attempt(hub, c, "idempotency-key")


def test_a_fresh_process_finds_a_key_of_a_busy_day_without_walking_it_again(hub, team,
                                                                          tmp_path):
    """A keyed write in a fresh process (a CLI call with --key, the hook) walked the
    day's history for its key: 0.6-0.8 s in a room of 50,000 commits a day, for each
    call. A room's window is kept in the hub: the next process reads only the commits
    since, and finds what the walk finds. A window damaged, cut short or planted as
    a FIFO is walked again, to the same answer."""
    import os
    import time
    from gitdrop import hub as hubmod, keywindow, rules
    first = team.create_task("core/spartan", "deploy", key="deploy-9")
    _filler(hub, rules.KEY_MIN_COMMITS + 3000, int(time.time()))
    assert team.create_task("core/spartan", "deploy", key="deploy-9")["replayed"]
    keys = os.path.join(hub.path, "gitdrop", "keys")
    [kept] = os.listdir(keys)
    kept = os.path.join(keys, kept)
    _filler(hub, 40, int(time.time()))

    def fresh():
        """The room as a new process sees it (a reader of its own), and its reads."""
        room = hubmod.Hub(hub.path).room("lobby")
        reader, reads = room.store.reader, [0]
        read = reader.commit

        def counted(oid):
            reads[0] += 1
            return read(oid)
        reader.commit = counted
        return room, reads

    room, reads = fresh()
    again = room.create_task("core/spartan", "deploy", key="deploy-9")
    assert again["replayed"] and again["task"] == first["task"]
    assert reads[0] < 300, reads   # the 40 since, not the 5,000 of the day
    with pytest.raises(Refusal) as e:   # another operation under the key: as refused
        room.send("core/spartan", "core/juno", "hi", key="deploy-9")
    assert e.value.rule == "idempotency-key"
    # a new key after the window was kept, found by the next process from it
    made = room.create_task("core/kai", "later", key="later-1")
    room, reads = fresh()
    assert room.create_task("core/kai", "later", key="later-1")["task"] == made["task"]
    assert reads[0] < 300, reads
    # the CLI (a process of its own) replays from the kept window too
    out = Gitdrop(hub.path, str(tmp_path / "home"), "core/spartan").js(
        "task", "create", "deploy", "--key", "deploy-9")
    assert out["replayed"] and out["task"] == first["task"]
    # a window cut short, damaged or a FIFO: walked again, the same answer
    whole = open(kept, "rb").read()
    for bad in (whole[:len(whole) // 2], whole.replace(b"deploy-9", b"deploy-0"), None):
        os.unlink(kept)
        if bad is None:
            os.mkfifo(kept)
        else:
            with open(kept, "wb") as f:
                f.write(bad)
        room, reads = fresh()
        got = room.create_task("core/spartan", "deploy", key="deploy-9")
        assert got["replayed"] and got["task"] == first["task"]
        assert reads[0] > rules.KEY_MIN_COMMITS, reads
    assert keywindow.Window.load(whole, 1, 2, 3) is None   # other bounds: not this one


def test_an_idempotency_key_is_forgotten_after_a_day_and_2000_commits(hub, team):
    """The window has an end (else every keyed write of a long-lived room would read
    its whole history): a key used more than a day and 2,000 commits ago is new."""
    import time
    from gitdrop import rules
    now = int(time.time())
    old = _room(hub, [now - rules.KEY_SECONDS - 3600])
    first = old.create_task("core/spartan", "deploy", key="deploy-8")
    _filler(hub, rules.KEY_MIN_COMMITS, now - rules.KEY_SECONDS - 60)
    _filler(hub, 5, now)
    again = team.create_task("core/spartan", "deploy", key="deploy-8")
    assert not again.get("replayed") and again["task"] != first["task"]


def test_a_task_bound_to_a_handshake_that_cannot_go_is_bound_to_another(hub, team, clone,
                                                                       tmp_path):
    """A handshake waits for every target's ack: one target deregistered, it never
    reached GO, and the tasks bound to it could never start (`handshake` was not a
    field any move changed). Its creator or a lead binds the task to another
    handshake, or to none, before work starts; its doer may not skip the agreement."""
    stuck = team.start_handshake("core/juno", "ship v2", ["core/spartan", "core/kai"])["id"]
    t = team.create_task("core/juno", "ship", assignee="core/spartan", handshake=stuck)["task"]
    team.ack_handshake("core/spartan", stuck)
    team.deregister("core/kai", "core/kai")
    with pytest.raises(Refusal) as e:
        team.move_task("core/spartan", t, "start")
    assert e.value.rule == "handshake-go"
    # the doer may not unbind it
    with pytest.raises(Refusal) as e:
        team.move_task("core/spartan", t, "edit", handshake=0)
    assert e.value.rule == "handshake-go" and "creator" in e.value.reason
    # nor by a raw push
    c = clone("core/spartan")
    doc = team.view().task(t)
    c.write(model.task_path(t), fmt.dumps_doc(dict(doc[0], handshake=0), doc[1]))
    c.commit(fmt.format_message(f"task {t} edited", "", [("op", "task-edit"), ("task", t)]))
    assert "creator" in attempt(hub, c, "handshake-go")
    # nor to a handshake there is not
    with pytest.raises(Refusal) as e:
        team.move_task("core/juno", t, "edit", handshake=99)
    assert e.value.rule == "handshake-go" and "does not exist" in e.value.reason
    # the lead binds it to a new one (here from the command line), which reaches GO,
    # and the work starts
    fresh = team.start_handshake("core/juno", "ship v2, without kai", ["core/spartan"])["id"]
    gd = Gitdrop(hub.path, str(tmp_path / "home"), "core/juno")
    assert gd.js("task", "edit", t, "--handshake", fresh)["state"] == "assigned"
    assert team.view().task(t)[0]["handshake"] == int(fresh)
    team.ack_handshake("core/spartan", fresh)
    assert team.move_task("core/spartan", t, "start")["state"] == "in_progress"
    # once work has started, the binding stays
    with pytest.raises(Refusal) as e:
        team.move_task("core/juno", t, "edit", handshake=0)
    assert e.value.rule == "handshake-go" and "before work starts" in e.value.reason
    # a coder's own task, bound by a lead: its creator is its doer, and may not unbind it
    team.register("core/zed", ["coder"])
    own = team.create_task("core/zed", "mine", assignee="core/zed")["task"]
    team.move_task("core/juno", own, "edit", handshake=fresh)
    with pytest.raises(Refusal) as e:
        team.move_task("core/zed", own, "edit", handshake=0)
    assert e.value.rule == "handshake-go" and "lead" in e.value.reason
