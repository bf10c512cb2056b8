"""The pre-receive hook: every pushed commit goes through the same rules as a
write from the CLI or MCP server. Refusing here leaves no trace (quarantine)."""

import os
import sys
import time

from . import wal
from .catfile import CatFile
from .layout import old_rooms, upgrade_on_push
from .errors import GitdropError
from .verify import check_commits


def pusher() -> str:
    """The identity the transport authenticated: gitdrop-shell (SSH) or HTTP auth."""
    return os.environ.get("GITDROP_PUSHER") or os.environ.get("REMOTE_USER", "")


def main() -> int:
    updates = [line.split() for line in sys.stdin.read().splitlines() if line.strip()]
    reader = CatFile()
    now = int(time.time())
    git_dir = os.environ.get("GIT_DIR", ".")
    try:
        wal.ensure(git_dir)   # after a crash: the log first
        old_layout = old_rooms(reader, updates)
        if old_layout:   # moved first; the push is then refused (fetch and push again)
            from .leanstore import LeanStore
            upgrade_on_push(LeanStore(git_dir), old_layout)
        for old, new, ref in updates:
            check_commits(reader, ref, old, new, now, pusher())
        for _old, _new, ref in updates:
            # git locks the refs once this hook has said yes; a lock a killed
            # process left would make it refuse: cleared if its owner is dead.
            if os.path.exists(os.path.join(git_dir, ref + ".lock")):
                wal.clear_lock(git_dir, ref)
    except GitdropError as e:   # a refusal, or a damaged hub file (what to do)
        sys.stderr.write(e.render() + "\n")
        return 1
    except Exception as e:  # a bug must not let a push through unchecked
        sys.stderr.write(f"gitdrop: the hook failed ({type(e).__name__}: {e}); push refused\n")
        return 1
    finally:
        reader.close()
    return 0
