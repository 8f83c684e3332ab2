"""Problems as a student reads them: each said once, the causes first, their consequences after.

The same mistake usually shows in many places (every rank's gradients, every configuration): a
problem is said once, with the places it also showed in. Problems are the same when they have the
same `gist`, or the same words once their numbers are left out ("rank 1 ... rank 2" and "rank 2 ...
rank 3"). Consequences (problems that follow from another, judge/failures.py) come after every cause,
under a heading that says so. The visible checks and the grader's feedback both print this.
"""
from __future__ import annotations

import re
import textwrap

from lab_src.judge.problems import Problem

_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
CONSEQUENCES = "What that caused (it follows from the problem above: fix that first):"
WIDTH = 110          # long lines wrap, so that a page without horizontal scrolling shows all of a message


def same(p: Problem) -> tuple:
    """What makes two problems the same one (for a consequence, its first line: what it is, not the
    list of every rank it left waiting)."""
    text = p.message.splitlines()[0] if p.consequence else p.message
    return p.exercise, p.consequence, p.gist or _NUMBER.sub("#", text)


def grouped(problems: list[Problem]) -> list[list[Problem]]:
    """The problems in groups of the same one, causes first, each group where it first showed."""
    groups: dict[tuple, list[Problem]] = {}
    for p in sorted(problems, key=lambda p: p.consequence):     # stable: keeps each kind's order
        groups.setdefault(same(p), []).append(p)
    return list(groups.values())


def counts(problems: list[Problem]) -> tuple[int, int]:
    """(distinct causes, distinct consequences)."""
    groups = grouped(problems)
    causes = sum(1 for g in groups if not g[0].consequence)
    return causes, len(groups) - causes


def summary(problems: list[Problem], limit: int = 12) -> str:
    """The problems as one text: each said once, causes first (`render`'s lines)."""
    return "\n".join(render(problems, limit))


def render(problems: list[Problem], limit: int = 12) -> list[str]:
    """The lines to print: each problem once, with where else it showed; the first `limit` causes, then
    the first `limit` consequences under their heading."""
    groups = grouped(problems)
    causes = [g for g in groups if not g[0].consequence]
    caused = [g for g in groups if g[0].consequence]
    lines = []
    for group in causes[:limit]:
        lines += describe(group)
    if len(causes) > limit:
        lines.append(f"... and {len(causes) - limit} more")
    if caused:
        pad = "  " if lines else ""
        if lines:
            lines.append(CONSEQUENCES)
        for group in caused[:limit]:
            lines += [pad + line for line in describe(group)]
        if len(caused) > limit:
            lines.append(f"{pad}... and {len(caused) - limit} more")
    return [part for line in lines for part in wrap(line)]


def wrap(line: str) -> list[str]:
    """A long line as lines of at most WIDTH characters, the continuations indented under it."""
    lead = line[:len(line) - len(line.lstrip())]
    return textwrap.wrap(line, WIDTH, subsequent_indent=lead + "    ", break_long_words=False,
                         break_on_hyphens=False) or [line]


def describe(group: list[Problem]) -> list[str]:
    first = group[0]
    others = [o for o in group[1:] if o != first]       # a repeat of the same problem (a case's failure in each of
    #                                                     its items) showed nowhere else
    lines = str(first).splitlines()
    if not others:
        return lines
    if all(not o.where and not o.case for o in others):     # nothing to tell them apart but their words
        few = [o.message.splitlines()[0] for o in others[:4]]
        more = f"; and {len(others) - 4} more" if len(others) > 4 else ""
        return lines + ["    also: " + "; ".join(few) + more]
    places: dict[str, set] = {}
    for o in others:
        places.setdefault(o.case, set()).add(o.rank)
    said = []
    for case, ranks in places.items():
        named = sorted(r for r in ranks if r is not None)
        where = (f"rank{'s' if len(named) > 1 else ''} {', '.join(map(str, named))}" if named else "")
        if None in ranks and named:
            where += " and the whole run"
        elif not named:
            where = "the whole run"
        said.append(where + (f" ({case})" if case and case != first.case else
                             (" (the same run)" if case else "")))
    return lines + [f"    also on {'; '.join(said)}"]
