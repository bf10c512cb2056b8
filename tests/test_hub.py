"""The hub through the core: teams with clashing agent names, team-scoped names,
lead CC, dual-sign and review by each team's lead, membership, the loop guard,
and the life of a room (archive, pin, restore, reap, destroy) on an injected clock."""

import threading
import time

import pygit2
import pytest

from gitdrop import fmt, hub as hubmod, model
from gitdrop.errors import Ambiguous, NotFound, Refusal, UsageError

T0 = 1_700_000_000
DAY = 86400


class Clock:
    """A hub clock the test moves by hand."""

    def __init__(self, t=T0):
        self.t = t

    def __call__(self):
        return self.t

    def advance(self, seconds):
        self.t += seconds


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def h(tmp_path, clock):
    return hubmod.init(str(tmp_path / "hub.git"), fsync=False, clock=clock)


@pytest.fixture
def proj(h):
    """Room proj shared by teams core (lead juno) and web (lead ana), each with a spartan."""
    h.register_team("core", "juno", ["spartan", "kai"])
    h.register_team("web", "ana", ["spartan"])
    h.create_room("hub/admin", "proj", teams=["core", "web"])
    r = h.room("proj")
    for a in ("core/juno", "core/spartan", "core/kai", "web/ana", "web/spartan"):
        r.register(a)
    return r


def hub_log(h):
    """(author, time, op, subject) of the hub branch, newest first."""
    out = []
    for c in h.store.repo.walk(h.store.repo.references[model.HUB_REF].target):
        op = fmt.trailer(fmt.parse_message(c.message)[2], "op")
        out.append((c.author.name, c.commit_time, op, c.message.split("\n")[0]))
    return out


# --- names ------------------------------------------------------------------------

def test_clashing_short_names_are_ambiguous_full_names_resolve(h, proj):
    with pytest.raises(Ambiguous) as e:
        proj.resolve("spartan")
    assert "AMBIGUOUS" in e.value.reason
    assert "core/spartan" in e.value.reason and "web/spartan" in e.value.reason
    assert e.value.fix.startswith("Use full name (team/agent): ") and "/" in e.value.fix
    assert proj.resolve("core/spartan") == "core/spartan"
    assert proj.resolve("web/spartan") == "web/spartan"
    assert proj.resolve("ana") == "web/ana"                 # unique short names resolve
    with pytest.raises(NotFound):
        proj.resolve("nobody")

    tip = h.store.room_tip("proj")
    with pytest.raises(Ambiguous):
        proj.send("kai", "spartan", "which one of you?")
    with pytest.raises(Ambiguous):
        proj.send("spartan", "kai", "who am I?")
    assert h.store.room_tip("proj") == tip                  # nothing was written

    proj.send("kai", "web/spartan", "the web one")
    assert [m["text"] for m in proj.inbox("web/spartan")["messages"]] == ["the web one"]
    assert proj.inbox("core/spartan")["messages"] == []


# --- leads --------------------------------------------------------------------------

def test_every_lead_is_cced_on_every_message(proj):
    proj.send("core/spartan", "web/spartan", "api is ready")
    proj.inbox("web/spartan")
    proj.send("web/spartan", "core/kai", "thanks, using it")
    for lead in ("core/juno", "web/ana"):
        got = proj.inbox(lead)["messages"]
        assert [(m["from"], m["text"], m["via"]) for m in got] == [
            ("core/spartan", "api is ready", "lead"),
            ("web/spartan", "thanks, using it", "lead")], lead
    # a member that is neither addressed nor a lead sees neither
    assert proj.inbox("core/spartan")["messages"] == []
    # a lead addressed directly sees it as "to", once
    proj.inbox("core/kai")
    proj.send("core/kai", "web/ana", "question for you")
    got = proj.inbox("web/ana")["messages"]
    assert [(m["text"], m["via"]) for m in got] == [("question for you", "to")]


def test_lead_cc_counts_as_unread_before_the_lead_sends(proj):
    proj.send("core/spartan", "web/spartan", "hello web")
    with pytest.raises(Refusal) as e:
        proj.send("core/juno", "core/kai", "status?")
    assert e.value.rule == "unread-before-send" and "1 unread" in e.value.reason
    proj.inbox("core/juno")
    assert proj.send("core/juno", "core/kai", "status?")["to"] == ["core/kai"]


