"""`gitdrop board`: one frame (--once), its data (--json), and the live board in a
real terminal (tmux): the first frame, a redraw after a write with no key pressed,
opening a task, switching rooms, and quitting with the terminal restored."""

import os
import shutil
import subprocess
import tempfile
import time

import pytest

from gitdrop import hub as hubmod
from cli_helpers import ENTRY, Gitdrop

TMUX = shutil.which("tmux") or ("/usr/bin/tmux" if os.path.exists("/usr/bin/tmux") else "")


@pytest.fixture
def seeded(tmp_path):
    """A lobby with a lead and two coders, a task in each interesting state, an
    open question and a handshake waiting on an ack; and a second room."""
    h = hubmod.init(str(tmp_path / "hub.git"))
    r = h.room("lobby")
    r.register("core/juno", ["lead"])
    r.register("core/spartan", ["coder"])
    r.register("core/kai", ["coder"])
    r.create_task("core/juno", "Build the users API", assignee="core/spartan", priority=2,
                  body="Return id and name of every user.")                        # 1
    r.move_task("core/spartan", 1, "start")
    r.create_task("core/juno", "Write the release notes")                              # 2
    r.create_task("core/juno", "Migrate the database", assignee="core/kai")            # 3
    r.move_task("core/kai", 3, "block", note="waiting for the staging credentials")
    r.create_task("core/juno", "Pick a port", assignee="core/kai")                     # 4
    r.move_task("core/kai", 4, "ask", question="Which port should the API listen on?")
    r.create_task("core/juno", "Page of users", after=["2"])                           # 5
    r.create_task("core/juno", "Say hello", assignee="core/spartan", review=False)     # 6
    r.move_task("core/spartan", 6, "start")
    r.move_task("core/spartan", 6, "complete", note="said")
    r.start_handshake("core/juno", "spartan serves users by page", targets=["core/spartan"])
    h.create_room("hub/admin", "second", open_=True)
    h.room("second").register("ui/lyra", ["coder"])
    h.room("second").create_task("ui/lyra", "Draw the second room's page")
    return h


def column(doc, state):
    return next(c for c in doc["columns"] if c["state"] == state)


def test_json_frame_has_the_rooms_state(seeded, tmp_path):
    g = Gitdrop(seeded.path, str(tmp_path))
    doc = g.js("board")
    assert doc["room"] == "lobby" and doc["tasks_total"] == 6
    agents = {a["agent"]: a for a in doc["agents"]}
    assert set(agents) == {"core/juno", "core/spartan", "core/kai"}
    assert agents["core/spartan"]["current"]["id"] == "1"
    assert agents["core/spartan"]["health"] == "healthy"
    assert agents["core/kai"]["current"]["state"] in ("feedback", "blocked")
    assert agents["core/kai"]["last_act_subject"]
    assert [t["id"] for t in column(doc, "in_progress")["tasks"]] == ["1"]
    assert column(doc, "in_progress")["tasks"][0]["priority"] == 2
    assert column(doc, "in_progress")["tasks"][0]["assignee"] == "core/spartan"
    assert {t["id"] for t in column(doc, "pending")["tasks"]} == {"2", "5"}
    assert column(doc, "pending")["count"] == 2
    blocked = column(doc, "blocked")["tasks"]
    assert [t["id"] for t in blocked] == ["3"]
    assert blocked[0]["reason"] == "waiting for the staging credentials"
    waiting = next(t for t in column(doc, "pending")["tasks"] if t["id"] == "5")
    assert waiting["waiting_on"] == ["2"] and waiting["reason"] == "waits on #2"
    assert [t["id"] for t in column(doc, "completed")["tasks"]] == ["6"]
    assert [q["task"] for q in doc["questions"]] == ["4"]
    assert doc["questions"][0]["question"] == "Which port should the API listen on?"
    assert doc["questions"][0]["for"] == "core/juno"
    assert [(h["id"], h["owed_by"]) for h in doc["handshakes"]] == [(1, ["core/spartan"])]
    assert doc["events"] and "handshake 1 started" in doc["events"][-1]["subject"]


