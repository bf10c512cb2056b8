"""The on-repo formats against the reference readers: whatever gitdrop's TOML subset
accepts, tomllib reads with the same values; whatever gitdrop writes in a commit
message, git reads with the same trailers."""

import pathlib
import shutil
import subprocess
import sys
import tomllib    # the tests' reference reader: fmt itself never imports it

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gitdrop import fmt

ROOT = pathlib.Path(__file__).resolve().parent.parent


# --- duplicates: TOML forbids them; last-one-wins would let a line hide another ---

def test_a_key_set_twice_is_refused():
    with pytest.raises(fmt.FormatError) as e:
        fmt.loads_toml('id = "4"\nstate = "completed"\ntitle = "t"\nstate = "pending"\n')
    assert "line 4" in str(e.value) and "state" in str(e.value) and "line 2" in str(e.value)


def test_a_key_set_twice_in_a_table_is_refused():
    with pytest.raises(fmt.FormatError) as e:
        fmt.loads_toml('[settings]\nloop_cap = 1\nloop_cap = 0\n')
    assert "line 3" in str(e.value) and "loop_cap" in str(e.value)


def test_a_table_opened_twice_is_refused():
    with pytest.raises(fmt.FormatError) as e:
        fmt.loads_toml('name = "r"\n[settings]\nloop_cap = 1\n[leads]\n'
                       'core = "core/juno"\n[settings]\nloop_window = 2\n')
    assert "line 6" in str(e.value) and "[settings]" in str(e.value) and "line 2" in str(e.value)


def test_a_duplicate_in_front_matter_is_refused():
    with pytest.raises(fmt.FormatError, match="state"):
        fmt.loads_doc('+++\nstate = "completed"\nstate = "pending"\n+++\nbody\n')


def test_the_same_key_in_two_tables_is_fine():
    assert fmt.loads_toml('a = 1\n[x]\na = 2\n[y]\na = 3\n') == \
        {"a": 1, "x": {"a": 2}, "y": {"a": 3}}


# --- what the TOML subset accepts, tomllib reads the same ---------------------


