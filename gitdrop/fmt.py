"""The on-repo text formats: a TOML subset, front-matter documents and trailers.

Pure and light to import because the pre-receive hook loads it on every push:
json (which pulls in re, enum and more, most of the hook's import time) is
imported only for values off the fast paths below, which give exactly what json
would. The TOML subset is `key = value` lines with JSON-compatible values
(basic strings, integers, true/false, arrays of those) and one level of
`[table]` headers; everything it writes is valid TOML.
"""

FRONT = "+++"
TRAILER_PREFIX = "Gitdrop-"


class FormatError(ValueError):
    pass


def _value(raw: str, where: str):
    raw = raw.strip()
    if raw == "true":
        return True
    if raw == "false":
        return False
    if raw.startswith("[") and raw.endswith("]"):
        inner = raw[1:-1].strip().rstrip(",")
        raw = "[" + inner + "]"
    value = _simple(raw)
    if value is _MISS:
        value = _array(raw) if raw.startswith("[") and raw.endswith("]") else _MISS
    try:
        if value is _MISS:
            import json
            value = json.loads(raw)
    except ValueError:
        raise FormatError(f"{where}: cannot read value {raw[:40]!r} "
                          "(use \"text\", 123, true/false or [\"a\", \"b\"])") from None
    if isinstance(value, float) or isinstance(value, dict) or value is None:
        raise FormatError(f"{where}: unsupported value {raw[:40]!r}")
    return value


_MISS = object()
_JSON_WS = " \t\n\r"


def _simple(tok: str):
    """json.loads(tok) for a plain string, a small integer or a boolean; else _MISS."""
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
    """json.loads(raw) for `[...]` of plain tokens; else _MISS."""
    inner = raw[1:-1]
    if not inner:
        return []
    out = []
    for piece in inner.split(","):
        v = _simple(piece.strip(_JSON_WS))
        if v is _MISS:
            return _MISS
        out.append(v)
    return out


def _plain(s: str) -> bool:
    """No control character below a space (for ASCII, isprintable says it at C speed)."""
    return (s.isascii() and s.isprintable()) or all(ch >= " " for ch in s)


def loads_toml(text: str) -> dict:
    data: dict = {}
    table = data
    tname = None
    first: dict = {}    # (table, key) -> the line that set it
    tables: dict = {}   # table -> the line of its header
    for n, line in enumerate(text.split("\n"), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("[") and s.endswith("]") and "=" not in s:
            tname = s[1:-1].strip().strip('"')
            if tname in tables:
                raise FormatError(f"line {n}: table [{tname}] appears twice (first on line "
                                  f"{tables[tname]}); put all its keys under one [{tname}] header")
            if tname in data:
                raise FormatError(f"line {n}: [{tname}] clashes with the key {tname!r} "
                                  f"on line {first[None, tname]}; rename one of them")
            tables[tname] = n
            table = data[tname] = {}
            continue
        key, eq, raw = s.partition("=")
        key = key.strip().strip('"')
        if not eq or not key:
            raise FormatError(f"line {n}: expected key = value, got {s[:40]!r}")
        if key in table:
            raise FormatError(f"line {n}: {key!r} is set twice (first on line "
                              f"{first[tname, key]}); keep only one of them")
        first[tname, key] = n
        table[key] = _value(raw, f"line {n} ({key})")
    return data


def _dump_value(v) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_dump_value(x) for x in v) + "]"
    if isinstance(v, int):
        return str(v)
    s = str(v)
    if '"' not in s and "\\" not in s and _plain(s):
        return '"' + s + '"'
    import json
    return json.dumps(s, ensure_ascii=False)


def _dump_key(k: str) -> str:
    if '"' not in k and "\\" not in k and all(" " <= ch <= "~" for ch in k):
        return '"' + k + '"'
    import json
    return json.dumps(k)


def dumps_toml(data: dict) -> str:
    out, tables = [], []
    for k, v in data.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            out.append(f"{k} = {_dump_value(v)}")
    for name, table in tables:
        out.append(f"\n[{name}]")
        out.extend(f"{_dump_key(k) if '/' in k else k} = {_dump_value(v)}"
                   for k, v in table.items())
    return "\n".join(out) + "\n"


def loads_doc(text: str) -> tuple[dict, str]:
    """A Markdown document with a `+++` TOML front-matter header."""
    if not text.startswith(FRONT + "\n"):
        raise FormatError("document must start with a '+++' line (TOML front matter)")
    end = text.find("\n" + FRONT, len(FRONT))
    if end < 0:
        raise FormatError("front matter is not closed by a '+++' line")
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
    message = message.replace("\r\n", "\n").strip("\n")
    subject, _, rest = message.partition("\n")
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


def format_message(subject: str, body: str, trailers: list[tuple[str, str]]) -> str:
    subject = " ".join(subject.split())
    parts = [subject]
    body = body.strip("\n")
    if body:
        parts.append(body)
    if trailers:
        parts.append("\n".join(f"{TRAILER_PREFIX}{k.title()}: {v}" for k, v in trailers))
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
