"""The on-repo formats against the reference readers: whatever gitdrop's TOML subset
accepts, tomllib reads with the same values; whatever gitdrop writes in a commit
message, git reads with the same trailers."""

import pytest

from gitdrop import fmt


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