def test_once_prints_one_frame(seeded, tmp_path):
    g = Gitdrop(seeded.path, str(tmp_path))
    r = g.ok("board", "--once", env={"COLUMNS": "160", "LINES": "50", "NO_COLOR": "1"})
    out = r.out
    assert len(out.splitlines()) == 50
    assert max(len(line) for line in out.splitlines()) <= 160
    for text in ("board · lobby", "Agents (3)", "core/spartan", "core/kai",
                 "#1 P2 Build the users", "in progress 1", "blocked 1", "pending 2",
                 "waiting for the stag", "waits on #2",
                 "Which port should the API listen on?", "owed by spartan (0/1)",
                 "spartan serves users by page", "Last events"):
        assert text in out, text
    assert "\x1b[" not in out   # NO_COLOR: no styles
    # off a terminal, without --once, the same single frame
    r2 = g.ok("board", env={"COLUMNS": "160", "LINES": "50", "NO_COLOR": "1"})
    assert "Agents (3)" in r2.out and len(r2.out.splitlines()) == 50
    # another room
    r3 = g.ok("board", "--once", "--room", "second", env={"COLUMNS": "120", "LINES": "30"})
    assert "board · second" in r3.out and "Draw the second" in r3.out
    # the header whole at 80 columns (it was cut at "· 0 ")
    r4 = g.ok("board", "--once", env={"COLUMNS": "80", "LINES": "30", "NO_COLOR": "1"})
    assert "handshakes" in r4.out.splitlines()[0], r4.out.splitlines()[0]


class Pane:
    """A board in a tmux server of its own."""

    def __init__(self, hub_path: str, home: str, tmp):
        self.sock = f"gitdrop-board-{os.getpid()}-{time.monotonic_ns()}"
        self.done = os.path.join(str(tmp), "board-exit")
        # tmux's socket path must fit in 108 bytes: not under a worker's deep tmp_path
        self.sockdir = tempfile.mkdtemp(prefix="gd-tmux-")
        env = {"HOME": home, "GITDROP_HUB": hub_path, "TERM": "xterm-256color",
               "TMUX_TMPDIR": self.sockdir}
        envs = " ".join(f"{k}={v}" for k, v in env.items())
        # after the board: its exit code and whether the terminal is back to normal
        cmd = (f"env -u GITDROP_ROOM -u GITDROP_AGENT -u NO_COLOR {envs} "
               f"{' '.join(ENTRY)} board; echo \"board exited $?\"; "
               f"stty -a | tr ' ' '\\n' | grep -x -e -icanon -e icanon -e -echo -e echo "
               f"> {self.done}; sleep 60")
        self.env = dict(os.environ, TMUX_TMPDIR=self.sockdir)
        self.env.pop("TMUX", None)
        self.tmux("new-session", "-d", "-x", "160", "-y", "50", cmd)

    def tmux(self, *args) -> str:
        p = subprocess.run([TMUX, "-L", self.sock, *args], capture_output=True, text=True,
                           env=self.env, timeout=20)
        assert p.returncode == 0, p.stderr
        return p.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p")

    def wait_for(self, text: str, within: float) -> float:
        start = time.monotonic()
        while True:
            s = self.screen()
            if text in s:
                return time.monotonic() - start
            if time.monotonic() - start > within:
                raise AssertionError(f"{text!r} not on screen after {within} s:\n{s}")
            time.sleep(0.05)

    def keys(self, *keys) -> None:
        self.tmux("send-keys", *keys)

    def kill(self) -> None:
        subprocess.run([TMUX, "-L", self.sock, "kill-server"], capture_output=True,
                       env=self.env, timeout=20)
        shutil.rmtree(self.sockdir, ignore_errors=True)


