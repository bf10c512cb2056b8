"""The on-repo text formats: a TOML subset, front-matter documents and trailers.

Pure and light to import because the pre-receive hook loads it on every push: no
re and no json at import time (json pulls in re, enum and more, most of the hook's
import time; it is imported only to write a string that needs escapes).

The TOML subset is what TOML and JSON spell alike: `key = value` lines (a bare key
of A-Z a-z 0-9 _ -, or a "quoted" one) with basic strings (escapes \\" \\\\ \\b \\f
\\n \\r \\t \\uXXXX), 64-bit integers, true/false and one-line arrays of those,
`# comments`, and one level of `[table]` headers. What it reads, any TOML reader
reads the same (tests/test_fuzz_formats.py holds it to tomllib): whatever TOML
reads otherwise or not at all is refused with the line and what to do (a dotted
key, a key set twice, `\\/`, `+1`, ...). What it writes is valid TOML and reads
back equal.
"""

import time

FRONT = "+++"
TRAILER_PREFIX = "Gitdrop-"


# What moves a terminal's cursor or reorders the text after it, when printed: control
# characters (a carriage return draws a line over the one before, as if another
# message; ESC starts a terminal command), C1 controls, the marks that turn text right
# to left. A local room holds none but the CR (the rules refuse the rest); a hub given
# as a URL sends what it likes. (No re: the hook imports this.)
_SHOW = {c: "\\r" if c == 13 else f"\\x{c:02x}" if c < 256 else f"\\u{c:04x}"
         for c in [*range(0, 9), *range(11, 32), 127, *range(0x80, 0xa0), 0x61c, 0x200e,
                   0x200f, *range(0x202a, 0x202f), *range(0x2066, 0x206a)]}
_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"   # where str.splitlines breaks


def shown(text: str) -> str:
    """`text` as a listing shows it to a person: a control character (newline and tab
    aside) or a direction mark as an escape (\\r, \\x1b, \\u202e); a CR before a
    newline dropped."""
    if text.isprintable():
        return text
    return text.replace("\r\n", "\n").translate(_SHOW)


def commit_named(oid: str, subject: str, most: int = 72) -> str:
    """A commit as a refusal names it: its short id ("(new)" if it has none yet) and
    its subject, cut with an ellipsis (cut bare, "taken by spar" read as a name)."""
    cut = subject if len(subject) <= most else subject[:most - 1] + "…"
    return f"{oid[:12] or '(new)'} \"{cut}\""


def line_break(text: str) -> bool:
    """Whether `text` holds anything a terminal or str.splitlines breaks a line at."""
    return any(ch in text for ch in _BREAKS)


def stamp(t, pattern: str = "%Y-%m-%d %H:%M:%SZ", local: bool = False) -> str:
    """A time (seconds since 1970) written with `pattern`, in UTC or local time. A
    file's time is its writer's word: one past what the C library can write (a task
    pushed with created = 2**63-1) is shown as its number, not a crash."""
    try:
        return time.strftime(pattern, (time.localtime if local else time.gmtime)(t))
    except (OverflowError, OSError, ValueError, TypeError):
        return f"@{t}"


class FormatError(ValueError):
    pass


class _Bad(Exception):
    """What is wrong in a value or key; the caller says on which line."""


