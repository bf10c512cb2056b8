"""The server's periodic reaper: the same Hub.reap, on a timer."""

import time

from gitdrop import hub as hubmod


def test_reap_every_archives_an_idle_room_in_the_background(tmp_path):
    now = [int(time.time())]
    hub = hubmod.init(str(tmp_path / "hub.git"), fsync=False, clock=lambda: now[0])
    hub.store.repo.config["gitdrop.idleArchiveDays"] = "1"
    hub.create_room("hub/admin", "quiet")
    stop = hub.reap_every(0.05)
    try:
        time.sleep(0.2)
        assert "quiet" in [r["room"] for r in hub.rooms("active")]   # not idle yet
        now[0] += 2 * 86400
        deadline = time.time() + 5
        while time.time() < deadline and "quiet" not in [r["room"] for r in hub.rooms("archived")]:
            time.sleep(0.05)
        assert "quiet" in [r["room"] for r in hub.rooms("archived")]
        assert any("archived" in e["subject"] for e in _hub_log(hub))
    finally:
        stop.set()


def _hub_log(hub):
    from gitdrop.view import first_parent_walk
    tip = hub.store.tip("refs/heads/hub")
    return [{"subject": c.subject} for c in first_parent_walk(hub.store.reader, tip)]


# --- reap with rooms due, and others acting meanwhile ----------------------------------

DAY = 86400
T0 = 1767225600   # 2026-01-01


def _hub(tmp_path, rooms=("a", "b"), idle=1, expiry=90):
    path = str(tmp_path / "hub.git")
    h = hubmod.init(path, room="", clock=lambda: T0, fsync=False)
    h.store.repo.config["gitdrop.idleArchiveDays"] = str(idle)
    h.store.repo.config["gitdrop.archiveExpiryDays"] = str(expiry)
    for n in rooms:
        h.create_room("hub/admin", n, open_=True)
        h.room(n).register("t/ann", ["lead"])
        h.room(n).register("t/bob")
        h.room(n).send("t/bob", "t/ann", f"hello in {n}")
    return path


def _at(path, when):
    return hubmod.Hub(path, clock=lambda: when)


def _meanwhile(act):
    """reap's progress callback: `act` once reap has listed the rooms and judged one."""
    def progress(done, total):
        if done == 1:
            act()
    return progress


def test_a_room_pinned_or_restored_while_reap_runs_is_left_alone(tmp_path):
    """reap judged the rooms as it listed them: one pinned after the listing was
    archived all the same, and an archive restored (and written to) was destroyed as
    an active room, its new commit with it."""
    path = _hub(tmp_path)
    now = T0 + 2 * DAY
    got = _at(path, now).reap(progress=_meanwhile(
        lambda: _at(path, now).pin_room("b", "hub/admin")))
    assert got["archived"] == ["a"], got
    assert [r["room"] for r in _at(path, now).rooms("active")] == ["b"]
    _at(path, now).pin_room("b", "hub/admin", pinned=False)
    _at(path, now).archive_room("b", "hub/admin")
    later = now + 100 * DAY

    def restore_and_write():
        h = _at(path, later)
        h.restore_room("b", "hub/admin")
        h.room("b").send("t/bob", "t/ann", "after the restore")
    got = _at(path, later).reap(progress=_meanwhile(restore_and_write))
    assert got["destroyed"] == ["a"], got
    h = _at(path, later)
    assert [r["room"] for r in h.rooms("active")] == ["b"]
    assert h.room("b").history(1)[0]["text"] == "after the restore"


def test_an_archive_is_dated_by_the_hubs_clock_and_a_stale_record_is_nobodys(tmp_path):
    """`reap --now` in the past dated its archives then, and the next reap took them for
    long expired; a record a killed destroy left behind gave its date to the next
    archive of the name, which the next reap destroyed."""
    path = _hub(tmp_path, rooms=("a",))
    now = T0 + 200 * DAY
    got = _at(path, now).reap(now=T0 + 2 * DAY)   # judged as of then, done now
    assert got["archived"] == ["a"] and not got["dry_run"], got
    h = _at(path, now)
    assert h._archive_record("a")["archived"] == now
    assert h.reap()["destroyed"] == []
    # a destroy killed after its move: the ref is gone, its record stays
    h._move("refs/archive/rooms/a", None, "destroyed by a process killed next")
    assert h._hub_view().text("archive/a.toml")
    h.create_room("hub/admin", "a", open_=True)
    h._move("refs/heads/rooms/a", "refs/archive/rooms/a", "archived, killed before its record")
    rec = h._archive_record("a")
    assert rec.get("missing"), rec   # the old record names another tip: not this one's
    assert _at(path, now + DAY).reap()["destroyed"] == []


def test_reap_goes_on_past_a_room_another_reap_took_or_a_damaged_one(tmp_path):
    import os
    import subprocess
    path = _hub(tmp_path, rooms=("a", "b", "c"))
    now = T0 + 2 * DAY
    got = _at(path, now).reap(progress=_meanwhile(
        lambda: _at(path, now).archive_room("b", "hub/admin")))   # another reap's
    assert sorted(got["archived"]) == ["a", "c"], got
    # a ref that names a blob, as a torn write or a bad update-ref leaves it
    blob = subprocess.run(["git", "--git-dir", path, "hash-object", "-w", "--stdin"],
                          input="x", capture_output=True, text=True).stdout.strip()
    os.makedirs(os.path.join(path, "refs/heads/rooms"), exist_ok=True)
    with open(os.path.join(path, "refs/heads/rooms/y"), "w") as f:
        f.write(blob + "\n")
    h = _at(path, now + 100 * DAY)
    got = h.reap()
    assert sorted(got["destroyed"]) == ["a", "b", "c"], got


def test_a_write_to_a_room_archived_under_it_says_so(tmp_path):
    from gitdrop.errors import NotFound
    import pytest
    path = _hub(tmp_path, rooms=("a",))
    h = _at(path, T0)
    room = h.room("a")
    h.archive_room("a", "hub/admin")
    for call in (lambda: room.send("t/bob", "t/ann", "still here?"),
                 lambda: room.register("t/cy")):
        with pytest.raises(NotFound) as e:
            call()
        assert "is archived" in e.value.reason and "restore" in e.value.fix, e.value


def test_a_restored_room_is_idle_from_its_restore_not_from_its_last_commit(tmp_path):
    """A restore adds no commit to the room: the next reap took it for as idle as
    before and archived it again, the day it came back."""
    path = _hub(tmp_path, rooms=("a",))
    assert _at(path, T0 + 2 * DAY).reap()["archived"] == ["a"]
    _at(path, T0 + 3 * DAY).restore_room("a", "hub/admin")
    h = _at(path, T0 + 3 * DAY + 60)
    assert h.rooms("active")[0]["last_activity"] == T0 + 3 * DAY
    assert h.reap()["archived"] == []                       # back an hour ago: not idle
    assert _at(path, T0 + 4 * DAY + 60).reap()["archived"] == ["a"]   # a day on: idle again
    hv = _at(path, T0 + 5 * DAY)._hub_view()
    assert hv.text("restored/a.toml") is None and hv.text("archive/a.toml")
    _at(path, T0 + 6 * DAY).restore_room("a", "hub/admin")
    _at(path, T0 + 6 * DAY).destroy_room("a", "hub/admin")   # and destroy takes it too
    assert _at(path, T0 + 6 * DAY).destroy_room("a", "t/ann")["destroyed"]
    assert _at(path, T0 + 6 * DAY)._hub_view().text("restored/a.toml") is None
