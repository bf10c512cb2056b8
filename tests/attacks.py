"""The attack file: hostile inputs, by the door they come through.

Every entry was once accepted somewhere, or is its near relative. test_trust.py sends
each through its door (the command line, MCP over stdio and HTTP, a raw git push)
and checks it is refused with words and leaves nothing behind. Add to it whenever a
new way in is found.
"""

# Names of rooms, teams, agents, tasks, contracts, context keys and idempotency keys.
BAD_NAMES = [
    "evil\n",                    # `$` let one final newline through: a room was bricked
    "core\n",
    "../hub",                    # --room ../hub read the hub branch
    "../../archive/rooms/proj",  # --room wrote into an archived room
    "x.lock",                    # passed the check, then crashed in pygit2
    "a..b",
    "a.",
    ".hidden",
    "-x",
    "a/b",
    "a b",
    "a\tb",
    "a\x00b",
    "évil",
    "x" * 41,
    "",
]

# Agent ids given to register (team/name).
BAD_AGENTS = ["core/evil\n", "core\n/evil", "core/../x", "core/a/b", "/evil", "core/",
              "core/x.lock", "hub/admin", "hub/reaper"]

# One-line values that end up in a commit trailer (reply-to, task, key).
TRAILER_INJECTIONS = [
    "abc\nGitdrop-To: all",
    "1\n\nGitdrop-Op: task-cancel",
    "k1\r\nGitdrop-Cc: all",
    "x\x00y",
]

# Message text and file text.
BAD_TEXTS = [
    "before\x00after",           # readers cut at the NUL; the message then reached everyone
    "ansi \x1b[2J clear",
    "bell \x07",
]
BAD_UTF8 = b"caf\xe9 \xff\xfe"   # not UTF-8: gave a traceback

# TOML headers that TOML itself forbids or reads otherwise.
BAD_TOML_HEADERS = [
    'state = "completed"\nstate = "pending"',   # a key twice: last one won
    'a.b = 1',                                  # a dotted key is a table in TOML
]