_MISS = object()
_WS = " \t"
_BARE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
_DIGITS = "0123456789"
_HEX = "0123456789abcdefABCDEF"
_ESCAPES = {'"': '"', "\\": "\\", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1
_DEPTH = 32
_USE = '(use "text", 123, true/false or ["a", "b"])'


def _plain(s: str) -> bool:
    """Text a basic string holds as it is: no control character (tab included, as in
    JSON), no DEL, no lone surrogate. str.isprintable says yes at C speed for most."""
    return s.isprintable() or all(
        " " <= ch and ch != "\x7f" and not "\ud800" <= ch <= "\udfff" for ch in s)


def _bare(key: str) -> bool:
    """A bare key: one or more of A-Z a-z 0-9 _ - (a dot would make it dotted)."""
    return bool(key) and key.isascii() and not key.strip(_BARE)


def _comment_ok(s: str) -> bool:
    """TOML allows tab but no other control character, nor DEL, in a comment."""
    return _plain(s) or _plain(s.replace("\t", " "))


def _skip(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in _WS:
        i += 1
    return i


def _simple(tok: str):
    """The value of a plain string, a small integer or a boolean token; else _MISS
    (the fast path: what _scan would give, at C speed)."""
    if len(tok) >= 2 and tok[0] == '"' and tok[-1] == '"':
        inner = tok[1:-1]
        if '"' in inner or "\\" in inner or not _plain(inner):
            return _MISS
        return inner
    digits = tok[1:] if tok[:1] == "-" else tok
    if digits and len(digits) < 18 and digits.isascii() and digits.isdigit() and \
            (digits == "0" or digits[0] != "0"):
        return int(tok)
    if tok == "true":
        return True
    if tok == "false":
        return False
    return _MISS


def _array(raw: str):
    """The value of `[...]` of plain tokens; else _MISS (the fast path for arrays)."""
    inner = raw[1:-1]
    if not inner:
        return []
    out = []
    for piece in inner.split(","):
        v = _simple(piece.strip(_WS))
        if v is _MISS:
            return _MISS
        out.append(v)
    return out


def _string(s: str, i: int):
    """The basic string opening at s[i] ('"'): (its value, the index after it)."""
    out = []
    j = i + 1
    while True:
        q = s.find('"', j)
        if q < 0:
            raise _Bad('a string is not closed (a " is missing)')
        b = s.find("\\", j, q)
        k = q if b < 0 else b
        if k > j:
            part = s[j:k]
            if not _plain(part):
                raise _Bad("a string holds a control character, DEL or a lone surrogate "
                           "(write it as an escape: \\t, \\n, \\u007f, ...)")
            out.append(part)
        if b < 0:
            return "".join(out), q + 1
        c = s[b + 1:b + 2]
        if c == "u":
            h = s[b + 2:b + 6]
            if len(h) < 4 or h.strip(_HEX):
                raise _Bad("\\u takes four hex digits")
            if "d800" <= h.lower() <= "dfff":
                raise _Bad(f"\\u{h} is half of a surrogate pair, which TOML refuses "
                           "(write the character itself)")
            out.append(chr(int(h, 16)))
            j = b + 6
        elif c and c in _ESCAPES:
            out.append(_ESCAPES[c])
            j = b + 2
        else:
            raise _Bad(f"\\{c} is not an escape TOML and JSON share "
                       "(use \\\" \\\\ \\b \\f \\n \\r \\t or \\uXXXX)")


def _scan(s: str, i: int, depth: int = 0):
    """The value opening at s[i]: (the value, the index after it)."""
    c = s[i:i + 1]
    if c == '"':
        return _string(s, i)
    if c == "[":
        if depth >= _DEPTH:
            raise _Bad("arrays nested too deep")
        out = []
        i = _skip(s, i + 1)
        while s[i:i + 1] != "]":
            if i >= len(s):
                raise _Bad("an array is not closed (a ] is missing; arrays stay on one line)")
            if s[i] == ",":
                raise _Bad("an array holds an empty value (a comma with no value before it)")
            v, i = _scan(s, i, depth + 1)
            out.append(v)
            i = _skip(s, i)
            c = s[i:i + 1]
            if c == ",":
                i = _skip(s, i + 1)
            elif c != "]":
                raise _Bad("array values need a ',' between them and a ']' after them")
        return out, i + 1
    if s.startswith("true", i):
        return True, i + 4
    if s.startswith("false", i):
        return False, i + 5
    j = k = i + 1 if c == "-" else i
    n = len(s)
    while k < n and s[k] in _DIGITS:
        k += 1
    if k == j or (s[j] == "0" and k - j > 1):
        raise _Bad(f"cannot read value {s[i:i + 40]!r} {_USE}")
    v = int(s[i:k])
    if not _INT_MIN <= v <= _INT_MAX:
        raise _Bad(f"{s[i:k]} is out of the 64-bit range TOML allows")
    return v, k


def _value(raw: str, where: str):
    """The value spelled by `raw`, the text after `=` (a comment may follow it)."""
    raw = raw.strip(_WS)
    value = _simple(raw)
    if value is _MISS and raw[:1] == "[" and raw[-1:] == "]":
        value = _array(raw)
    if value is not _MISS:
        return value
    if not raw:
        raise FormatError(f"{where}: a value is missing after = {_USE}")
    try:
        value, j = _scan(raw, 0)
    except _Bad as e:
        raise FormatError(f"{where}: {e}") from None
    rest = raw[j:].lstrip(_WS)
    if rest and rest[0] == "#":
        if not _comment_ok(rest):
            raise FormatError(f"{where}: a comment holds a control character or DEL")
    elif rest:
        raise FormatError(f"{where}: cannot read value {raw[:40]!r} {_USE}")
    return value


def _key_problem(n: int, s: str, key: str, eq: str) -> str:
    if not eq:
        return f"line {n}: expected key = value, got {s[:40]!r}"
    if not key:
        return f"line {n}: a key is missing before ="
    if "." in key and key.replace(".", "").strip(_BARE + _WS) == "":
        return (f"line {n}: {key!r} is a dotted key, which TOML reads as a table in a "
                f"table; gitdrop reads one level of [table] only (quote the key, "
                f"\"{key.replace(' ', '')}\", if the dot is part of the name)")
    return (f"line {n}: {key[:40]!r} is not a bare key (A-Z a-z 0-9 _ -): quote it "
            f"(\"...\") or rename it")


def _header(s: str, n: int) -> str:
    """The name of a `[table]` header line."""
    if s.startswith("[["):
        raise FormatError(f"line {n}: [[...]] (an array of tables) is not supported; "
                          "use one [table]")
    i = _skip(s, 1)
    if s[i:i + 1] == '"':
        try:
            name, i = _string(s, i)
        except _Bad as e:
            raise FormatError(f"line {n}: cannot read the table name: {e}") from None
    else:
        j = i
        while j < len(s) and s[j] in _BARE:
            j += 1
        name, i = s[i:j], j
    i = _skip(s, i)
    c = s[i:i + 1]
    if c == "." and name:
        raise FormatError(f"line {n}: {s[:40]} is a table in a table (a dotted name); "
                          "gitdrop reads one level of [table] only (quote the name, "
                          '["a.b"], if the dot is part of it)')
    if c != "]" or (not name and s[1:i].strip(_WS) == ""):
        raise FormatError(f"line {n}: expected a [table] header, got {s[:40]!r} (a table "
                          "name is A-Z a-z 0-9 _ - or quoted)")
    rest = s[i + 1:].lstrip(_WS)
    if rest and (rest[0] != "#" or not _comment_ok(rest)):
        raise FormatError(f"line {n}: only a comment may follow [{name}] on its line")
    return name


def loads_toml(text: str) -> dict:
    """Read the TOML subset; a FormatError names the line and what to do."""
    if "\r" in text:
        text = text.replace("\r\n", "\n")
        if "\r" in text:
            n = text.count("\n", 0, text.index("\r")) + 1
            raise FormatError(f"line {n}: a carriage return (\\r) that does not end "
                              "the line (\\r\\n); remove it")
    data: dict = {}
    table = data
    tname = None
    first: dict = {}    # (table, key) -> the line that set it
    tables: dict = {}   # table -> the line of its header
    for n, line in enumerate(text.split("\n"), 1):
        s = line.strip(_WS)
        if not s:
            continue
        c = s[0]
        if c == "#":
            if not _comment_ok(s):
                raise FormatError(f"line {n}: a comment holds a control character or DEL; "
                                  "remove it")
            continue
        if c == "[":
            tname = _header(s, n)
            if tname in tables:
                raise FormatError(f"line {n}: table [{tname}] appears twice (first on line "
                                  f"{tables[tname]}); put all its keys under one [{tname}] header")
            if tname in data:
                raise FormatError(f"line {n}: [{tname}] clashes with the key {tname!r} "
                                  f"on line {first[None, tname]}; rename one of them")
            tables[tname] = n
            table = data[tname] = {}
            continue
        if c == '"':
            try:
                key, i = _string(s, 0)
            except _Bad as e:
                raise FormatError(f"line {n}: cannot read the key: {e}") from None
            rest = s[i:].lstrip(_WS)
            if rest[:1] == ".":
                raise FormatError(f"line {n}: {s[:40]!r} starts a dotted key, which TOML "
                                  "reads as a table in a table; gitdrop reads one level of "
                                  "[table] only (put the dot inside the quotes)")
            if rest[:1] != "=":
                raise FormatError(f"line {n}: expected = after the key {key[:40]!r}")
            raw = rest[1:]
        else:
            key, eq, raw = s.partition("=")
            key = key.rstrip(_WS)
            if not eq or not ((key.isascii() and key.isidentifier()) or _bare(key)):
                raise FormatError(_key_problem(n, s, key, eq))
        if key in table:
            raise FormatError(f"line {n}: {key!r} is set twice (first on line "
                              f"{first[tname, key]}); keep only one of them")
        first[tname, key] = n
        raw = raw.strip(_WS)
        value = _simple(raw)
        table[key] = value if value is not _MISS else _value(raw, f"line {n} ({key})")
    return data


_LINE_BREAKS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}


def json_line(obj, **kw) -> str:
    """`obj` as one line of JSON, text kept as it is (not \\u-escaped), but for the
    characters other line splitters break at (Python's str.splitlines, JavaScript):
    one of them in a message made a Stop hook read half a document."""
    import json
    text = json.dumps(obj, ensure_ascii=False, **kw)
    if any(c in text for c in _LINE_BREAKS):
        text = text.translate(str.maketrans(_LINE_BREAKS))
    return text


def _dump_str(s: str) -> str:
    if '"' not in s and "\\" not in s and _plain(s):
        return '"' + s + '"'
    import json
    # JSON's escapes are TOML's, but JSON leaves DEL as it is and TOML refuses it.
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _dump_value(v) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_dump_value(x) for x in v) + "]"
    if isinstance(v, int):
        return str(v)
    return _dump_str(str(v))