def same(a, b) -> bool:
    """Equal values of equal types all the way down (True == 1 in Python, not here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def toml_agrees(text: str):
    """If fmt reads `text`, tomllib reads it too, to the same values."""
    try:
        mine = fmt.loads_toml(text)
    except fmt.FormatError:
        return
    try:
        ref = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise AssertionError(f"fmt reads {text!r} as {mine!r}; tomllib refuses it: {e}")
    assert same(mine, ref), f"{text!r}: fmt reads {mine!r}, tomllib {ref!r}"


WS = st.sampled_from(["", " ", "  ", "\t", " \t", "\r", "\x0b", "\x0c", "\xa0", "\u3000",
                      "\x1f", "\ufeff"])
BARE_KEY = st.text(st.sampled_from(list("abzAZ09_-")), min_size=1, max_size=5)
KEY_CHUNK = st.one_of(BARE_KEY, st.sampled_from(
    [".", "a.b", " a b", "a.", ".a", "$", "é", "a\x00", "'a'", '"a', 'a"', "a\\", "#", "=", ""]))
STR_PIECE = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters='"\\'), max_size=3),
    st.sampled_from(["\\n", "\\t", "\\b", "\\f", "\\r", '\\"', "\\\\", "\\/", "\\e", "\\x41",
                     "\\u0041", "\\u00e9", "\\u0000", "\\u001f", "\\u007f", "\\ud800", "\\udfff",
                     "\\ud83d\\ude00", "\\U0001F600", "\\U00110000", "\\u12", "\\uGGGG",
                     "\\ ", "\\", "\t", "\x00", "\x1f", "\x7f", "\x80", "\x9f", "\u2028",
                     "\ud800", "#", "'", '"', '""', "=", "[", "]", ","]))
STRING = st.lists(STR_PIECE, max_size=4).map(lambda xs: '"' + "".join(xs) + '"')
QUOTED_KEY = STRING
KEY = st.one_of(BARE_KEY, KEY_CHUNK, QUOTED_KEY,
                st.tuples(KEY_CHUNK, KEY_CHUNK).map(".".join),
                st.tuples(QUOTED_KEY, st.sampled_from([".", " . "]), BARE_KEY).map("".join))
NUMBER = st.one_of(
    st.integers(-2**70, 2**70).map(str),
    st.integers(-9999, 9999).map(str),
    st.tuples(st.sampled_from(["", "-", "+", "--", "- "]),
              st.sampled_from(["0", "00", "01", "7", "1_000", "0x10", "0o7", "0b1", "1.5",
                               "1e3", "1E3", "inf", "nan", "9223372036854775807",
                               "9223372036854775808", "١٢", "²", "1979-05-27"]))
    .map("".join))
SCALAR = st.one_of(STRING, NUMBER, st.sampled_from(
    ["true", "false", "True", "null", "'lit'", "''", '"""x"""', "'''x'''", "{}", "{a = 1}",
     "tru", "truex", "true1", "-"]))


def _array(inner):
    seps = st.sampled_from([", ", ",", " , ", ",\t", ",,", " ", ",\r", ""])
    return st.tuples(st.sampled_from(["[", "[ ", "[\t"]), st.lists(inner, max_size=4),
                     st.lists(seps, min_size=4, max_size=4),
                     st.sampled_from(["]", ",]", ", ]", " ]", ",,]", "", "]]"])).map(
        lambda t: t[0] + "".join(v + (t[2][i] if i < len(t[1]) - 1 else "")
                                 for i, v in enumerate(t[1])) + t[3])


VALUE = st.recursive(SCALAR, _array, max_leaves=6)
COMMENT = st.sampled_from(["", "", " # c", "# c", " #", " # \t tab", " # \x00", " # \x7f",
                           " # é", " # \x1f", " #\r"])
PAIR = st.tuples(WS, KEY, WS, st.sampled_from(["=", "=", "", "==", ":"]), WS, VALUE, WS,
                 COMMENT).map("".join)
HEADER = st.one_of(
    st.tuples(WS, st.sampled_from(["[", "[ ", "[[", "[\t"]), KEY,
              st.sampled_from(["]", " ]", "]]", "", "] x"]), COMMENT).map("".join),
    st.sampled_from(["[", "]", "[]", "[ ]", "[.]", "[a.b]", "[ a . b ]", '["x"]', '["a.b"]',
                     "['x']", '["\\u0078"]', "[x] = 1"]))
LINE = st.one_of(PAIR, PAIR, PAIR, HEADER, COMMENT, WS,
                 st.text(st.characters(codec="utf-8"), max_size=12))
# Lines mostly in the subset, so that most texts are read and their values compared.
GOOD_STR = st.lists(st.one_of(
    st.text(st.characters(codec="utf-8", min_codepoint=32, exclude_characters='"\\\x7f'),
            max_size=4),
    st.sampled_from(["\\n", '\\"', "\\\\", "\\t", "\\u00e9", "\\u0000", "\\u007F",
                     "\\uFFFF", "#", " # ", "=", "'", "[", "]", ",", "😀"])),
    max_size=4).map(lambda xs: '"' + "".join(xs) + '"')
GOOD_VALUE = st.recursive(
    st.one_of(GOOD_STR, st.integers(-2**63, 2**63 - 1).map(str),
              st.sampled_from(["true", "false", "-0", "0"])),
    lambda inner: st.tuples(st.lists(inner, max_size=3), st.sampled_from(["", ",", " ,"]),
                            st.sampled_from([", ", ",", " , ", ",\t"])).map(
        lambda t: "[" + t[2].join(t[0]) + (t[1] if t[0] else "") + "]"),
    max_leaves=5)
GOOD_KEY = st.one_of(st.text(st.sampled_from(list("abcxyzXY019_-")), min_size=1, max_size=6),
                     GOOD_STR)
GOOD_LINE = st.one_of(
    st.tuples(st.sampled_from(["", " ", "\t"]), GOOD_KEY, st.sampled_from([" = ", "=", "\t=  "]),
              GOOD_VALUE, st.sampled_from(["", "", " ", " # c", "\t#\tc é"])).map("".join),
    st.tuples(st.sampled_from(["[", "[ "]), GOOD_KEY, st.sampled_from(["]", " ]", "] # c"]))
    .map("".join))


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(GOOD_LINE, GOOD_LINE, GOOD_LINE, GOOD_LINE, GOOD_LINE, LINE),
                max_size=6),
       st.sampled_from(["\n"] * 6 + ["\r\n", "\r"]), st.sampled_from(["", "\n", "\r\n"]))
def test_what_the_subset_accepts_tomllib_reads_the_same(lines, eol, end):
    toml_agrees(eol.join(lines) + end)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(GOOD_LINE, min_size=1, max_size=8))
def test_lines_in_the_subset_read_as_tomllib_reads_them(lines):
    toml_agrees("\n".join(lines))


@settings(max_examples=500, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=40))
def test_random_text_the_subset_accepts_tomllib_reads_the_same(text):
    toml_agrees(text)


HOSTILE = [
    # keys: dotted, spaced, quoted with escapes, not bare, missing
    'a.b = 1', '"a".b = 1', 'a . b = 1', 'a b = 1', 'a" = 1', '"a = 1', "'a' = 1",
    '"a\\u0062" = 1', '"a\\"b" = 1', 'é = 1', '$ = 1', '= 1', '"" = 1', 'a = ', 'a =', 'a',
    '"a=b" = 1', '\ufeffa = 1', 'a\x00 = 1', '"a" = 1\n"a" = 2', 'a = 1\n"a" = 2',
    '"a\\u0062" = 1\nab = 2', 'my.team = "my.team/x"', '"my.team" = "my.team/x"',
    # tables
    '[a.b]', '[ a . b ]', '["x"]\nb = 1', '["a.b"]', "['x']", '[]', '[', ']', '[ ]', '[[a]]',
    '["\\u0078"]\n[x]', '[a]\n["a"]', '[x] = 1', '[a] # c', '[a] x', 'a = 1\n[a]', '[a\\]',
    '[""]', '[ "a" ]', '[a]]',
    # strings
    'a = "\\/"', 'a = "\\ud800"', 'a = "\\udfff"', 'a = "\\ud83d\\ude00"', 'a = "\\U0001F600"',
    'a = "\\e"', 'a = "\\x41"', 'a = "\x7f"', 'a = "\x00"', 'a = "\x1f"', 'a = "\t"',
    'a = "\x80\x9f"', 'a = "\ud800"', 'a = "\\u0000"', 'a = "\\u007f"', "a = 'lit'",
    'a = """x"""', 'a = ""', 'a = "a # b"', 'a = "a" # c', 'a = "a"#c', 'a = "x" "y"',
    'a = "\\u00E9\\u00e9"', 'a = "\\', 'a = "x\\"',
    # integers
    'a = +1', 'a = -0', 'a = 01', 'a = -01', 'a = 1_000', 'a = 0x10', 'a = 9223372036854775807',
    'a = 9223372036854775808', 'a = -9223372036854775808', 'a = -9223372036854775809',
    'a = 99999999999999999999999', 'a = 1.5', 'a = 1e3', 'a = inf', 'a = ١٢', 'a = ²',
    'a = null', 'a = True', 'a = {}', 'a = 1979-05-27', 'a = -', 'a = truex', 'a = true1',
    # arrays
    'a = [1,]', 'a = [1, ]', 'a = [,]', 'a = [1,,]', 'a = [1,,2]', 'a = [1, "x"]',
    'a = [[1], ["x"]]', 'a = [1 2]', 'a = [', 'a = [1', 'a = [1]]', 'a = [1,\r2]',
    'a = [1,\x0b2]', 'a = [ "x" , "y" ]', 'a = [\t1\t]', 'a = [1, # c', 'a = [1] # c',
    'a = ["a,b", "c]"]', 'a = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]',
    # whitespace and comments
    'a = 1\r', 'a = 1\r\nb = 2', 'a = 1\rb = 2', 'a\t=\t1', 'a = 1\x0c', '\x0ca = 1',
    'a = 1\xa0', '\xa0a = 1', 'a = 1\u3000', 'a = 1 # c', 'a = 1 #\x00', '# \x00', '# \x7f',
    '# \t', '#\r', '\x0b', '\x1f', '\u3000', 'a = 1\n\x0c\nb = 2', 'a = 1 # c \t é',
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_constructs_are_refused_or_read_as_tomllib_reads_them(text):
    toml_agrees(text)


@pytest.mark.parametrize("text", [
    'a.b = 1', 'a b = 1', "'a' = 1", '"a\\u0062" = 1\nab = 2', '[a.b]', "['x']", '[]',
    '[[a]]', 'a = "\\/"', 'a = "\\ud800"', 'a = "\\ud83d\\ude00"', 'a = "\x7f"', 'a = [,]',
    'a = [1,,]', 'a = [1,\r2]', 'a = 1\r', 'a = 1\x0c', '\xa0a = 1', '# \x00',
    'a = 9223372036854775808', 'my.team = "my.team/x"', 'a =', '= 1', '[', 'a = 1\n\x0c'])
def test_what_it_read_otherwise_is_refused(text):
    """Each of these fmt used to accept: tomllib refuses it, or reads other values."""
    with pytest.raises(fmt.FormatError, match="line"):
        fmt.loads_toml(text)


@pytest.mark.parametrize("text, want", [
    ('a = 1 # a comment', {"a": 1}),
    ('state = "pending"       # see the state machine', {"state": "pending"}),
    ('[leads]   # each team\ncore = "core/juno"', {"leads": {"core": "core/juno"}}),
    ('"my.team" = "x"', {"my.team": "x"}),
    ('["x"]\n"a\\u0062" = "\\u00e9\\n"', {"x": {"ab": "é\n"}}),
    ('a = [1, "x", [true],]', {"a": [1, "x", [True]]}),
    ('a = -0\r\nb = -9223372036854775808\r\n', {"a": 0, "b": -2**63}),
    ('a = "# not a comment"', {"a": "# not a comment"}),
])
def test_what_toml_reads_alike_is_read(text, want):
    assert same(fmt.loads_toml(text), want) and same(tomllib.loads(text), want)


def test_a_key_with_a_dot_is_written_quoted():
    """A team name may hold a dot; written bare it would be a dotted key (a table)."""
    room = {"name": "r", "leads": {"my.team": "my.team/lead", "core": "core/juno"}}
    text = fmt.dumps_toml(room)
    assert '"my.team" = "my.team/lead"' in text and "\ncore = " in text
    assert same(tomllib.loads(text), room) and same(fmt.loads_toml(text), room)


def test_the_protocol_examples_read_as_tomllib_reads_them():
    """docs/PROTOCOL.md shows each file with comments after values: they are read."""
    doc = (ROOT / "docs" / "PROTOCOL.md").read_text()
    blocks = [b.split("```")[0] for b in doc.split("```toml\n")[1:]] + \
        [b.split("```")[0] for b in doc.split("```markdown\n")[1:]]
    assert len(blocks) >= 5
    for block in blocks:
        if block.startswith("+++\n"):
            header, _ = fmt.loads_doc(block)
            assert same(header, tomllib.loads(block.split("+++\n")[1]))
        else:
            assert same(fmt.loads_toml(block), tomllib.loads(block))


# --- what it writes, it and tomllib read back equal ---------------------------

TEXT = st.text(max_size=12)     # any text but lone surrogates (not UTF-8: never a file)
INT64 = st.integers(-2**63, 2**63 - 1)
LEAF = st.one_of(TEXT, INT64, st.booleans())
PLAIN = st.one_of(LEAF, st.lists(st.one_of(LEAF, st.lists(LEAF, max_size=2)), max_size=4))
TABLE = st.dictionaries(TEXT, PLAIN, max_size=4)
DATA = st.dictionaries(TEXT, st.one_of(PLAIN, PLAIN, TABLE), max_size=6)


@settings(max_examples=400, deadline=None)
@given(DATA)
def test_what_it_writes_reads_back_equal(data):
    text = fmt.dumps_toml(data)
    assert same(fmt.loads_toml(text), data)
    assert same(tomllib.loads(text), data)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(TEXT, st.one_of(PLAIN, TABLE), max_size=5), st.text(max_size=30))
def test_a_document_it_writes_reads_back_equal(header, body):
    got, body_back = fmt.loads_doc(fmt.dumps_doc(header, body))
    assert same(got, header)
    assert body_back == (body.rstrip("\n") + "\n" if body.rstrip("\n") else "")


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["a\x7fb", "😀", "\x00\x1f\t\n\r\"\\/", "\x80\x9f\u2028", "é" * 3]))
def test_hard_text_is_written_as_toml_reads_it(s):
    data = {s: s, "t": {s: [s, s]}}
    text = fmt.dumps_toml(data)
    assert same(tomllib.loads(text), data) and same(fmt.loads_toml(text), data)


# --- front matter: the header is what tomllib reads between the +++ lines -----

def reference_doc(text: str):
    """Split a document as a front-matter reader would: the first line of exactly
    +++ after the opening one closes the header. None if not a document."""
    lines = text.split("\n")
    if lines[0] != fmt.FRONT:
        return None
    for i, line in enumerate(lines[1:], 1):
        if line == fmt.FRONT:
            return tomllib.loads("\n".join(lines[1:i])), "\n".join(lines[i + 1:])
    return None


DOC_LINE = st.one_of(LINE, st.sampled_from(["+++", "+++ ", "++++", "+++x", " +++", "+++\r"]))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(DOC_LINE, max_size=5), st.lists(DOC_LINE, max_size=3),
       st.sampled_from(["+++\n", "+++\r\n", "+++ \n", "", "\n+++\n"]),
       st.sampled_from(["\n+++\n", "\n+++", "\n+++ \n", "\n++++\n", "\n+++\r\n", "\n"]))
def test_front_matter_is_read_as_a_toml_reader_reads_it(header, body, opener, closer):
    text = opener + "\n".join(header) + closer + "\n".join(body)
    try:
        mine = fmt.loads_doc(text)
    except fmt.FormatError:
        return
    ref = reference_doc(text)
    assert ref is not None, f"fmt reads {text!r}, which has no +++ header"
    assert same(mine[0], ref[0]), f"{text!r}: fmt reads {mine[0]!r}, tomllib {ref[0]!r}"
    assert mine[1] == ref[1]


# --- commit messages: git reads the trailers gitdrop writes as gitdrop reads them ---

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git_trailers(message: str, *options: str) -> list[tuple[str, str]]:
    """The Gitdrop-* trailers of `message` as git interpret-trailers reads them."""
    out = subprocess.run(["git", "-c", "trailer.separators=:", "interpret-trailers",
                          "--parse", *options], input=message.encode(), capture_output=True,
                         check=True).stdout.decode()
    got = []
    for line in out.split("\n"):
        key, _, value = line.partition(":")     # git prints "Key: value", as it is
        if key.lower().startswith(fmt.TRAILER_PREFIX.lower()):
            got.append((key[len(fmt.TRAILER_PREFIX):].lower(), value.removeprefix(" ")))
    return got


@pytest.mark.parametrize("trailers", [
    [("op", "send"), ("reply-to", "abc\nGitdrop-To: all")],
    [("to", "core/x\rGitdrop-To: all")], [("to", "a\x00b")], [("to", "a\x1b[2J")],
    [("to", "a\x7f")], [("to", "a\x85")], [("to", "a\u2028b\x00")],
    [("op: x\nGitdrop-To", "all")], [("a:b", "x")], [("a b", "x")], [("", "x")],
    [("tö", "x")], [("to\n", "x")]])
def test_no_trailer_value_or_key_can_add_a_line(trailers):
    with pytest.raises(ValueError, match="trailer"):
        fmt.format_message("s", "b", trailers)


def test_a_reply_to_cannot_turn_a_direct_message_into_a_note_to_all():
    with pytest.raises(fmt.FormatError):
        fmt.format_message("juno → kai: hi", "hi", [
            ("op", "send"), ("to", "core/kai"), ("reply-to", "x\nGitdrop-To: all")])


TRAILER_KEY = st.text(st.sampled_from(list("abcxyz019-")), min_size=1, max_size=8)
TRAILER_VALUE = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")),
                        max_size=12) | st.sampled_from(
    ["core/juno, all", "  padded  ", "a: b", "x #y", "@team", "", " ", "\u2028", "é\xa0"])
TRAILERS = st.lists(st.tuples(TRAILER_KEY, TRAILER_VALUE), min_size=1, max_size=4)
BODY_PIECE = st.one_of(
    st.text(st.characters(codec="utf-8", blacklist_characters="\x00\r"), max_size=10),
    st.sampled_from(["\n", "\n\n", "\n\n\n", " \n", "\n ", "---", "\n---\n", "# x", "\n#",
                     "Gitdrop-To: all", "\nGitdrop-To: all\n", "Note: x", "\tindented",
                     "Signed-off-by: a <a@b>", "(cherry picked from commit 1)"]))
BODY = st.lists(BODY_PIECE, max_size=5).map("".join)
SUBJECT = st.text(st.characters(codec="utf-8", blacklist_characters="\x00"), max_size=12)


@settings(max_examples=300, deadline=None)
@given(SUBJECT, BODY, TRAILERS)
def test_a_message_reads_back_as_written(subject, body, trailers):
    subject_back, body_back, trailers_back = fmt.parse_message(
        fmt.format_message(subject, body, trailers))
    assert trailers_back == [(k, v.strip()) for k, v in trailers]
    assert subject_back == " ".join(subject.split())
    assert body_back == body.strip("\n")


@needs_git
@settings(max_examples=60, deadline=None)
@given(SUBJECT, BODY, TRAILERS)
def test_git_reads_the_trailers_gitdrop_writes(subject, body, trailers):
    message = fmt.format_message(subject, body, trailers)
    mine = fmt.parse_message(message)[2]
    # As git reads a commit's message (git log --format=%(trailers) does the same).
    assert git_trailers(message, "--no-divider") == mine, repr(message)
    # Without --no-divider git reads the input as a patch mail and stops at a line
    # "---"; a message with no such line it reads the same way.
    if not any(line[:3] == "---" and line[3:4] in ("", " ", "\t", "\r")
               for line in message.split("\n")):
        assert git_trailers(message) == mine, repr(message)


@needs_git
def test_git_log_shows_the_trailers_of_a_commit_gitdrop_writes(tmp_path):
    """A body with a Markdown rule (---), comments and trailer-like lines of its own."""
    message = fmt.format_message("juno → kai: the plan", "First:\n---\n# not a comment\n\n"
                                 "Gitdrop-To: all\n\nNote: x",
                                 [("op", "send"), ("to", "core/kai"), ("reply-to", "abc")])
    git = ["git", "-C", str(tmp_path)]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q",
                          "--allow-empty", "--cleanup=verbatim", "-F", "-"],
                   input=message.encode(), check=True)
    shown = subprocess.run(git + ["log", "-1", "--format=%(trailers:only,unfold)"],
                           capture_output=True, check=True, text=True).stdout
    assert shown.split("\n")[:3] == ["Gitdrop-Op: send", "Gitdrop-To: core/kai",
                                     "Gitdrop-Reply-To: abc"]
    assert fmt.parse_message(message)[2] == [("op", "send"), ("to", "core/kai"),
                                             ("reply-to", "abc")]


def test_reading_imports_neither_re_nor_json_nor_tomllib():
    """The hook reads every pushed file: fmt's fast and slow paths stay light."""
    code = ("import sys; from gitdrop import fmt\n"
            "fmt.loads_doc('+++\\na = \"x\\\\n\" # c\\n[t]\\nb = [1, \"\\\\u00e9\"]\\n+++\\n')\n"
            "fmt.parse_message(fmt.format_message('s', 'b', [('op', 'send')]))\n"
            "print(sorted({'re', 'json', 'tomllib'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"