def test_cross_team_task_needs_both_leads_before_it_starts(proj):
    t = proj.create_task("core/juno", "build the form", assignee="web/spartan")
    with pytest.raises(Refusal) as e:
        proj.move_task("web/spartan", t["id"], "start")
    assert e.value.rule == "dual-sign"
    assert "core/juno" in e.value.reason and "web/ana" in e.value.reason
    assert "sign" in e.value.fix

    with pytest.raises(Refusal) as e:                       # only those two leads sign
        proj.move_task("core/kai", t["id"], "sign")
    assert e.value.rule in ("dual-sign", "task-state-machine")
    proj.move_task("core/juno", t["id"], "sign")
    with pytest.raises(Refusal) as e:                       # one of two is not enough
        proj.move_task("web/spartan", t["id"], "start")
    assert e.value.rule == "dual-sign" and "web/ana" in e.value.reason
    assert "core/juno" not in e.value.reason
    with pytest.raises(Refusal):                            # and each signs once
        proj.move_task("core/juno", t["id"], "sign")
    proj.move_task("web/ana", t["id"], "sign")
    assert proj.task(t["id"])["signoffs"] == ["core/juno", "web/ana"]
    assert proj.move_task("web/spartan", t["id"], "start")["state"] == "in_progress"

    # each lead reviews their own agents: web's lead, not the creator's lead
    proj.move_task("web/spartan", t["id"], "submit")
    with pytest.raises(Refusal) as e:
        proj.move_task("core/juno", t["id"], "approve")
    assert e.value.rule == "task-state-machine" and "web/ana" in e.value.fix
    assert proj.move_task("web/ana", t["id"], "approve")["state"] == "completed"


def test_same_team_task_needs_no_sign_and_reassign_clears_signoffs(proj):
    t = proj.create_task("core/juno", "refactor", assignee="core/spartan")
    assert proj.move_task("core/spartan", t["id"], "start")["state"] == "in_progress"

    t = proj.create_task("web/ana", "cross", assignee="core/kai")
    proj.move_task("web/ana", t["id"], "sign")
    proj.move_task("core/juno", t["id"], "sign")
    proj.move_task("web/ana", t["id"], "assign", assignee="core/spartan")
    assert proj.task(t["id"])["signoffs"] == []
    with pytest.raises(Refusal) as e:
        proj.move_task("core/spartan", t["id"], "start")
    assert e.value.rule == "dual-sign"


def test_dual_sign_in_an_open_room_uses_the_teams_registered_leads(h):
    lobby = h.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("web/ana", ["lead"])
    lobby.register("web/spartan")
    t = lobby.create_task("core/juno", "cross", assignee="web/spartan")
    with pytest.raises(Refusal) as e:
        lobby.move_task("web/spartan", t["id"], "start")
    assert e.value.rule == "dual-sign" and "web/ana" in e.value.reason
    lobby.move_task("core/juno", t["id"], "sign")
    lobby.move_task("web/ana", t["id"], "sign")
    assert lobby.move_task("web/spartan", t["id"], "start")["state"] == "in_progress"


# --- membership -------------------------------------------------------------------------

def test_membership_and_joining(h, proj):
    h.register_team("ops", "olga", ["ivan"])
    h.create_room("core/juno", "core-only", teams=["core"])
    room = h.room("core-only")
    room.register("core/juno")
    with pytest.raises(Refusal) as e:
        room.register("ops/ivan")
    assert e.value.rule == "room-membership"
    assert "team 'ops' is not a member" in e.value.reason and "core/juno" in e.value.fix

    # a closed room: the joining team's own lead cannot add it; a lead of the room can
    with pytest.raises(Refusal) as e:
        h.join_room("ops", "core-only", by="ops/olga")
    assert e.value.rule == "room-membership"
    with pytest.raises(Refusal) as e:
        h.join_room("ops", "core-only", by="core/spartan")
    assert e.value.rule in ("room-membership", "registered-author", "lead-only")
    assert h.join_room("ops", "core-only", by="core/juno")["joined"]
    assert room.view().room["leads"] == {"core": "core/juno", "ops": "ops/olga"}
    room.register("ops/ivan")
    room.send("ops/ivan", "core/juno", "hi, ops here")

    # after the team leaves, its agents can do nothing but deregister
    h.leave_room("ops", "core-only", by="ops/olga")
    with pytest.raises(Refusal) as e:
        room.send("ops/ivan", "core/juno", "still here?")
    assert e.value.rule == "room-membership"
    with pytest.raises(Refusal) as e:
        room.create_task("ops/ivan", "a task")
    assert e.value.rule == "room-membership"
    room.deregister("ops/ivan")

    # an open room: a team's lead adds its own team
    assert h.join_room("ops", "lobby")["joined"]
    assert h.room("lobby").view().room["leads"] == {"ops": "ops/olga"}
    assert [r["room"] for r in h.rooms_of_team("ops")] == ["lobby"]