def test_live_board_in_a_terminal(seeded, tmp_path):
    if not TMUX:
        pytest.skip("tmux is not installed")
    g = Gitdrop(seeded.path, str(tmp_path), agent="core/juno")
    pane = Pane(seeded.path, str(tmp_path), tmp_path)
    try:
        pane.wait_for("Agents (3)", 20)
        first = pane.screen()
        for text in ("board · lobby", "core/spartan", "core/kai", "core/juno",
                     "Build the users", "Migrate the datab", "waiting for the stag",
                     "Which port should the API", "owed by spartan"):
            assert text in first, text

        # a write from elsewhere shows up with no key pressed
        g.ok("send", "spartan", "-m", "board-live-hello")
        took = pane.wait_for("board-live-hello", 3)
        assert took < 3
        g.ok("task", "create", "A task made while watching")
        pane.wait_for("A task made while watching", 3)
        assert "pending 3" in pane.screen()

        # t, an id and Enter open a task; Esc goes back
        pane.keys("t", "3", "Enter")
        pane.wait_for("task #3 · Migrate the database", 5)
        detail = pane.screen()
        assert "held by   waiting for the staging credentials" in detail
        assert "assigned → blocked by kai" in detail    # its history
        pane.keys("Escape")
        pane.wait_for("Agents (3)", 5)
        # ... and o opens too; b goes back
        pane.keys("t", "1", "o")
        pane.wait_for("Return id and name of every user.", 5)
        pane.keys("b")
        pane.wait_for("Agents (3)", 5)

        # r: the next room
        pane.keys("r")
        pane.wait_for("board · second", 5)
        assert "ui/lyra" in pane.screen() and "Draw the second" in pane.screen()
        # and its writes are followed now
        Gitdrop(seeded.path, str(tmp_path), agent="ui/lyra").ok(
            "task", "create", "Second room, live", "--room", "second")
        pane.wait_for("Second room, live", 3)

        # q: out, with the terminal as it was (canonical mode, echo)
        pane.keys("q")
        pane.wait_for("board exited 0", 5)
        deadline = time.monotonic() + 5
        while not (os.path.exists(pane.done) and open(pane.done).read().strip()):
            assert time.monotonic() < deadline, "stty did not run"
            time.sleep(0.05)
        assert open(pane.done).read().split() == ["icanon", "echo"]
        assert "Agents (" not in pane.screen()   # the alternate screen is gone
    finally:
        pane.kill()


def test_a_remote_hub_gives_the_same_frame(seeded, tmp_path):
    g = Gitdrop("file://" + seeded.path, str(tmp_path))
    doc = g.js("board")
    assert doc["tasks_total"] == 6 and {a["agent"] for a in doc["agents"]} == {
        "core/juno", "core/spartan", "core/kai"}
    assert [t["id"] for t in column(doc, "blocked")["tasks"]] == ["3"]


def test_a_cross_team_task_shows_whose_sign_off_it_waits_for(seeded, tmp_path):
    """Nothing on the board said a cross-team task could not start for want of a lead's
    sign-off: it sat in assigned, holding nobody's name."""
    r = seeded.room("lobby")
    r.register("web/ana", ["lead"])
    r.register("web/wes", ["coder"])
    t = r.create_task("core/juno", "across", assignee="web/wes")["id"]
    g = Gitdrop(seeded.path, str(tmp_path))
    row = next(x for x in column(g.js("board"), "assigned")["tasks"] if x["id"] == t)
    assert row["reason"] == "sign-off owed by core/juno, web/ana"
    r.move_task("web/ana", t, "sign")
    row = next(x for x in column(g.js("board"), "assigned")["tasks"] if x["id"] == t)
    assert row["reason"] == "sign-off owed by core/juno"
    from gitdrop import board
    assert board.task_data(r, t)["task"]["reason"] == "sign-off owed by core/juno"
    r.move_task("core/juno", t, "sign")
    assert board.task_data(r, t)["task"]["reason"] == ""
