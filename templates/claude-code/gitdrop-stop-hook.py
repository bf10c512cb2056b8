#!/usr/bin/env python3
"""Claude Code Stop hook: keeps a persistent gitdrop worker alive while work waits
for it, and lets it stop after an idle time.

When Claude is about to end its turn, this runs `gitdrop wait` for up to
GITDROP_IDLE seconds:
  - something waits (exit 0): the stop is blocked and the one-line alert becomes
    Claude's next instruction ("3 unread messages from juno; task 12 assigned to you");
  - nothing arrived in the idle time (exit 124): Claude stops;
  - gitdrop failed (no hub, unknown agent, ...): Claude stops; the reason goes to stderr.
If the very same work (same unread commits, tasks, reviews) comes back more than
GITDROP_MAX_REPEATS times in a row, the worker is not acting on it: Claude is let stop
rather than loop.

Environment (set it in .claude/settings.json "env"):
  GITDROP_AGENT        who this worker is (team/name); without it the hook does nothing
  GITDROP_HUB          hub path or git URL (default: gitdrop's own default)
  GITDROP_ROOM         room (default lobby)
  GITDROP_IDLE         seconds to wait for work before letting Claude stop (default 600);
                       keep it below the hook's "timeout" in settings.json
  GITDROP_BIN          how to run gitdrop (default "gitdrop"; e.g. "/path/venv/bin/gitdrop")
  GITDROP_MAX_REPEATS  the same work handed over more times than this → stop (default 3)
Standard library only.
"""

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile


def main() -> int:
    try:
        event = json.load(sys.stdin)
    except ValueError:
        event = {}
    agent = os.environ.get("GITDROP_AGENT", "")
    if not agent:
        return 0
    idle = os.environ.get("GITDROP_IDLE", "600")
    cmd = shlex.split(os.environ.get("GITDROP_BIN", "gitdrop")) + ["wait", "--as", agent,
                                                                   "--timeout", idle, "--json"]
    if os.environ.get("GITDROP_HUB"):
        cmd += ["--hub", os.environ["GITDROP_HUB"]]
    if os.environ.get("GITDROP_ROOM"):
        cmd += ["--room", os.environ["GITDROP_ROOM"]]
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        sys.stderr.write(f"gitdrop stop hook: cannot run {cmd[0]}: {e}\n")
        return 0
    if p.returncode == 124:
        return 0  # idle: let the worker stop
    if p.returncode != 0:
        sys.stderr.write(f"gitdrop stop hook: gitdrop wait failed ({p.returncode}): "
                         f"{p.stderr.strip()[-500:]}\n")
        return 0
    try:
        alert = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0
    what = json.dumps([[e.get("id") for e in alert.get("events", [])], alert.get("tasks"),
                       alert.get("reviews"), alert.get("handshakes")])
    if _repeats(event.get("session_id", ""), what) > int(
            os.environ.get("GITDROP_MAX_REPEATS", "3")):
        sys.stderr.write("gitdrop stop hook: the same work keeps waiting and nothing moves; "
                         f"letting the worker stop ({alert.get('summary', '')})\n")
        return 0
    reason = (f"{alert.get('alert', 'gitdrop: work is waiting for you')}\n"
              f"Read it now (gitdrop inbox --as {agent}, or the check_inbox tool), act on it, "
              "then end your turn: you will be woken again when more arrives.")
    print(json.dumps({"decision": "block", "reason": reason}))
    return 0


def _repeats(session: str, what: str) -> int:
    """How many times in a row this session was handed this very same work."""
    key = hashlib.sha1(f"{session}|{os.environ.get('GITDROP_AGENT')}".encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"gitdrop-stop-{key}.json")
    try:
        with open(path) as f:
            last = json.load(f)
    except (OSError, ValueError):
        last = {}
    count = last.get("count", 0) + 1 if last.get("what") == what else 1
    try:
        with open(path, "w") as f:
            json.dump({"what": what, "count": count}, f)
    except OSError:
        pass
    return count


if __name__ == "__main__":
    sys.exit(main())
