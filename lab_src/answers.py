"""Where each exercise's answer comes from, and loading it.

An answer is a small module file holding one function. The source of each exercise's answer is,
in order of precedence:

1. a mapping installed with `use_answers({...})` (the torchrun worker installs one per check case;
   the grader maps the graded exercise to the student's file and every other one to the reference);
2. the JSON mapping file named by the environment variable ``LAB_ANSWERS``;
3. ``<LAB_ANSWERS_DIR or ./answers>/qNN_<function>.py``, written by the notebook's ``%%answer`` cell;
   for an exercise of an earlier assignment, ``../<its assignment>/answers/qNN_<function>.py`` when the
   answers folder has none (the assignments' folders side by side, as a student fetches them).

An exercise with no source resolves to its stub, which raises `NotImplementedError` naming the
notebook to finish. Modules are loaded by path (never from `sys.path`), and reloaded when the file
changes, so re-running an answer cell takes effect in the next check.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import os
import sys
from pathlib import Path

from lab_src.registry import MODULES, exercise

_installed: list[dict[str, str | None]] = []
_cache: dict[tuple, object] = {}
_failed: dict[tuple, str] = {}      # a file that failed to load, and why: it is not run again until it changes


class AnswerError(RuntimeError):
    """An answer file exists but cannot be used: it fails to load, or its function is missing or misnamed."""


class StubCalled(NotImplementedError):
    """An exercise was called before its answer exists (or while it is still the release stub)."""


@contextlib.contextmanager
def use_answers(mapping: dict[str, str | None]):
    """Within the block, answers come from `mapping` (exercise ID -> file path, or None for the stub)."""
    _installed.append(dict(mapping))
    try:
        yield
    finally:
        _installed.pop()


def answers_dir() -> Path:
    return Path(os.environ.get("LAB_ANSWERS_DIR") or "answers").resolve()


def source_of(qid: str) -> str | None:
    """The file the answer to `qid` is loaded from, or None when the stub stands in."""
    ex = exercise(qid)
    if _installed:
        return _installed[-1].get(ex.id)
    mapping_file = os.environ.get("LAB_ANSWERS")
    if mapping_file:
        return json.loads(Path(mapping_file).read_text()).get(ex.id)
    path = answers_dir() / ex.answer_file
    if not path.exists():
        path = earlier_answers_dir(ex.assignment) / ex.answer_file
    return str(path) if path.exists() else None


def earlier_answers_dir(assignment: str) -> Path:
    """Where the answers of `assignment` are when the student works in another assignment's folder beside it."""
    return answers_dir().parent.parent / assignment / "answers"


def elsewhere(qid: str) -> str:
    """' of the assignment A (../A/)' when qid's notebook is in another assignment than the one worked in."""
    ex = exercise(qid)
    here = answers_dir().parent.name
    if here in MODULES and here != ex.assignment:
        return f" of the assignment {ex.assignment} (../{ex.assignment}/, finish it first)"
    return ""


def sources(qids) -> dict[str, str | None]:
    return {q: source_of(q) for q in qids}


def stub_message(qid: str, caller: str | None = None) -> str:
    ex = exercise(qid)
    who = f"{caller} needs your answer to {ex.id} ({ex.function})" if caller and caller != ex.id \
        else f"{ex.id} {ex.function}() has no answer yet"
    return (f"{who}: open {ex.notebook}{elsewhere(qid)}, write the function in its answer cell (the one starting "
            f"with %%answer {ex.id}) and run that cell.")


def load(qid: str):
    """The student's (or reference) function for `qid`, or None if there is no answer file."""
    ex = exercise(qid)
    path = source_of(qid)
    if path is None:
        return None
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise AnswerError(f"{ex.id}: the answer file {p} is missing") from None
    key = (str(p), st.st_mtime_ns, st.st_size)
    if key in _cache:
        return _cache[key]
    if key in _failed:
        raise AnswerError(_failed[key])
    name = f"lab_answers.{ex.id}_{abs(hash(key)):x}"
    spec = importlib.util.spec_from_file_location(name, p)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        _failed[key] = f"{ex.id}: running your answer cell failed: {type(e).__name__}: {e}"
        raise AnswerError(_failed[key]) from e
    fn = getattr(module, ex.function, None)
    if not callable(fn):
        defined = [n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == name]
        hint = f" (it defines: {', '.join(defined)})" if defined else ""
        _failed[key] = f"{ex.id}: your answer cell must define a function named {ex.function}{hint}"
        raise AnswerError(_failed[key])
    _cache[key] = fn
    return fn


def check_signature(qid: str, fn, contract) -> None:
    """Raise AnswerError unless `fn` takes the contract's parameters, by name and in order."""
    want = list(inspect.signature(contract).parameters.values())
    got = list(inspect.signature(fn).parameters.values())
    ok = len(got) >= len(want) and all(g.name == w.name for g, w in zip(got, want)) \
        and all(g.default is not inspect.Parameter.empty for g in got[len(want):])
    if not ok:
        ex = exercise(qid)
        raise AnswerError(f"{ex.id}: {ex.function} must take ({_params(want)}); yours takes ({_params(got)}). "
                          f"Other code calls it with these names, so keep the signature of the answer cell.")


def _params(params) -> str:
    return ", ".join(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                     for p in params)