def test_unknown_team_refused_at_room_creation(h):
    with pytest.raises(NotFound) as e:
        h.create_room("hub/admin", "x", teams=["ghosts"])
    assert "gitdrop team create" in e.value.fix
    assert not h.store.tip(model.ROOM_PREFIX + "x")


def test_room_settings_only_by_a_lead(h, proj):
    with pytest.raises(Refusal) as e:
        proj.update_room("core/kai", "room-settings", "cap", settings={"loop_cap": 1})
    assert e.value.rule == "lead-only" and "core/juno" in e.value.fix
    with pytest.raises(Refusal) as e:       # a lead cannot take over another team's lead
        proj.update_room("core/juno", "room-settings", "mine",
                         leads=lambda d: dict(d["leads"], web="web/spartan"))
    assert e.value.rule == "lead-only" and "web/ana" in e.value.reason
    proj.update_room("core/juno", "room-settings", "cap", settings={"loop_cap": 5})
    assert proj.view().settings["loop_cap"] == 5
    # a self-declared lead role is refused: the registry says who leads core
    with pytest.raises(Refusal) as e:
        proj.register("core/mia", ["lead"])
    assert e.value.rule == "lead-only" and "core/juno" in e.value.reason
    with pytest.raises(Refusal) as e:   # nor is one its lead does not name
        proj.register("core/mia", ["coder"])
    assert e.value.rule == "room-membership" and "team add core mia" in e.value.fix
    h.register_team("core", "core/juno", ["mia"], by="core/juno")
    proj.register("core/mia", ["coder"])
    with pytest.raises(Refusal) as e:
        proj.update_room("core/mia", "room-settings", "cap", settings={"loop_cap": 500})
    assert e.value.rule == "lead-only"
    with pytest.raises(Refusal) as e:
        h.archive_room("proj", "core/mia")
    assert e.value.rule == "lead-only"


# --- the team registry --------------------------------------------------------------------

def test_team_registry_changes_only_by_its_lead(h):
    t = h.register_team("core", "juno", ["spartan"])
    assert t == {"name": "core", "lead": "core/juno", "members": ["core/juno", "core/spartan"],
                 "created": T0}
    with pytest.raises(Refusal) as e:
        h.register_team("core", "spartan", by="core/spartan")
    assert e.value.rule == "lead-only" and "core/juno" in e.value.reason
    with pytest.raises(Refusal) as e:                       # no `by`: not silently the lead
        h.register_team("core", "spartan")
    assert e.value.rule == "lead-only"
    with pytest.raises(Refusal) as e:                       # a team is created by its lead
        h.register_team("web", "ana", by="core/juno")
    assert e.value.rule == "lead-only"
    for reserved in ("hub", "default"):     # the hub's own identities; agents with no team
        with pytest.raises(Refusal) as e:
            h.register_team(reserved, "root")
        assert e.value.rule == "reserved-name"
    with pytest.raises(UsageError):
        h.register_team("bad name", "x")
    assert h.team("core")["lead"] == "core/juno"

    h.register_team("core", "spartan", ["juno", "kai"], by="juno")    # the lead hands over
    assert h.team("core")["lead"] == "core/spartan"
    assert h.team("core")["created"] == T0
    h.register_team("web", "ana", by="hub/admin")                       # a hub admin creates
    assert [t["name"] for t in h.teams()] == ["core", "web"]
    authors = [(a, op) for a, _t, op, _s in hub_log(h)][:3]
    assert authors == [("hub/admin", "team-create"), ("core/juno", "team-update"),
                       ("core/juno", "team-create")]


