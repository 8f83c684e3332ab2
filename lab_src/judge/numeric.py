"""Numeric answers written in an answer cell, read without running it.

q14 asks for a prediction as numbers: a function of the answer cell that returns a dict literal (a
function, so that nbgrader's release can replace its body by a stub), or a dict assigned to a name,

    def predicted_bytes():
        return {"pipeline": 2 * 2 * 3 * 8192, "data_parallel": ..., "tied": ...}

The values may be numbers or arithmetic on numbers (+ - * / // ** and parentheses); anything else (a
name, a call) is refused, so that the answer is a prediction, not a measurement. The text is parsed
with `ast` and evaluated here, never executed: the grader reads it from the submitted answer file.
Given the prediction's keys, a message about a malformed answer spells out the form it takes
(`return_form`), so that a student who returned a list learns the keys.

How a graded prediction is judged is said here once, for the hidden tests and the visible checks alike:
`TOLERANCE` and `matches`; `verdict_lines` is what a visible check prints, each number right or wrong
beside the figure it is judged against.
"""
from __future__ import annotations

import ast
import operator
from collections.abc import Iterable

TOLERANCE = 0.005       # a graded prediction within half a percent of its figure counts (q19, q21, q22: hidden tests, checks)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


class NotANumber(ValueError):
    pass


def evaluate(node: ast.AST) -> float:
    """The value of a numeric expression made of numbers and arithmetic only."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = evaluate(node.left), evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise NotANumber("a power that large is not a byte count")
        try:
            return _OPS[type(node.op)](left, right)
        except ZeroDivisionError:
            raise NotANumber("a division by zero") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](evaluate(node.operand))
    raise NotANumber(f"`{ast.unparse(node)}` is not a number or arithmetic on numbers")


def return_form(keys: Iterable[str]) -> str:
    """The form a prediction's function returns, its keys spelled out: `return {"fc1": ..., "fc2": ...}`."""
    return "`return {" + ", ".join(f'"{k}": ...' for k in keys) + "}`"


def read_numbers(source: str, name: str, keys: Iterable[str] | None = None) -> dict[str, float]:
    """The dict of numbers that the function `name` of `source` returns (its body: an optional docstring
    and `return {...}`), or that is assigned to `name`, at the top level of `source`.

    Raises NotANumber (with a message for the student) when it is missing or not made of numbers; given the
    prediction's `keys`, the message shows the form the answer takes with those keys."""
    form = return_form(keys) if keys is not None else None
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise NotANumber(f"the answer does not parse: {e}") from None
    found = None
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = node.value
        elif isinstance(node, ast.FunctionDef) and node.name == name:
            found = _returned(node, form)
    if found is None:
        raise NotANumber(f"no function {name}() at the top level of the answer"
                         + (f": write `def {name}():` with {form}" if form else ""))
    if not isinstance(found, ast.Dict):
        if form:
            raise NotANumber(f"{name}() must return a dict with these keys, {form}, a number for each")
        raise NotANumber(f"{name} must give a dict of numbers, like {{\"pipeline\": 1024, ...}}")
    out = {}
    for key, value in zip(found.keys, found.values):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            raise NotANumber(f"the keys of {name} must be strings")
        try:
            out[key.value] = evaluate(value)
        except NotANumber as e:
            raise NotANumber(f"{name}[{key.value!r}]: {e}") from None
    return out


def _returned(fn: ast.FunctionDef, form: str | None = None) -> ast.AST:
    """What `fn` returns, when its body is only that (after a docstring); else why not, as NotANumber (with
    `form`, the return its answer takes, when the caller knows its keys)."""
    body = [n for n in fn.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return body[0].value
    if any(isinstance(n, ast.Raise) for n in body):
        raise NotANumber(f"{fn.name}() is still the stub: write your prediction there"
                         + (f", as {form} with a number for each" if form else ""))
    if form:
        raise NotANumber(f"{fn.name}() must be just {form}, with numbers: a prediction, not a computation")
    raise NotANumber(f"{fn.name}() must be just `return {{...}}` with numbers: a prediction, not a computation")


def matches(got: float, want: float, tolerance: float = TOLERANCE) -> bool:
    """Whether a predicted number counts: within `tolerance` of `want`, relatively (tolerance 0: exactly)."""
    return abs(got - want) <= tolerance * abs(want)


def number(value: float) -> str:
    """A prediction's number as the checks print it: 1,205,760, 16, 0.25."""
    return f"{value:,.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:.4g}"


def verdict_lines(got: dict, want: dict, beside: str, tolerance: float = TOLERANCE,
                  indent: str = "    ") -> list[str]:
    """What a visible check prints of a graded prediction: per key of `want`, the number predicted, right or
    wrong as the grader judges it (`matches` with `tolerance`), and a wrong one beside the figure (`beside`
    names it: "measured", "it is"); then the keys `got` has that are not graded."""
    width = max(len(k) for k in want)
    lines = []
    for k, v in want.items():
        if k not in got:
            lines.append(f"{indent}{k:<{width}}  {'missing':>12}  write it as \"{k}\": ... (graded)")
        elif matches(got[k], v, tolerance):
            lines.append(f"{indent}{k:<{width}}  {number(got[k]):>12}  right")
        else:
            lines.append(f"{indent}{k:<{width}}  {number(got[k]):>12}  wrong: {beside} {number(v)}")
    extra = [k for k in got if k not in want]
    if extra:
        lines.append(f"{indent}not graded: {', '.join(repr(k) for k in extra)} (the keys are "
                     f"{', '.join(want)})")
    return lines