def _dump_key(k: str) -> str:
    """A quoted key: a basic string, written as a string value is (not in JSON's ASCII
    form, whose surrogate-pair escapes for characters beyond U+FFFF TOML refuses)."""
    return _dump_str(k)


def _key(k: str) -> str:
    """Bare if it can be (a dot would make it a dotted key), else quoted."""
    return k if (k.isascii() and k.isidentifier()) or _bare(k) else _dump_str(k)


def dumps_toml(data: dict) -> str:
    out, tables = [], []
    for k, v in data.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            out.append(f"{_key(k)} = {_dump_value(v)}")
    for name, table in tables:
        out.append(f"\n[{_key(name)}]")
        out.extend(f"{_key(k)} = {_dump_value(v)}" for k, v in table.items())
    return "\n".join(out) + "\n"


def loads_doc(text: str) -> tuple[dict, str]:
    """A Markdown document with a `+++` TOML front-matter header: a `+++` line, the
    header, a closing line of exactly `+++`, the body."""
    if not text.startswith(FRONT + "\n"):
        raise FormatError("document must start with a '+++' line (TOML front matter)")
    end = text.find("\n" + FRONT + "\n", len(FRONT))
    if end < 0:
        end = len(text) - len(FRONT) - 1
        if end < len(FRONT) or not text.endswith("\n" + FRONT):
            raise FormatError("front matter is not closed by a line of exactly '+++'")
    header = loads_toml(text[len(FRONT) + 1:end])
    body = text[end + len(FRONT) + 1:]
    if body.startswith("\n"):
        body = body[1:]
    return header, body