def test_join_resyncs_a_changed_lead(h, proj):
    with pytest.raises(Refusal):               # a lead not in the registry is refused
        proj.update_room("core/juno", "room-join", "x",
                         leads=lambda d: dict(d["leads"], web="web/spartan"))
    h.register_team("web", "spartan", ["ana"], by="web/ana")
    # the registry decides: any lead of the room copies the registry's lead in
    assert h.join_room("web", "proj", by="core/juno")["lead"] == "web/spartan"
    assert proj.view().room["leads"]["web"] == "web/spartan"


# --- the loop guard -----------------------------------------------------------------------

def test_loop_guard_refuses_then_recovers_after_the_window(clock, proj):
    proj.update_room("core/juno", "room-settings", "tight loop guard",
                     settings={"loop_cap": 3, "loop_window": 60})
    for i in range(3):
        proj.send("core/kai", "core/spartan", f"ping {i}")
        clock.advance(10)                                   # sent at +0, +10, +20
    with pytest.raises(Refusal) as e:
        proj.send("core/kai", "core/spartan", "ping 3")     # at +30
    assert e.value.rule == "loop-guard"
    assert "3 messages in the last 60s" in e.value.reason and "room cap 3" in e.value.reason
    assert "wait 30s" in e.value.fix and "UTC" in e.value.fix
    clock.advance(29)                                       # +59: the first is still inside
    with pytest.raises(Refusal) as e:
        proj.send("core/kai", "core/spartan", "ping 3")
    assert "wait 1s" in e.value.fix
    clock.advance(1)                                        # +60: it has left the window
    proj.send("core/kai", "core/spartan", "ping 3")
    with pytest.raises(Refusal):
        proj.send("core/kai", "core/spartan", "ping 4")
    proj.inbox("core/spartan")                              # the cap is per agent
    proj.send("core/spartan", "core/kai", "others may still talk")
    assert proj.history(1)[0]["text"] == "others may still talk"


# --- the clock ------------------------------------------------------------------------------

def test_the_injected_clock_dates_every_commit_and_age(h, clock, proj):
    clock.advance(1234)
    proj.send("core/juno", "web/ana", "dated by the hub clock")
    h.register_team("ops", "olga")
    assert h.store.reader.commit(h.store.room_tip("proj")).time == T0 + 1234
    assert hub_log(h)[0][1] == T0 + 1234
    assert proj.who()[0]["last_seen"] == T0
    assert {r["room"]: r["health"] for r in h.rooms()} == {"lobby": "busy", "proj": "busy"}
    clock.advance(8 * DAY)
    assert {r["room"]: r["health"] for r in h.rooms()} == {"lobby": "idle", "proj": "idle"}
    assert {a["agent"]: a["health"] for a in proj.who()}["core/juno"] == "dead"


# --- archive, pin, restore, reap, destroy --------------------------------------------------

def test_archive_keeps_history_readable_and_restore_brings_it_back(h, clock, proj):
    proj.send("core/kai", "web/spartan", "before the archive")
    tip = h.store.room_tip("proj")
    with pytest.raises(Refusal) as e:
        h.archive_room("proj", "core/kai")
    assert e.value.rule == "lead-only" and "core/juno" in e.value.fix
    clock.advance(60)
    got = h.archive_room("proj", "core/juno", "done for now")
    assert got["tip"] == tip
    assert not h.store.tip(model.ROOM_PREFIX + "proj")
    assert h.store.tip(model.ARCHIVE_PREFIX + "proj") == tip
    with pytest.raises(NotFound) as e:
        h.room("proj")
    assert "archived" in e.value.reason and "restore" in e.value.fix
    assert [r["room"] for r in h.rooms()] == ["lobby"]
    (arch,) = h.rooms("archived")
    assert arch["archived_at"] == T0 + 60 and arch["expires"] == T0 + 60 + 90 * DAY
    status = h.room_status("proj")
    assert status["status"] == "archived" and status["messages"] == 1
    assert status["agents"] == ["core/juno", "core/kai", "core/spartan", "web/ana", "web/spartan"]
    assert h.verify("proj", archived=True)[-1][0] == tip
    author, when, op, subject = hub_log(h)[0]
    assert (author, when, op) == ("core/juno", T0 + 60, "room-archive")
    assert "done for now" in subject
    with pytest.raises(Refusal):
        h.create_room("hub/admin", "proj")                  # the name is still taken

    h.restore_room("proj", "web/ana")
    assert h.store.room_tip("proj") == tip
    assert h.room("proj").history(1)[0]["text"] == "before the archive"
    assert h.rooms("archived") == []


