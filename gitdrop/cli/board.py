"""`gitdrop board`: the room at a glance, live, full-screen (gitdrop/board.py
gathers and draws it). Redrawn when the notifier says something landed (inotify
on a local hub, polling a remote one), and every 30 s for the ages.

Keys: q quits; r goes to the next room; t, a task id and Enter (or o) opens that
task; Esc or b goes back to the board. Without a terminal, or with --once, one
frame is printed; --json prints the same data.
"""

import os
import sys
from typing import Annotated

import typer

from .base import Scope, command, console

app = typer.Typer(add_completion=False)

AGES = 30.0        # seconds between redraws when nothing lands (ages move on)
DEBOUNCE = 0.08    # seconds to gather a burst of events into one redraw
REMOTE_POLL = 2.0  # a remote hub's longest poll interval while nothing moves (the
                   # notifier's default backs off to 5 s: long for a person watching)
FRAME = (160, 50)  # the size of a frame printed off a terminal (COLUMNS/LINES win)


@command(app, "board")
def board(s: Scope, once: Annotated[bool, typer.Option(
        "--once", help="Print one frame and exit (also what happens off a terminal).")] = False):
    """The room at a glance, live: agents with health, task and last act; tasks in
    columns by state; open questions; handshakes waiting on acks; the last events.
    Keys: q quit, r next room, t ID Enter open a task, Esc/b back."""
    from .. import board as b
    room = s.room
    if s.json:
        s.emit(b.board_data(room))
        return
    if once or not _terminal():
        w, h = _size()
        console(width=w, height=h).print(b.render(b.board_data(room), w, h))
        return
    Live(s, room).run()


def _terminal() -> bool:
    try:
        return sys.stdin.isatty() and sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def _size() -> tuple[int, int]:
    if sys.stdout.isatty():
        return tuple(os.get_terminal_size(sys.stdout.fileno()))
    env = os.environ
    w = int(env["COLUMNS"]) if env.get("COLUMNS", "").isdigit() else FRAME[0]
    h = int(env["LINES"]) if env.get("LINES", "").isdigit() else FRAME[1]
    return w, h


class Live:
    """The live board: one thread reads keys, the notifier's thread reports what
    landed; both put into one queue, which this (main) thread turns into frames."""

    def __init__(self, s: Scope, room):
        import queue
        self.s, self.room = s, room
        self.q = queue.Queue()
        self.mode = "board"          # board, input (typing a task id), task
        self.typed = ""
        self.task_id = ""
        self.note = ""
        self.last = None

    # --- what is drawn ----------------------------------------------------------
    def frame(self):
        from .. import board as b
        from ..errors import GitdropError
        w, h = self.con.size
        if self.mode == "task":
            try:
                return b.render_task(b.task_data(self.room, self.task_id), w, h,
                                     footer=" Esc/b back · q quit · r next room")
            except GitdropError as e:   # gone meanwhile (its room archived, say)
                self.mode, self.note = "board", e.reason
        try:
            data = b.board_data(self.room)
        except GitdropError as e:
            if self.last is None:
                raise
            self.note, data = e.reason, self.last
        self.last = data
        foot = None
        if self.mode == "input":
            foot = f" open task: #{self.typed}_   Enter or o opens · Esc cancels"
        return b.render(data, w, h, note=self.note, footer=foot)

    def draw(self) -> None:
        self.live.update(self.frame(), refresh=True)

    # --- input ------------------------------------------------------------------
    def keys(self, fd: int) -> None:
        import select
        while not self.stopping.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 64)
            except OSError:
                return
            if not chunk:
                return
            text = chunk.decode("utf-8", "replace")
            if text.startswith("\x1b") and len(text) > 1:   # an arrow or function key
                continue
            for ch in text:
                self.q.put(("key", ch))

    def key(self, ch: str) -> bool:
        """Act on one key; False to quit."""
        from ..errors import GitdropError
        if self.mode == "input":
            if ch in ("\r", "\n", "o"):
                tid, self.typed = self.typed.strip().lstrip("#"), ""
                self.mode = "board"
                if tid:
                    try:
                        self.room.task(tid)
                        self.mode, self.task_id, self.note = "task", tid, ""
                    except GitdropError as e:
                        self.note = e.reason
            elif ch == "\x1b":
                self.mode, self.typed = "board", ""
            elif ch in ("\x7f", "\x08"):
                self.typed = self.typed[:-1]
            elif ch.isprintable() and len(self.typed) < 80:
                self.typed += ch
            return True
        if ch == "q":
            return False
        if ch == "r":
            self.next_room()
        elif ch == "t":
            self.mode, self.typed = "input", ""
        elif self.mode == "task" and ch in ("\x1b", "b"):
            self.mode = "board"
        return True

    def next_room(self) -> None:
        from ..errors import GitdropError
        names = [r["room"] for r in self.s.hub.rooms()]
        here = self.room.name
        if not names or names == [here]:
            self.note = "no other room"
            return
        name = names[(names.index(here) + 1) % len(names)] if here in names else names[0]
        try:
            room = Scope(self.s.hub_value, name).room
        except GitdropError as e:   # gone meanwhile (archived, say)
            self.note = e.reason
            return
        self.unsubscribe()
        self.room, self.mode, self.note, self.last = room, "board", "", None
        self.unsubscribe = self.notifier.subscribe(name, "", self.landed, every=True)

    def landed(self, evs) -> None:
        self.q.put(("event", len(evs)))

    # --- the loop ---------------------------------------------------------------
    def run(self) -> None:
        import queue
        import signal
        import termios
        import threading
        import time
        import tty

        from rich.live import Live as RichLive

        from ..notifier import Notifier

        # a path or a git URL ("": the default); a remote hub polled at most REMOTE_POLL apart
        self.notifier = Notifier(self.s.hub_value, poll=(0.2, REMOTE_POLL))
        self.unsubscribe = self.notifier.subscribe(self.room.name, "", self.landed, every=True)
        self.notifier.start()
        self.con = console()
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
        self.stopping = threading.Event()
        reader = threading.Thread(target=self.keys, args=(fd,), name="gitdrop-keys",
                                  daemon=True)
        old_winch = signal.signal(signal.SIGWINCH, lambda *_: self.q.put(("resize", None)))
        try:
            tty.setcbreak(fd)
            reader.start()
            with RichLive(console=self.con, screen=True, auto_refresh=False,
                          redirect_stdout=False, redirect_stderr=False) as live:
                self.live = live
                self.draw()
                while True:
                    try:
                        items = [self.q.get(timeout=AGES)]
                    except queue.Empty:
                        self.draw()
                        continue
                    # a burst (a script writing ten commits, a pasted id) is one redraw
                    end = time.monotonic() + (DEBOUNCE if items[0][0] == "event" else 0.005)
                    while True:
                        left = end - time.monotonic()
                        if left <= 0:
                            break
                        try:
                            items.append(self.q.get(timeout=left))
                        except queue.Empty:
                            break
                    quit_ = False
                    for kind, val in items:
                        if kind == "key" and not self.key(val):
                            quit_ = True
                            break
                    if quit_:
                        break
                    self.draw()
        except KeyboardInterrupt:
            pass
        finally:
            self.stopping.set()
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
            signal.signal(signal.SIGWINCH, old_winch)
            self.unsubscribe()
            self.notifier.stop()
            reader.join(1)
