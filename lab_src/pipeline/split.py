"""A backward split in two (zero bubble, q16): where the stage finds the student's two halves, and what it
says when they are used out of order.

`PipelineStage.backward_input` and `backward_weight` trace the two halves (I and W) and call the
functions the q16 answer cell defines beside `zero_bubble_step`:

    backward_input(stage, input_tensor, output_tensor, output_grad) -> (input_grad, kept)
    backward_weight(stage, kept)                                      # accumulates into each .grad

`graph_freed` tells, from the graph itself, whether autograd already let go of what the forward saved
(so that a W that would fail is named before it runs).
"""
from __future__ import annotations

import functools
import inspect

from lab_src import answers
from lab_src.registry import EXERCISES

FUNCTION = "zero_bubble_step"
HALVES = {"backward_input": ("stage", "input_tensor", "output_tensor", "output_grad"),
          "backward_weight": ("stage", "kept")}


def exercise_id() -> str:
    return next(e.id for e in EXERCISES.values() if e.function == FUNCTION)


def half(name: str):
    """The student's (or, in the grader, the reference) function `name` of the zero-bubble answer cell."""
    qid = exercise_id()
    step = answers.load(qid)
    if step is None:
        raise answers.StubCalled(answers.stub_message(qid))
    fn = getattr(step, "__globals__", {}).get(name)
    want = HALVES[name]
    if not callable(fn):
        raise answers.AnswerError(f"{qid}: your answer cell must define {name}({', '.join(want)}) beside "
                                  f"{FUNCTION}: the stage's {name} calls it")
    got = tuple(inspect.signature(fn).parameters)[:len(want)]
    if got != want:
        raise answers.AnswerError(f"{qid}: {name} must take ({', '.join(want)}), yours takes ({', '.join(got)})")
    return _named_stub(fn, qid, name)


def _named_stub(fn, qid: str, name: str):
    """`fn`, whose release stub (a bare `raise NotImplementedError()`) is reported as the stub it is, by name:
    a half is called by the lab's stage, not through lab_src.exercises, which names the others."""
    @functools.wraps(fn)
    def half_of_the_answer(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NotImplementedError as e:
            if str(e):
                raise
            ex = EXERCISES[qid]
            raise answers.StubCalled(f"{qid} {name}() is still the stub from the release (raise "
                                     f"NotImplementedError()): replace it with your code in {ex.notebook}") from None
    return half_of_the_answer


def unpack_input_half(result, rank: int, microbatch: int):
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"stage {rank}, micro-batch {microbatch}: backward_input must return (input_grad, kept), "
                        f"the gradient to send back and what backward_weight needs; got {type(result).__name__}")
    return result


def graph_freed(output) -> bool:
    """True when some tensor the forward of `output` saved for backward has already been freed (a backward
    without retain_graph=True ran through it). Reads the graph's nodes (their `_saved_*` attributes), not
    a message."""
    node = getattr(output, "grad_fn", None)
    seen, todo = set(), [node] if node is not None else []
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    getattr(node, attr)
                except RuntimeError:
                    return True
        todo += [n for n, _ in node.next_functions if n is not None]
    return False


def before_input_message(where: str, mb: int) -> str:
    return (f"{where}: backward_weight (W{mb}) runs before backward_input (I{mb}) of the same micro-batch. W continues "
            f"what I began: I computes the gradient the previous stage waits for and keeps what the weights' "
            f"gradients need; W can only run after it")


def graph_freed_message(where: str, mb: int) -> str:
    return (f"{where}: backward_weight (W{mb}) has nothing left to work on: your backward_input let autograd free "
            f"the graph of this micro-batch (torch.autograd.grad frees what the forward saved unless it is given "
            f"retain_graph=True), and the weights' gradients need it. Keep it in backward_input; the W that "
            f"runs last over it frees it")


def warm_up() -> None:
    """Run one tiny torch.autograd.grad given grad_outputs: on its first such call a process imports sympy
    (about 0.9 s), which would otherwise land inside the first I of a traced step and stretch its box."""
    import torch
    x = torch.zeros(1, requires_grad=True)
    torch.autograd.grad(x * 2, x, torch.ones(1))