def test_idle_archive_is_off_by_default_and_configurable(h, clock, proj):
    clock.advance(365 * DAY)
    assert h.reap() == {"archived": [], "destroyed": [], "spared": [], "now": clock.t,
                        "reaped": [], "dry_run": False, "packed": 0, "swept": 0,
                        "idle_archive_days": 0,
                        "archive_expiry_days": 90}
    assert sorted(r["room"] for r in h.rooms()) == ["lobby", "proj"]

    h.store.repo.config["gitdrop.idleArchiveDays"] = "30"
    proj.send("core/kai", "web/spartan", "still alive")      # proj active today
    got = h.reap()
    assert got["archived"] == ["lobby"] and got["destroyed"] == []
    assert [r["room"] for r in h.rooms()] == ["proj"]
    h.pin_room("proj", "core/juno")
    clock.advance(31 * DAY)                                  # proj idle 31 days, but pinned
    got = h.reap()
    assert got["archived"] == [] and got["spared"] == ["proj"]
    h.pin_room("proj", "web/ana", pinned=False)
    clock.advance(31 * DAY)
    assert h.reap()["archived"] == ["proj"]
    reaped = [(a, op) for a, _t, op, _s in hub_log(h)[:1]]
    assert reaped == [("hub/reaper", "room-archive")]


def test_archives_expire_unless_pinned(h, clock, proj):
    h.create_room("core/juno", "keep", teams=["core"])
    h.archive_room("proj", "core/juno")
    h.archive_room("keep", "core/juno")
    h.pin_room("keep", "core/juno")                          # pinned while archived
    assert {r["room"]: r["pinned"] for r in h.rooms("archived")} == {"keep": True,
                                                                      "proj": False}
    clock.advance(90 * DAY - 1)
    assert h.reap()["destroyed"] == []
    clock.advance(1)
    got = h.reap()
    assert got["destroyed"] == ["proj"] and got["spared"] == ["keep"]
    assert not h.store.tip(model.ARCHIVE_PREFIX + "proj")
    assert h.store.tip(model.ARCHIVE_PREFIX + "keep")
    author, when, op, subject = hub_log(h)[0]
    assert (author, when, op) == ("hub/reaper", T0 + 90 * DAY, "room-destroy")
    assert "archived over 90 days" in subject
    assert h._hub_view().text("archive/proj.toml") is None

    h.store.repo.config["gitdrop.archiveExpiryDays"] = "7"   # configurable
    h.pin_room("keep", "core/juno", pinned=False)
    assert h.reap()["destroyed"] == ["keep"]
    assert h.rooms("archived") == []

    h.create_room("core/juno", "forever", teams=["core"])
    h.archive_room("forever", "core/juno")
    h.store.repo.config["gitdrop.archiveExpiryDays"] = "0"   # 0: archives never expire
    clock.advance(3650 * DAY)
    assert h.reap()["destroyed"] == []


def test_an_archive_killed_before_its_record_is_not_expired_from_the_room_s_last_commit(
        h, clock, proj):
    """Killed between the ref's move and the hub's record, a room counted as archived
    at its last commit: one long idle went at the next reap, its pin lost."""
    clock.advance(200 * DAY)   # long idle, then archived by a process killed midway
    h._move(h.store.room_ref("proj"), model.ARCHIVE_PREFIX + "proj", "archived by core/juno")
    assert h.reap()["destroyed"] == []
    author, when, op, subject = hub_log(h)[0]
    assert (author, op) == ("hub/reaper", "room-archive") and "without its record" in subject
    clock.advance(90 * DAY - 1)
    assert h.reap()["destroyed"] == []
    clock.advance(1)
    assert h.reap()["destroyed"] == ["proj"]   # 90 days from when it was found


