"""gitdrop-shell: the forced command of an SSH key that belongs to one agent.

    command="gitdrop-shell [--hub PATH] team/name",restrict ssh-ed25519 AAAA…

sshd runs it instead of whatever the client asked for, with the request in
SSH_ORIGINAL_COMMAND. It allows git-upload-pack (fetch) and git-receive-pack
(push) on the hub only, and runs them with GITDROP_PUSHER=team/name, so the
pre-receive hook refuses commits authored by anyone else. The hub is --hub, else
$GITDROP_HUB, else ~/.gitdrop/hub.git, and must be a gitdrop hub. git gets sshd's
session variables alone (none a client may send) and the hub's own hooks.
"""

import os
import re
import shlex
import sys

from .. import model, wal
from ..files import never_world_writable

ALLOWED = {"git-upload-pack": "upload-pack", "git-receive-pack": "receive-pack",
           "git upload-pack": "upload-pack", "git receive-pack": "receive-pack"}


# What git is given of the session's environment: sshd's own variables and the
# locale. Anything else may be the client's (AcceptEnv, SetEnv): GIT_CONFIG_COUNT
# with core.hooksPath alone turned the hook off, and uploadpack.packObjectsHook ran a
# command of the client's as the hub's account.
_KEPT = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ", "TMPDIR",
         "SSH_CONNECTION", "SSH_CLIENT"}


def git_env(agent: str, given: dict) -> dict:
    env = {k: v for k, v in given.items() if k in _KEPT or k.startswith("LC_")}
    protocol = wanted_protocol(given.get("GIT_PROTOCOL", ""))
    if protocol:
        env["GIT_PROTOCOL"] = protocol
    env["GITDROP_PUSHER"] = agent
    return env


def wanted_protocol(value: str) -> str:
    """The git protocol version a client asks for (GIT_PROTOCOL, the Git-Protocol
    header), or "": nothing else of the client's goes to git."""
    return value if re.fullmatch(r"version=[0-9]", value) else ""


def _fail(msg: str, code: int = 1) -> int:
    sys.stderr.write(f"gitdrop-shell: {msg}\n")
    return code


def _requested_path(arg: str, home: str) -> str:
    if arg.startswith("~/"):
        arg = os.path.join(home, arg[2:])
    elif arg == "~":
        arg = home
    elif not os.path.isabs(arg):
        arg = os.path.join(home, arg)   # ssh paths without a slash are relative to home
    return os.path.realpath(arg)


def parse(argv: list[str]) -> tuple[str, str]:
    """(agent, hub) from the forced command's own arguments."""
    hub = ""
    args = list(argv)
    if len(args) >= 2 and args[0] == "--hub":
        hub = args[1]
        args = args[2:]
    elif args and args[0].startswith("--hub="):
        hub = args[0][6:]
        args = args[1:]
    if len(args) != 1:
        raise ValueError("usage: gitdrop-shell [--hub PATH] team/name")
    return args[0], hub


def resolve(agent: str, hub: str, request: str, home: str) -> tuple[list[str], str]:
    """The git command to run for an SSH request, or ValueError saying why not."""
    if not model.is_agent_id(agent):
        raise ValueError(f"bad agent {agent!r} in authorized_keys: use team/name")
    hub = os.path.realpath(os.path.expanduser(hub or os.environ.get("GITDROP_HUB")
                                              or "~/.gitdrop/hub.git"))
    if not request:
        raise ValueError(f"this key pushes and fetches {hub} as {agent}; "
                         "it has no shell")
    try:
        words = shlex.split(request)
    except ValueError:
        raise ValueError("cannot parse the requested command") from None
    if len(words) == 3 and words[0] == "git":
        words = [f"git {words[1]}", words[2]]
    if len(words) != 2 or words[0] not in ALLOWED:
        raise ValueError(f"only git fetch and push are allowed with this key "
                         f"(asked: {request[:80]!r})")
    wanted = _requested_path(words[1], home)
    if wanted != hub and wanted + ".git" != hub:   # "hub" means "hub.git", as git allows
        raise ValueError(f"this key only reaches the gitdrop hub {hub}")
    return ["git", ALLOWED[words[0]], hub], hub


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    never_world_writable()
    try:
        agent, hub = parse(argv)
        cmd, hub = resolve(agent, hub, os.environ.get("SSH_ORIGINAL_COMMAND", ""),
                           os.path.expanduser("~"))
    except ValueError as e:
        return _fail(str(e))
    if not wal.is_hub(hub):   # $GITDROP_HUB may be the client's (AcceptEnv): never any repo
        return _fail(f"{hub} is not a gitdrop hub; name the hub on the key's line "
                     "(gitdrop-shell --hub PATH team/name)")
    try:
        wal.ensure(hub)   # after a crash: replay the log before git serves anything
    except OSError as e:
        return _fail(f"cannot open the hub's log: {e}")
    # The hub's own hooks, whatever a global or system git config says (core.hooksPath
    # set for the account's other repositories skipped gitdrop's hook).
    cmd[1:1] = ["-c", f"core.hooksPath={os.path.join(hub, 'hooks')}"]
    try:
        os.execvpe(cmd[0], cmd, git_env(agent, dict(os.environ)))
    except OSError as e:
        return _fail(f"cannot run git: {e}", 127)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
