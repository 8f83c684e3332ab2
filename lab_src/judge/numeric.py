"""Numeric answers written in an answer cell, read without running it.

q14 asks for a prediction as numbers: a function of the answer cell that returns a dict literal (a
function, so that nbgrader's release can replace its body by a stub), or a dict assigned to a name,

    def predicted_bytes():
        return {"pipeline": 2 * 2 * 3 * 8192, "data_parallel": ..., "tied": ...}

The values may be numbers or arithmetic on numbers (+ - * / // ** and parentheses); anything else (a
name, a call) is refused, so that the answer is a prediction, not a measurement. The text is parsed
with `ast` and evaluated here, never executed: the grader reads it from the submitted answer file.
"""
from __future__ import annotations

import ast
import operator

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


def read_numbers(source: str, name: str) -> dict[str, float]:
    """The dict of numbers that the function `name` of `source` returns (its body: an optional docstring
    and `return {...}`), or that is assigned to `name`, at the top level of `source`.

    Raises NotANumber (with a message for the student) when it is missing or not made of numbers."""
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
            found = _returned(node)
    if found is None:
        raise NotANumber(f"no function {name}() at the top level of the answer")
    if not isinstance(found, ast.Dict):
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


def _returned(fn: ast.FunctionDef) -> ast.AST:
    """What `fn` returns, when its body is only that (after a docstring); else why not, as NotANumber."""
    body = [n for n in fn.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return body[0].value
    if any(isinstance(n, ast.Raise) for n in body):
        raise NotANumber(f"{fn.name}() is still the stub: write your prediction there")
    raise NotANumber(f"{fn.name}() must be just `return {{...}}` with numbers: a prediction, not a computation")