def test_archiving_again_finishes_an_archive_a_killed_process_began(h, clock, proj):
    """The move finished (by the next process to open the hub), the record not: the
    same command again said 'already archived', and no record was ever written."""
    h._move(h.store.room_ref("proj"), model.ARCHIVE_PREFIX + "proj", "archived by core/juno")
    r = h.archive_room("proj", "core/juno")
    assert r["archived"] is True
    author, _when, op, subject = hub_log(h)[0]
    assert (author, op) == ("core/juno", "room-archive"), subject
    with pytest.raises(Refusal) as e:   # and now it is archived, recorded
        h.archive_room("proj", "core/juno")
    assert "already archived" in e.value.reason


def test_destroy_is_refused_for_a_non_lead_and_needs_every_lead(h, proj):
    tip = h.store.room_tip("proj")
    for who in ("core/kai", "web/spartan", "ops/olga", ""):
        with pytest.raises(Refusal) as e:
            h.destroy_room("proj", who)
        assert e.value.rule == "lead-only"
        assert "core/juno" in e.value.reason and "web/ana" in e.value.reason
    assert h.store.room_tip("proj") == tip
    first = h.destroy_room("proj", "juno")                  # a short name resolves
    assert first["destroyed"] is False and first["waiting_for"] == ["web/ana"]
    assert h.store.room_tip("proj") == tip
    assert h.destroy_room("proj", "core/juno")["waiting_for"] == ["web/ana"]   # idempotent
    done = h.destroy_room("proj", "web/ana", "wrong room")
    assert done == {"room": "proj", "destroyed": True, "tip": tip}
    assert not h.store.tip(model.ROOM_PREFIX + "proj")
    assert not h.store.tip(model.ARCHIVE_PREFIX + "proj")
    log = hub_log(h)
    assert (log[0][0], log[0][2]) == ("web/ana", "room-destroy") and tip[:7] in \
        h.store.repo[h.store.repo.references[model.HUB_REF].target].message
    assert h._hub_view().text("destroy/proj.toml") is None
    with pytest.raises(NotFound):
        h.destroy_room("proj", "web/ana")

    # a one-team room: its lead decides alone
    h.create_room("core/juno", "solo", teams=["core"])
    assert h.destroy_room("solo", "core/juno")["destroyed"]
    # an open room: its leads and the operator, since the lead of any team may join
    # one (a stranger's new team, its only lead, destroyed the lobby alone)
    lobby = h.room("lobby")
    lobby.register("web/ana", ["lead"])
    lobby.register("web/spartan")
    with pytest.raises(Refusal):
        h.destroy_room("lobby", "web/spartan")
    assert h.destroy_room("lobby", "web/ana")["waiting_for"] == ["hub/admin"]
    assert h.destroy_room("lobby", "hub/admin")["destroyed"]


def test_archive_loses_no_concurrent_write(h, proj, tmp_path):
    """Writers keep sending while a lead archives: every accepted message is in
    the archived history (the ref is moved under a lock with compare-and-swap)."""
    accepted, stop = [], threading.Event()

    def writer():
        other = hubmod.Hub(h.path, clock=h.clock).room("proj")
        while not stop.is_set():
            try:
                accepted.append(other.send("core/kai", "core/spartan", "x")["commit"])
            except Exception:   # the room went away under the writer: not accepted
                if not h.store.tip(model.ROOM_PREFIX + "proj"):
                    return
    proj.update_room("core/juno", "room-settings", "no cap", settings={"loop_cap": 0})
    th = threading.Thread(target=writer)
    th.start()
    deadline = time.time() + 30
    while len(accepted) < 5 and time.time() < deadline:
        time.sleep(0.001)
    tip = h.archive_room("proj", "core/juno")["tip"]
    stop.set()
    th.join(30)
    repo = pygit2.Repository(h.path)
    assert accepted
    for oid in accepted:
        assert oid == tip or repo.descendant_of(tip, oid), oid
    assert h.store.tip(model.ARCHIVE_PREFIX + "proj") == tip
    assert not h.store.tip(model.ROOM_PREFIX + "proj")


