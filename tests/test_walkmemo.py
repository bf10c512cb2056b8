"""The walk memo file: flushes append what changed, a later line wins, a line a
crash cut short is skipped, and the file is compacted once it has grown."""

import os

from gitdrop import walkmemo


def test_appends_later_wins_and_compacts(tmp_path, monkeypatch):
    path = str(tmp_path / "walks")
    a, b = walkmemo.WalkMemo(path), walkmemo.WalkMemo(path)
    a[("x", "c1", False)] = ["t1", True, 0, None, []]
    a.flush(every=0)
    size = os.path.getsize(path)
    b[("x", "c1", False)] = ["t2", True, 2, 5, [7, 8]]
    b[("inbox", "y", "c2", True)] = ["t3", ["oid:to"]]
    b.flush(every=0)
    assert os.path.getsize(path) > size                  # appended, not rewritten
    got = walkmemo.WalkMemo(path)
    assert got[("x", "c1", False)] == ["t2", True, 2, 5, [7, 8]]
    assert got[("inbox", "y", "c2", True)] == ["t3", ["oid:to"]]
    assert not got.dirty and not got._new                # loaded entries are not new

    monkeypatch.setattr(walkmemo, "MAX_KEEP", 5)
    monkeypatch.setattr(walkmemo, "COMPACT_AT", 20)
    m = walkmemo.WalkMemo(path)
    for i in range(30):
        m[("k", str(i), False)] = [str(i), True, 0, None, []]
        m.flush(every=0)
    with open(path) as f:
        lines = f.readlines()
    assert len(lines) < 20
    assert walkmemo.WalkMemo(path)[("k", "29", False)] == ["29", True, 0, None, []]

    # Another process compacting: this one neither waits nor loses what it had to write.
    import fcntl
    import time
    lock = os.open(path + ".compact", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        t = time.monotonic()
        for i in range(30, 40):
            m[("k", str(i), False)] = [str(i), True, 0, None, []]
            m.flush(every=0)
        assert time.monotonic() - t < 1
        assert ("k", "35", False) not in walkmemo.WalkMemo(path)   # held back meanwhile
    finally:
        os.close(lock)
    m.flush(every=0)
    got = walkmemo.WalkMemo(path)
    assert all(got[("k", str(i), False)] == [str(i), True, 0, None, []] for i in range(35, 40))


def test_a_line_cut_short_is_skipped(tmp_path):
    path = str(tmp_path / "walks")
    m = walkmemo.WalkMemo(path)
    m[("x", "c1", False)] = ["t1", True, 3, None, []]
    m.flush(every=0)
    with open(path, "r+") as f:
        text = f.read()
        f.seek(0)
        f.truncate()
        f.write(text[:-12])                              # the crash cut it short
    m2 = walkmemo.WalkMemo(path)
    m2[("x", "c2", False)] = ["t2", True, 0, None, []]
    m2.flush(every=0)                                    # runs on from the cut line
    got = walkmemo.WalkMemo(path)
    assert ("x", "c1", False) not in got
    assert ("x", "c2", False) not in got                 # merged into the cut line
    m2[("x", "c3", False)] = ["t3", True, 0, None, []]
    m2.flush(every=0)
    assert walkmemo.WalkMemo(path)[("x", "c3", False)] == ["t3", True, 0, None, []]


def test_the_memo_keeps_own_sends_only_as_the_loop_guard_needs(tmp_path):
    """The unread check's memo keeps a sender's own message times for the loop
    guard: none without one, a few windows' worth with one (a busy writer's hour of
    sends made the memo megabytes, and every process loads it). A cap set later
    still counts the sends made before it."""
    from gitdrop import hub as hubmod
    from gitdrop.errors import Refusal
    h = hubmod.init(str(tmp_path / "hub.git"), room="")
    h.create_room("hub/admin", "r", open_=True, settings={"loop_cap": 0})
    r = h.room("r")
    r.register("t/lead", ["lead"])
    for a in ("t/ann", "t/bob"):
        r.register(a)
    for i in range(40):
        r.send("t/ann", "t/bob", f"m{i}")
    memo = h.store.reader.walks
    mine = [v for k, v in memo.items() if k[0] == "t/ann"]
    assert mine and all(v[4] == [] for v in mine)          # no loop guard: no times kept
    h.room_settings("r", by="hub/admin", changes={"loop_cap": 5, "loop_window": 60})
    r = h.room("r")
    try:
        r.send("t/ann", "t/bob", "one more")
        raise AssertionError("the cap counted none of the 40 sends before it")
    except Refusal as e:
        assert e.rule == "loop-guard" and "sent 40 messages" in e.reason
    h.room_settings("r", by="hub/admin", changes={"loop_cap": 1000, "loop_window": 10})
    r = h.room("r")
    for i in range(30):
        r.send("t/ann", "t/bob", f"n{i}")
    mine = [v for k, v in h.store.reader.walks.items() if k[0] == "t/ann"]
    newest = max(max(v[4]) for v in mine if v[4])
    assert all(t >= newest - 300 for v in mine for t in v[4])   # max(300 s, 2 windows)
