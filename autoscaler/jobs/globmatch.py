"""Gitignore-like globs matched in linear time: no regular expression, no backtracking.

``.spotrainignore`` patterns used to be translated to Python regular expressions, and ``re``
backtracks: a pattern like ``*a*a*a*a*a*a*b`` against a long name froze the API, the tick and every
other thread for minutes (issue 21, finding 2). Here a pattern is a list of tokens run as a
nondeterministic automaton over the path, all live states at once: a match costs at most
``tokens x characters`` steps, whatever the pattern, and the caller can count those steps against a
budget (``Glob.match(..., budget)``).

Tokens: a literal character; ``?`` (one character, not ``/``); ``*`` (any run without ``/``); ``**``
(any run, ``/`` included); ``**/`` (zero or more whole directories: ``(.*/)?``). Unlike ``re``'s
``.``, every token's "any character" includes a newline, so a name holding one is matched like any
other (finding 10: such a file escaped ``*.pem``).
"""

from __future__ import annotations

import dataclasses

from autoscaler.errors import SpotrainError

LIT, ONE, STAR, DSTAR, SEGS = range(5)


class BudgetExceeded(SpotrainError):
    """The matching steps allowed to a caller were used up."""


@dataclasses.dataclass
class Budget:
    """Matching steps left (one step: one live state meeting one character)."""

    steps: int

    def spend(self, n: int) -> None:
        self.steps -= n
        if self.steps < 0:
            raise BudgetExceeded


def tokenize(pattern: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append((SEGS, ""))
            i += 3
        elif pattern.startswith("**", i):
            out.append((DSTAR, ""))
            i += 2
        elif pattern[i] == "*":
            if not out or out[-1][0] != STAR:  # "**" is handled above; "* *" runs collapse
                out.append((STAR, ""))
            i += 1
        elif pattern[i] == "?":
            out.append((ONE, ""))
            i += 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out.append((LIT, pattern[i + 1]))
            i += 2
        else:
            out.append((LIT, pattern[i]))
            i += 1
    return out


@dataclasses.dataclass(frozen=True)
class Glob:
    """A compiled pattern; ``anchored``: matched from the path's start, else at any directory depth."""

    tokens: tuple[tuple[int, str], ...]
    # The literal characters the pattern ends with: a path without them cannot match (checked first,
    # at no cost to the budget: most patterns, ``*.log``, ``__pycache__``, end with some).
    tail: str = ""

    @classmethod
    def compile(cls, pattern: str, *, anchored: bool) -> Glob:
        body = tokenize(pattern)
        tail = []
        for kind, lit in reversed(body):
            if kind != LIT:
                break
            tail.append(lit)
        return cls(tuple(body if anchored else [(SEGS, ""), *body]), "".join(reversed(tail)))

    def _closure(self, states: set[int]) -> set[int]:
        """States reachable without a character: past ``*``, ``**`` and ``**/`` (they may match nothing)."""
        out, todo = set(states), list(states)
        while todo:
            i = todo.pop()
            if 0 <= i < len(self.tokens) and self.tokens[i][0] in (STAR, DSTAR, SEGS) and i + 1 not in out:
                out.add(i + 1)
                todo.append(i + 1)
        return out

    def match(self, path: str, budget: Budget | None = None) -> bool:
        """Whether the whole of ``path`` matches. States are token indexes; ``-1 - i`` is "inside the
        directories of the ``**/`` at ``i``" (consumed something, must still end with ``/``)."""
        if not path.endswith(self.tail):
            return False
        tokens, n = self.tokens, len(self.tokens)
        states = self._closure({0})
        for ch in path:
            if budget is not None:
                budget.spend(len(states))
            nxt: set[int] = set()
            for i in states:
                if i < 0:  # inside a "**/": a "/" ends a directory (maybe the last), else go on
                    j = -1 - i
                    if ch == "/":
                        nxt.add(j)
                        nxt.add(j + 1)
                    else:
                        nxt.add(i)
                    continue
                if i >= n:
                    continue
                kind, lit = tokens[i]
                if kind == LIT:
                    if ch == lit:
                        nxt.add(i + 1)
                elif kind == ONE:
                    if ch != "/":
                        nxt.add(i + 1)
                elif kind == STAR:
                    if ch != "/":
                        nxt.add(i)
                elif kind == DSTAR:
                    nxt.add(i)
                else:  # SEGS
                    if ch == "/":
                        nxt.add(i)
                        nxt.add(i + 1)
                    else:
                        nxt.add(-1 - i)
            if not nxt:
                return False
            states = self._closure(nxt)
        return n in states


__all__ = ["Budget", "BudgetExceeded", "Glob", "tokenize"]