def test_a_reap_packs_the_hub_s_objects_once_many_are_loose(tmp_path):
    """Every write leaves loose objects and git's own gc is off on a hub: nothing ever
    packed them (440,000 took 1.8 GB and made verify five times slower)."""
    import os
    import subprocess

    import pygit2
    h = hubmod.init(str(tmp_path / "hub.git"), fsync=False)
    r = h.room("lobby")
    r.register("core/juno", ["lead"])
    r.register("core/kai", [])
    for i in range(40):
        r.send("core/juno", "core/kai", f"note {i}")
    r.inbox("core/kai", limit=0)
    repo, n = pygit2.Repository(h.path), 0   # unreachable ones too, as a refused write leaves
    fan = os.path.join(h.path, "objects", "17")   # the directory git's estimate reads
    while len(os.listdir(fan) if os.path.isdir(fan) else []) < 2:
        repo.create_blob(f"left by a refused write {n}".encode())
        n += 1

    def loose():
        out = subprocess.run(["git", "--git-dir", h.path, "count-objects", "-v"],
                             capture_output=True, text=True, check=True).stdout
        return int(out.split("count: ")[1].split()[0])
    before = loose()
    assert before > 80 and h.reap()["packed"] == 0   # too few (6,700 by default)
    assert h.pack(most=1) >= 512   # estimated as git does, from one fan-out directory
    # refs stay loose: the log's replay of an archive removes a ref's file
    assert os.path.exists(os.path.join(h.path, "refs", "heads", "rooms", "lobby"))
    packed = os.path.join(h.path, "packed-refs")
    assert not os.path.exists(packed) or "rooms/lobby" not in open(packed).read()
    assert loose() <= n, (before, loose())   # what a write left and nothing reaches stays
    assert [m["text"] for m in r.inbox("core/kai", again=True)["messages"]][-1] == "note 39"
    r.send("core/juno", "core/kai", "after the pack")   # writes and reads go on
    assert [m["text"] for m in r.inbox("core/kai")["messages"]] == ["after the pack"]
    assert h.verify("lobby")


def test_a_reap_removes_the_files_kept_for_rooms_that_are_gone(tmp_path):
    """Each room's turn, request slots, commit briefs and task index stayed in
    gitdrop/ after the room was destroyed: 200 rooms gone left 1,000 files behind."""
    import fcntl
    import os
    h = hubmod.init(str(tmp_path / "hub.git"), fsync=False)
    for name in ("gone", "kept", "held"):
        h.create_room("hub/admin", name, open_=True)
        r = h.room(name)
        r.register("core/kai", [])
        r.create_task("core/kai", "t")
        r.list_tasks()
    queue = os.path.join(h.path, "gitdrop", "queue")
    tasks = os.path.join(h.path, "gitdrop", "tasks")

    def files_of(room):
        base = "refs%heads%rooms%" + room
        return sorted([n for n in os.listdir(queue) if n.split(".")[0] == base] +
                      [n for n in os.listdir(tasks) if n.rpartition(".")[0] == room])
    assert len(files_of("gone")) >= 3 and len(files_of("held")) >= 3
    for name in ("gone", "held"):
        h.archive_room(name, "hub/admin")
    assert h.reap()["swept"] == 0 and files_of("gone")   # archived: kept
    for name in ("gone", "held"):
        h.destroy_room(name, "hub/admin")
    stray = os.path.join(queue, "refs%heads%rooms%..%x")   # no room's name: not judged
    open(stray, "w").close()
    turn = open(os.path.join(queue, "refs%heads%rooms%held"), "rb")
    fcntl.flock(turn, fcntl.LOCK_EX)   # a writer of it, somewhere, has its turn
    try:
        swept = h.reap()["swept"]
    finally:
        turn.close()
    assert files_of("gone") == [] and swept >= 3
    assert [n for n in files_of("held") if n.startswith("refs")], "taken from under a writer"
    assert files_of("kept") and os.path.exists(stray)
    h.reap()
    assert files_of("held") == []
    h.create_room("hub/admin", "gone", open_=True)   # the name again: made anew
    r = h.room("gone")
    r.register("core/kai", [])
    assert r.create_task("core/kai", "again")["id"] == "1"
