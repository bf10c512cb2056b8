"""What a walk back through a room's history found, kept between processes.

The unread-before-send check and the inbox walk back from the tip to an agent's
read cursor. An agent that nothing concerns never moves its cursor, so in a
long-lived room every CLI call (a fresh process) would walk the whole history
since it registered. The rules and the inbox keep, per (agent, cursor, ...),
what they found up to a tip T; this module keeps those entries in
`<hub>/gitdrop/walks`, so the next process walks only what is newer than T.

It is derived data: keyed by commit ids (a commit's ancestry never changes), so
an entry is either used exactly or, when its T is not on the walk, ignored.
Losing the file, or a racing writer's entries, only means walking again. The
format is tab-separated text (no json: the pre-receive hook reads it too).
"""

import os
import time

MAX_KEEP = 2000


def path_for(git_dir: str) -> str:
    return os.path.join(git_dir, "gitdrop", "walks")


class WalkMemo(dict):
    """A dict of walk results that loads from and flushes to one file."""

    def __init__(self, path: str = ""):
        super().__init__()
        self.path = path
        self.dirty = False
        self._flushed = 0.0
        if path:
            self.update(_load(path))

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.dirty = True

    def flush(self, every: float = 0.5) -> None:
        """Write the file if something changed (at most every `every` seconds)."""
        if not self.path or not self.dirty or time.monotonic() - self._flushed < every:
            return
        self._flushed = time.monotonic()
        self.dirty = False
        try:
            merged = _load(self.path)
            try:
                merged.update(self.copy())
            except RuntimeError:  # another thread changed it meanwhile: next time
                self.dirty = True
                return
            items = list(merged.items())[-MAX_KEEP:]
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(_line(k, v) for k, v in items)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a cache: never worth failing a write for


# One entry per line: the key's fields, "|", the value's fields. Values are
# strings, ints, booleans, None and lists of those (see rules._quick_ok and
# core.Room._events_since for what they hold).

def _enc(x) -> str:
    if x is None:
        return "~"
    if x is True or x is False:
        return "T" if x else "F"
    if isinstance(x, int):
        return f"i{x}"
    if isinstance(x, (list, tuple)):
        return "l" + ",".join(_enc(y).replace(",", "%2C") for y in x)
    return "s" + str(x).replace("%", "%25").replace("\t", "%09").replace("\n", "%0A")


def _dec(s: str):
    tag, body = s[:1], s[1:]
    if tag == "~":
        return None
    if tag in "TF" and not body:
        return tag == "T"
    if tag == "i":
        return int(body)
    if tag == "l":
        return [_dec(y.replace("%2C", ",")) for y in body.split(",")] if body else []
    if tag == "s":
        return body.replace("%0A", "\n").replace("%09", "\t").replace("%25", "%")
    raise ValueError(s)


def _line(key, value) -> str:
    return "\t".join([_enc(k) for k in key] + ["|"] + [_enc(v) for v in value]) + "\n"


def _load(path: str) -> dict:
    out = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                try:
                    bar = fields.index("|")
                    out[tuple(_dec(x) for x in fields[:bar])] = [_dec(x) for x in fields[bar + 1:]]
                except ValueError:
                    continue  # a line from another version, or damaged: skip it
    except (OSError, UnicodeDecodeError):
        pass
    return out
