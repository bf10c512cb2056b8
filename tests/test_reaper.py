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
