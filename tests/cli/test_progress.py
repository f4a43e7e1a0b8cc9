"""maxqctl's progress line (maxq_raft/cli/progress.py), with a fake change and fake statuses."""

from __future__ import annotations

import io
import threading

import pytest

from maxq_raft.cli import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def status(groups: dict[str, tuple[str | None, list[str]]]) -> dict:
    """{group: (leader, members)} in the admin API's /api/cluster/status shape."""
    return {
        "groups": [
            {"group": name, "leader": leader, "members": [{"node": m} for m in members]}
            for name, (leader, members) in groups.items()
        ]
    }


def test_describes_how_far_each_change_has_got() -> None:
    s = status({"meta": ("n1", ["n1", "n2", "n4"]), "shard-0": ("n4", ["n1", "n2"]), "shard-1": ("n2", ["n1", "n2"])})
    assert progress.groups_with_member(s, "n4") == "1/3 groups have n4"
    assert progress.groups_without_member(s, "n4") == "2/3 groups without n4"
    assert progress.groups_led_by(s, "n4", "all") == "1/3 groups led by n4"
    assert progress.groups_led_by(s, "n2", "shard-1") == "1/1 groups led by n2"
    assert progress.groups_with_member({}, "n4") == "0/0 groups have n4"


def steps(answers: list[str], released: threading.Event):
    """A status reader that says each of `answers` in turn, then lets the change finish."""
    said = iter(answers)

    def read() -> dict:
        try:
            return {"text": next(said)}
        except StopIteration:
            released.set()
            return {"text": answers[-1]}

    return read


def test_not_a_terminal_prints_a_line_when_the_progress_changes() -> None:
    out = io.StringIO()
    released = threading.Event()
    value = progress.wait_with_progress(
        lambda: released.wait(5) and "done",
        steps(["1/3", "1/3", "2/3"], released),
        lambda s: s["text"],
        "adding n4",
        out,
        poll_every_s=0.01,
    )
    assert value == "done"
    lines = out.getvalue().splitlines()
    assert [line.rsplit(",", 1)[0] for line in lines] == ["adding n4: 1/3", "adding n4: 2/3"], lines
    assert all(line.endswith(" s") for line in lines)


def test_a_terminal_line_is_rewritten_in_place_and_cleared_at_the_end() -> None:
    out = Terminal()
    released = threading.Event()
    progress.wait_with_progress(
        lambda: released.wait(5), steps(["1/3", "2/3"], released), lambda s: s["text"], "adding n4", out, 0.01
    )
    text = out.getvalue()
    assert "\n" not in text
    assert "\radding n4: 1/3, 0 s" in text and "\radding n4: 2/3, 0 s" in text
    assert text.endswith("\r")  # the last write blanks the line and returns to its start
    assert text.rstrip("\r").split("\r")[-1].strip() == ""


def test_an_unreadable_status_keeps_waiting_and_the_change_error_is_raised() -> None:
    out = io.StringIO()
    calls = 0

    def unreadable() -> dict:
        nonlocal calls
        calls += 1
        raise OSError("the node is busy")

    def change() -> None:
        while calls < 3:
            threading.Event().wait(0.01)
        raise RuntimeError("node answered 409")

    with pytest.raises(RuntimeError, match="409"):
        progress.wait_with_progress(change, unreadable, lambda s: "never", "removing n4", out, poll_every_s=0.01)
    assert "never" not in out.getvalue()


def test_a_change_that_answers_at_once_prints_nothing() -> None:
    out = Terminal()
    assert progress.wait_with_progress(lambda: 7, lambda: {}, lambda s: "x", "adding n4", out, 0.5) == 7
    assert out.getvalue() == ""