def dumps_doc(header: dict, body: str) -> str:
    body = body.rstrip("\n")
    return f"{FRONT}\n{dumps_toml(header)}{FRONT}\n" + (body + "\n" if body else "")


# --- commit messages -------------------------------------------------------

def parse_message(message: str) -> tuple[str, str, list[tuple[str, str]]]:
    """Split a commit message into (subject, body, trailers).

    Only a last paragraph made wholly of `Gitdrop-Key: value` lines counts as
    trailers, so a message text that ends in "Note: x" stays text.
    """
    message = message.replace("\r\n", "\n")
    if message.startswith("\n"):   # an empty first line: no subject, as git reads it
        subject, rest = "", message.strip("\n")
    else:
        subject, _, rest = message.strip("\n").partition("\n")
        rest = rest.strip("\n")
    trailers: list[tuple[str, str]] = []
    paras = rest.split("\n\n") if rest else []
    if not paras and subject.startswith(TRAILER_PREFIX):
        paras, subject = [subject], ""
    if paras:
        last = paras[-1].strip("\n").split("\n")
        parsed = []
        for line in last:
            key, sep, value = line.partition(": ")
            if not sep or not key.startswith(TRAILER_PREFIX) or " " in key:
                parsed = None
                break
            parsed.append((key[len(TRAILER_PREFIX):].lower(), value.strip()))
        if parsed is not None:
            trailers = parsed
            paras = paras[:-1]
    return subject, "\n\n".join(paras).strip("\n"), trailers


