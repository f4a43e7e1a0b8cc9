"""Policy patterns (machines/policy_pattern.py): linear-time matching, RabbitMQ's search
semantics, and clear refusals. A backtracking engine runs `^(a+)+$` against the names below for
hours; the module's timeout (pytest-timeout) is what would catch a regression to one."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maxq_raft.machines import metadata as md
from maxq_raft.machines.policy_pattern import PATTERN_CHARS_MAX, PatternError, compile_pattern
from maxq_raft.machines.queue_types import Rejected

pytestmark = pytest.mark.timeout(30)

# (pattern, name, matches?): each takes a backtracking engine exponential time in the name's
# length when it does not match; the answers are worked out by hand, not by `re` (it would hang).
CATASTROPHIC = [
    (r"^(a+)+$", "a" * 40 + "!", False),
    (r"^(a+)+$", "a" * 10_000, True),
    (r"^(a|a)*$", "a" * 40 + "!", False),
    (r"^(a|aa)+$", "a" * 41 + "b", False),
    (r"(x+x+)+y", "x" * 255, False),
    (r"(x+x+)+y", "x" * 254 + "y", True),
    (r"^(\w+\s?)*$", "word " * 50 + "!", False),
]


@pytest.mark.parametrize("pattern, name, expected", CATASTROPHIC)
def test_catastrophic_patterns_are_matched_without_backtracking(pattern, name, expected):
    assert compile_pattern(pattern).matches(name) is expected


def test_search_semantics_as_rabbitmq():
    # re:run(Name, Pattern): a match anywhere unless the pattern anchors itself
    assert compile_pattern(r"^amq\.").matches("amq.gen-1")
    assert not compile_pattern(r"^amq\.").matches("x.amq.gen")
    assert compile_pattern("orders").matches("my-orders-queue")
    assert compile_pattern("").matches("anything")
    assert compile_pattern(".*").matches("")
    assert compile_pattern("^é").matches("élan")


@pytest.mark.parametrize(
    "pattern, reason",
    [
        (r"(a)\1", "back-references are not supported"),
        (r"(?=a)b", "look-around and back-references are not supported"),
        ("(", "is not a valid regular expression"),
        ("x" * (PATTERN_CHARS_MAX + 1), "characters long"),
        ("\ud800", "not valid Unicode"),
        (5, "must be a string"),
    ],
)
def test_refused_patterns_say_why(pattern, reason):
    with pytest.raises(PatternError) as refused:
        compile_pattern(pattern)
    assert reason in str(refused.value)


def test_the_machine_refuses_what_the_pattern_module_refuses():
    command = md.SetPolicy("/", "p", r"(?<=a)b", {"max-length": 1}, 0, "all")
    record = md.policy_record(command)
    assert isinstance(record, Rejected) and record.reply_code == 406
    assert record.reply_text.startswith("Validation failed\n\n")
    ok = md.policy_record(md.SetPolicy("/", "p", r"^q\d+$", {"max-length": 1}, 0, "queues"))
    assert not isinstance(ok, Rejected) and ok.regex.matches("q12") and not ok.regex.matches("q1x")


PIECES = st.sampled_from(["a", "b", ".", "a*", "b+", "(a|b)", "[ab]", "[^a]", "a?", r"\.", "(ab)+", "x{1,3}"])


@settings(max_examples=300, deadline=None)
@given(
    anchors=st.tuples(st.booleans(), st.booleans()),
    pieces=st.lists(PIECES, min_size=0, max_size=6),
    names=st.lists(st.text(alphabet="abx.", max_size=12), min_size=1, max_size=8),
)
def test_same_answers_as_a_backtracking_engine_on_ordinary_patterns(anchors, pieces, names):
    pattern = ("^" if anchors[0] else "") + "".join(pieces) + ("$" if anchors[1] else "")
    compiled = compile_pattern(pattern)
    for name in names:
        assert compiled.matches(name) is (re.search(pattern, name) is not None), (pattern, name)
