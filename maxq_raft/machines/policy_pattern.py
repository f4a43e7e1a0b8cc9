"""Policy patterns, matched in time linear in the queue name, the same way on every member.

A policy's pattern is matched against every queue name of its vhost: at declare, at every policy
change, and when the metadata log is replayed or a snapshot loaded, on every member. With a
backtracking engine (Python's `re`, Erlang's PCRE) a pattern such as `^(a+)+$` against a
40-character name runs for hours, freezing the event loop of every member, again at each
restart. RE2 (google-re2) never backtracks: compiling bounds its memory and matching is linear.
It refuses what needs backtracking (back-references, look-around), which a name filter has no
use for; RabbitMQ's patterns in practice (`^amq\\.`, `^orders\\.`, `.*`) are all RE2 syntax.

The rule is the machine's, so members agree: a pattern this module refuses is refused when the
policy is set (406, before anything is stored) and skipped when met in a snapshot written by
an older version that accepted it (replaying its SetPolicy entry refuses it the same way).
A time bound would not do: members would disagree about what timed out.
"""

from __future__ import annotations

from dataclasses import dataclass

import re2

PATTERN_CHARS_MAX = 4096  # longer is refused; RE2's own memory bound catches huge expansions
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the client's error, reported in the reply
_OPTIONS.never_capture = True  # only "does it match": no submatch bookkeeping


@dataclass(frozen=True)
class PolicyPattern:
    """A compiled policy pattern: `matches(name)` is RabbitMQ's `re:run(Name, Pattern)` (a
    search anywhere in the name, as unanchored as the pattern is)."""

    source: str
    _compiled: object

    def matches(self, name: str) -> bool:
        return self._compiled.search(name) is not None  # type: ignore[attr-defined]


class PatternError(ValueError):
    """Why a pattern is refused, in words for the client."""


def compile_pattern(pattern: str) -> PolicyPattern:
    """The pattern compiled, or PatternError saying why it cannot be a policy pattern."""
    if type(pattern) is not str:
        raise PatternError("the pattern must be a string")
    if len(pattern) > PATTERN_CHARS_MAX:
        raise PatternError(f"the pattern is {len(pattern)} characters long; at most {PATTERN_CHARS_MAX} are allowed")
    try:
        pattern.encode("utf-8")
    except UnicodeEncodeError:
        raise PatternError("the pattern is not valid Unicode (a lone surrogate)") from None
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise PatternError(f"{pattern!r} is not a valid regular expression: {_reason(exc)}") from None
    return PolicyPattern(pattern, compiled)


def _reason(exc: Exception) -> str:
    detail = exc.args[0] if exc.args else str(exc)
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", "replace")
    if "invalid perl operator" in detail or "invalid escape sequence" in detail:
        detail += " (look-around and back-references are not supported: patterns are matched by RE2)"
    return str(detail)