_TRAILER_LINES: dict = {}


def may_have_trailer(message: str, key: str) -> bool:
    """Could `message` hold trailer `key` (as parse_message reads trailers: a line
    `Gitdrop-<Key>: value`, the key in any case)? No means no; yes is for
    parse_message to decide. A search in C, where a walk over thousands of commits
    would otherwise parse every message."""
    got = _TRAILER_LINES.get(key)
    if got is None:
        import re   # here, not at import: the hook imports this module on every push
        got = _TRAILER_LINES[key] = re.compile(
            "^" + re.escape(TRAILER_PREFIX) + re.escape(key) + ": ", re.M | re.I)
    return got.search(message) is not None


_TOKEN = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-"


def _one_line(s: str) -> bool:
    """No line break nor other control character (C0, DEL, C1), no lone surrogate."""
    return s.isprintable() or all(
        " " <= ch and not "\x7f" <= ch <= "\x9f" and not "\ud800" <= ch <= "\udfff"
        for ch in s)


def format_message(subject: str, body: str, trailers: list[tuple[str, str]]) -> str:
    """A commit message: the subject (on one line), the body, the trailers.

    A trailer key is letters, digits and `-` (what git reads as a trailer's name) and
    a value one line without control characters, stripped of spaces at its ends:
    anything else raises FormatError (a ValueError), so that no value adds a trailer
    line of its own (a reply_to of "x\nGitdrop-To: all" would turn a direct message
    into a note to everyone). git reads the trailers written here as parse_message
    reads them (tests/test_fuzz_formats.py runs git interpret-trailers)."""
    subject = " ".join(subject.split())
    parts = [subject]
    body = body.strip("\n")
    if body:
        parts.append(body)
    if trailers:
        lines = []
        for k, v in trailers:
            if not k or not k.isascii() or k.strip(_TOKEN):
                raise FormatError(f"trailer key {k[:40]!r}: use letters, digits and - only")
            if not _one_line(v):
                raise FormatError(f"trailer {k}: the value {v[:40]!r} holds a line break or "
                                  "another control character")
            lines.append(f"{TRAILER_PREFIX}{k.title()}: {v.strip()}")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def trailer_values(trailers: list[tuple[str, str]], key: str) -> list[str]:
    out = []
    for k, v in trailers:
        if k == key:
            out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def trailer(trailers: list[tuple[str, str]], key: str, default: str = "") -> str:
    for k, v in trailers:
        if k == key:
            return v
    return default
