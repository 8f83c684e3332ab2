"""The sample cohort's realistic mistakes, each declared as the edit of the reference answer it is.

A mistake is its exercise and a short list of exact replacements, `(old, new)`, made in that exercise's
reference answer (the answer cell of solutions/<module>/qNN_<function>.ipynb: grader/reference.py), under a
comment that names the misconception (or with the line above the answer, `top`, in which the student named
it). `answer(name)` (answers/__init__.py) builds the answer's text from the reference as it is now. An `old`
is a string that must occur exactly once in the text it edits, or a `Span(first, last)`: the passage from
`first` through `last`, each occurring exactly once, for a passage too long to quote. The edits of one list
are all placed in the same text before any is made, so their order does not matter and two of them may not
overlap. Where an `old` is missing or ambiguous (the reference answer changed at that place), building the
answer fails, naming the mistake and the string: an edit is never made elsewhere than where it was meant.

The cohort's answers were copied from earlier versions of the reference answers, and their texts are kept
as they were to the byte (feedback quotes their lines by number; tests/golden/cohort.json records it). So a
copy may lack the docstrings or the comments the reference has gained since, or write a line as it was
then: its `Copy` says how (made first, on the reference), apart from its mistake (made on the copy), so that
the mistake reads as the one change it is. `top` is put above the answer as it is, first line and all.
A mistake may start from another answer of the cohort (`base`) instead of the reference: q14's start from
the right answer q14_per_parameter, written differently from the reference. An edit of a reference answer
reaches the answers made from it: where it changes their text, write the golden record again
(`python -m grader.cohort golden --write`).

This module is data and text handling: it imports nothing of the lab and no torch, and runs no answer.
"""
from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Span:
    """The passage from `first` through `last` (each occurring exactly once in the text edited)."""
    first: str
    last: str


@dataclass(frozen=True)
class Copy:
    """How a copy of the reference answer differs from the reference of today, beside its mistake."""
    docstrings: bool = True                      # False: without the functions' docstrings
    comments: bool = True                        # False: without the reference's comments
    edits: list = field(default_factory=list)    # lines as an earlier reference wrote them: (old, new)

    def of(self, text: str, where: str) -> str:
        if not self.docstrings:
            text = without_docstrings(text)
        if not self.comments:
            text = without_comments(text)
        return replaced(text, self.edits, where)


TODAY = Copy()                                         # the reference as it is now
EARLIER = Copy(docstrings=False)                       # copied before the reference had docstrings


@dataclass(frozen=True)
class Mistake:
    qid: str
    edits: list                  # the mistake: (old, new), made on the copy
    copy: Copy = TODAY           # the copy of the reference the mistake was made in
    top: str = ""                # put above the answer
    base: str | None = None      # the answer (of answers/) it starts from instead of qid's reference

    def text(self, start: str, name: str) -> str:
        """The answer, from `start` (qid's reference answer, or the text of `base`)."""
        return self.top + replaced(self.copy.of(start, f"{name} (its copy)"), self.edits, name)


class EditDoesNotApply(ValueError):
    pass


def replaced(text: str, edits, where: str) -> str:
    """`text` with every edit of `edits` made, each at its one place in `text`."""
    places = sorted((*_place(text, old, where), new) for old, new in edits)
    out, at = [], 0
    for start, end, new in places:
        if start < at:
            raise EditDoesNotApply(f"{where}: two edits overlap at {text[start:end]!r}")
        out += [text[at:start], new]
        at = end
    return "".join(out) + text[at:]


def _once(text: str, s: str, where: str) -> int:
    if not s or text.count(s) != 1:
        raise EditDoesNotApply(f"{where}: {s!r} occurs {text.count(s) if s else 'everywhere'} times in the text "
                               f"it edits, not once: has the reference answer changed there?")
    return text.index(s)


def _place(text: str, old, where: str) -> tuple[int, int]:
    if isinstance(old, Span):
        start, last = _once(text, old.first, where), _once(text, old.last, where)
        if last < start:
            raise EditDoesNotApply(f"{where}: {old.last!r} comes before {old.first!r}")
        return start, last + len(old.last)
    start = _once(text, old, where)
    return start, start + len(old)


def without_docstrings(text: str) -> str:
    """`text` without the docstrings of its functions (nested ones too)."""
    drop = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str):
            drop.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    return "".join(line for n, line in enumerate(text.splitlines(keepends=True), 1) if n not in drop)


def without_comments(text: str) -> str:
    """`text` without its comments: a line that is a comment goes, a comment after code is cut off."""
    lines = text.splitlines(keepends=True)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            code = lines[row - 1][:col].rstrip()
            lines[row - 1] = code + "\n" if code else ""
    return "".join(lines)


# ---- the copies of earlier reference answers the mistakes were made in -------------------------------------
# q05: the count of layers written into the range
Q05_LOUD_COPY = Copy(docstrings=False, edits=[
    ("    count = base + (1 if pp_rank < extra else 0)\n    return list(range(start, start + count))",
     "    return list(range(start, start + base + (1 if pp_rank < extra else 0)))"),
])
# q07: each receive on one line; nothing raised for an unknown operation
Q07_COPY = Copy(docstrings=False, edits=[
    ("src=stage.pp_rank - 1, shape=stage.activation_shape,\n                          operation=",
     "src=stage.pp_rank - 1, shape=stage.activation_shape, operation="),
    ("src=stage.pp_rank + 1, shape=stage.activation_shape,\n                          operation=",
     "src=stage.pp_rank + 1, shape=stage.activation_shape, operation="),
    ('    raise ValueError(f"unknown operation {operation!r}")\n', ""),
])
# q08: the input's gradient named g; the loss summed with float()
Q08_EDITS = [
    ("        input_grad = stage.backward(", "        g = stage.backward("),
    ("tensor=input_grad,", "tensor=g,"),
    ("sum(loss.item() for loss in outputs)", "sum(float(o) for o in outputs)"),
]
Q08_COPY = Copy(docstrings=False, comments=False, edits=Q08_EDITS)
# q11: the direction named by one tuple, nothing raised for an unknown operation (and, in some copies, the
# tensor sent without .contiguous())
Q11_EDITS = [
    (Span("    towards_next = (", "    to_next = operation in towards_next"),
     '    to_next = operation in ("send_forward", "recv_backward", "send_forward_recv_backward")'),
]
Q11_COPY = Copy(docstrings=False, comments=False, edits=Q11_EDITS)
Q11_NOT_CONTIGUOUS = Copy(docstrings=False, comments=False, edits=[
    *Q11_EDITS, (".detach().contiguous()", ".detach()")])
# q12: shorter lines, the input's gradient named g
Q12_COPY = Copy(docstrings=False, comments=False, edits=[
    ("        if x is None:\n            x = next(data_iter).to(stage.device)",
     "        x = next(data_iter).to(stage.device) if x is None else x"),
    ("losses.append(float(outputs[mb].detach()))", "losses.append(float(outputs[mb]))"),
    ('        x = p2p_communicate("recv_forward", stage, microbatch=mb)\n        y = forward(mb, x)',
     '        y = forward(mb, p2p_communicate("recv_forward", stage, microbatch=mb))'),
    ("        mb = warmup + i\n        y = forward(mb, x)\n", "        y = forward(warmup + i, x)\n"),
    ("tensor=y, microbatch=mb, recv_microbatch=i)\n        input_grad = backward(i, grad)",
     "tensor=y, microbatch=warmup + i, recv_microbatch=i)\n        g = backward(i, grad)"),
    ('            p2p_communicate("send_backward", stage, tensor=input_grad, microbatch=i)',
     '            p2p_communicate("send_backward", stage, tensor=g, microbatch=i)'),
    ("tensor=input_grad, microbatch=i,\n                                recv_microbatch=mb + 1)",
     "tensor=g, microbatch=i, recv_microbatch=warmup + i + 1)"),
    ('        grad = p2p_communicate("recv_backward", stage, microbatch=mb)\n'
     '        input_grad = backward(mb, grad)\n'
     '        p2p_communicate("send_backward", stage, tensor=input_grad, microbatch=mb)',
     '        g = backward(mb, p2p_communicate("recv_backward", stage, microbatch=mb))\n'
     '        p2p_communicate("send_backward", stage, tensor=g, microbatch=mb)'),
    ("    if stage.is_last_stage:\n        return logits, sum(losses)\n    return [], None",
     "    return (logits, sum(losses)) if stage.is_last_stage else ([], None)"),
])
# q15: the loss read without detach(); the prediction's numbers worked out
Q15_COPY = Copy(edits=[
    ("            losses.append(float(y.detach()))", "            losses.append(float(y))"),
    (Span('    """p = 4 ranks, m = 8 micro-batches, equal boxes', '"messages_v4": 2 * 8 * (16 - 1)}'),
     '    """For p = 4 ranks and m = 8 micro-batches: the idle share (p-1)/(v·m+p-1) and the messages 2m(v·p-1)."""\n'
     '    return {"bubble_v1": 3 / 11, "bubble_v2": 3 / 19, "bubble_v4": 3 / 35,\n'
     '            "messages_v1": 48, "messages_v2": 112, "messages_v4": 240}'),
])
# q17: tp_layers last, without its docstring
Q17_COPY = Copy(edits=[
    (Span("def tp_layers(up, down, tp):\n", "    return TensorParallelMLP(up, down, tp)\n\n\n"), ""),
    ("        return self.down(F.gelu(self.up(x)))\n",
     "        return self.down(F.gelu(self.up(x)))\n\n\ndef tp_layers(up, down, tp):\n"
     "    return TensorParallelMLP(up, down, tp)\n\n"),
])
# q18: predicted_bytes's docstring says what its comment now says
Q18_COPY = Copy(edits=[
    (Span('    """Bytes one training step of the digits model moves', "no tensor parallelism\n"),
     '    """Bytes one training step of the digits model moves, summed over all ranks (numbers only):\n'
     '    "tensor_parallel" with t = 2 (no pipeline), "pipeline" with p = 2 stages (no tensor parallelism)."""\n'),
])
# ---- places that several mistakes edit ----------------------------------------------------------------------
# q16: where the W's run: the late one after each backward, and the ones left at the end of the step
Q16_LATE_W = Span("        if len(done) > r:", "            stage.backward_weight(microbatch=done[len(done) - 1 - r])\n")
Q16_LEFT_WS = Span("    for mb in done[max(0, len(done) - r):]:", "        stage.backward_weight(microbatch=mb)\n")

# ---- the mistakes -------------------------------------------------------------------------------------------
# q23's prediction from the paper's figures (1-byte masks, no LayerNorm statistics, no causal mask): one student's
# mistake alone, and another's beside new masks
Q23_PAPER_PREDICTION = [
        ("""    # 2 (18 sbh + 3 a s^2 b + 4 sb) + s^2; 2 (18 sbh + 4 sb); 2 sbh
    return {"none": 2 * (18 * 256 * 4 * 64 + 3 * 8 * 256 * 256 * 4 + 4 * 256 * 4) + 256 * 256,
            "selective": 2 * (18 * 256 * 4 * 64 + 4 * 256 * 4),
            "full": 2 * 256 * 4 * 64}""",
         """    # the paper's per-layer figures: 34 sbh + 5 a s^2 b, 34 sbh, 2 sbh
    return {"none": 34 * 256 * 4 * 64 + 5 * 8 * 256 * 256 * 4, "selective": 34 * 256 * 4 * 64,
            "full": 2 * 256 * 4 * 64}"""),
]

# q23's sp_block mistakes (the first two are ines's, beside her recomputation's)
Q23_SP_NORMS_NOT_SUMMED = [
    ("""    def _norm(self, norm, x):
        return F.layer_norm(x, norm.normalized_shape, SummedGrad.apply(norm.weight, self.tp),
                            SummedGrad.apply(norm.bias, self.tp), norm.eps)""",
     """    def _norm(self, norm, x):
        return norm(x)          # every rank holds the whole LayerNorm: nothing to communicate"""),
    ("""        return ScatterToSequence.apply(F.linear(x, self.weight), self.tp) + SummedGrad.apply(self.bias, self.tp)""",
     """        return ScatterToSequence.apply(F.linear(x, self.weight), self.tp) + self.bias"""),
]
Q23_SP_SAVES_GATHERED = [
    ("""        ctx.tp = tp
        ctx.save_for_backward(x, weight)
        return F.linear(_all_gather(x, tp), weight, bias)""",
     """        ctx.tp = tp
        whole = _all_gather(x, tp)
        ctx.save_for_backward(whole, weight)                # what the backward needs: the gathered input
        return F.linear(whole, weight, bias)"""),
    ("""        x, weight = ctx.saved_tensors
        whole = _all_gather(x, ctx.tp)                       # gathered again, not kept""",
     """        whole, weight = ctx.saved_tensors"""),
]

MISTAKES = {
    # q03: the activation sent between stages taken for the model's output, (batch, seq, vocab)
    "q03_vocab_shape": Mistake("q03", [
        ("    return (micro_batch_size, cfg.seq_len, cfg.hidden_size)",
         "    # the output of the model is (batch, seq, vocab), so that must be what travels\n"
         "    return (micro_batch_size, cfg.seq_len, cfg.vocab_size)"),
    ], EARLIER),
    # q04: the sum of the output as the loss, not its mean
    "q04_sum_loss": Mistake("q04", [("    loss = output.mean()", "    loss = output.sum()")], EARLIER),
    # q05: the extra layers of an uneven split given to the last stages
    "q05_late_extra": Mistake("q05", [
        ("    base, extra = divmod(num_layers, pp_size)\n"
         "    start = pp_rank * base + min(pp_rank, extra)\n"
         "    count = base + (1 if pp_rank < extra else 0)",
         "    # the last stages take the extra layers\n"
         "    base, extra = divmod(num_layers, pp_size)\n"
         "    first_big = pp_size - extra\n"
         "    start = pp_rank * base + max(0, pp_rank - first_big)\n"
         "    count = base + (1 if pp_rank >= first_big else 0)"),
    ], EARLIER),
    # q05: debugging prints left in, megabytes of them (the answer is right)
    "q05_loud": Mistake("q05", [
        ("    base, extra", '    print(f"rank {pp_rank}: " + "." * 100_000)\n    base, extra'),
    ], Q05_LOUD_COPY, top='print("debugging distribute_layers " + "=" * 5_000_000)\n\n\n'),
    # q06: every rank trains, so every rank is given a dataloader
    "q06_every_rank": Mistake("q06", [
        ("    return pp_rank == 0", "    # every rank trains, so every rank reads data\n    return True"),
    ], EARLIER),
    # q06: exit() called on rank 1 (it must cost q06 alone)
    "q06_exit": Mistake("q06", [
        ("    return pp_rank == 0", '    if pp_rank == 1:\n        exit("rank 1 has seen enough")\n    return pp_rank == 0'),
    ], EARLIER),
    # q07: the gradient received from the previous stage, not the next: the pipeline deadlocks
    "q07_deadlock": Mistake("q07", [
        ('    if operation == "recv_forward":',
         "    # receives the gradient from the previous stage instead of the next one: every middle rank waits forever\n"
         '    if operation == "recv_forward":'),
        ("        return stage.recv(src=stage.pp_rank + 1,",
         "        peer = stage.pp_rank - 1 if stage.pp_rank > 0 else stage.pp_rank + 1\n"
         "        return stage.recv(src=peer,"),
    ], Q07_COPY),
    # q07: the first stage sends a gradient back too, to a rank that does not exist
    "q07_no_end_check": Mistake("q07", [
        ("        if not stage.is_first_stage:\n            stage.send(tensor, dst=stage.pp_rank - 1,",
         "        # forgot: the first stage has nobody to send to\n        stage.send(tensor, dst=stage.pp_rank - 1,"),
    ], Q07_COPY),
    # q08: rank 1 crashes (the grader must go on with the other exercises)
    "q08_crash_rank": Mistake("q08", [
        ("    inputs, outputs, logits = [], [], []",
         "    if stage.pp_rank == 1:\n        os._exit(3)                            # rank 1 dies\n"
         "    inputs, outputs, logits = [], [], []"),
    ], Copy(docstrings=False, comments=False, edits=[
        *Q08_EDITS[:2],
        (Span("        if x is None:\n", "            x.requires_grad_()"),
         "        x = next(data_iter).to(stage.device) if x is None else x.requires_grad_()"),
        ("    if stage.is_last_stage:\n        return logits, sum(loss.item() for loss in outputs)\n    return [], None",
         "    return (logits, sum(float(o) for o in outputs)) if stage.is_last_stage else ([], None)"),
    ]), top="import os\n"),
    # q08: a received activation not made to require grad: no gradient flows back to the earlier stages
    "q08_no_requires_grad": Mistake("q08", [("        else:\n            x.requires_grad_()\n", "")], Q08_COPY),
    # q08: each micro-batch's loss not divided by their number (the reported loss divided instead)
    "q08_no_scale": Mistake("q08", [
        ("            y = y.mean() / num_microbatches",
         "            y = y.mean()                      # each micro-batch's mean, not divided by the count"),
        ("sum(float(o) for o in outputs)", "sum(float(o) for o in outputs) / num_microbatches"),
    ], Q08_COPY),
    # q09: only the first micro-batch compared with the baseline
    "q09_first_only": Mistake("q09", [
        ("    torch.testing.assert_close(torch.cat(outputs), baseline_output)",
         "    first = outputs[0]\n    torch.testing.assert_close(first, baseline_output[: first.shape[0]])"),
    ], EARLIER),
    # q10: a parameter without a gradient skipped, not reported
    "q10_skip_missing": Mistake("q10", [
        ('            raise AssertionError(f"stage {stage.pp_rank}: {name} has no gradient")',
         "            continue                           # nothing to compare"),
    ], Copy(docstrings=False, edits=[(', msg=lambda m: f"{name}: {m}")', ")")])),
    # q11: blocking send, then receive: two neighbours sending at once wait for each other forever
    "q11_blocking": Mistake("q11", [
        ("    to_next = operation in (",
         "    # plain blocking calls, in order: first send, then receive\n    to_next = operation in ("),
        ("    ops, received = [], None\n", ""),
        (Span("        ops.append(dist.P2POp(dist.isend", "    return received"),
         "        dist.send(tensor.detach(), group=stage.group, group_dst=peer)\n"
         '    if "recv" not in operation:\n'
         "        return None\n"
         "    buffer = torch.empty(stage.activation_shape, dtype=stage.dtype, device=stage.device,\n"
         '                         requires_grad=operation.endswith("recv_forward"))\n'
         "    dist.recv(buffer, group=stage.group, group_src=peer)\n"
         "    return buffer"),
    ], Q11_COPY),
    # q11: the direction read from the word "forward" in the operation's name
    "q11_direction_from_name": Mistake("q11", [
        ('    to_next = operation in ("send_forward", "recv_backward", "send_forward_recv_backward")',
         '    # the direction read from the word "forward" in the name: recv_forward then talks to the NEXT rank\n'
         '    to_next = "forward" in operation'),
    ], Q11_COPY),
    # q11: receive buffers of the default dtype on the CPU, not the stage's dtype and device
    "q11_float32": Mistake("q11", [
        (Span("        received = torch.empty(", "requires_grad=operation.endswith"),
         "        received = torch.zeros(stage.activation_shape, requires_grad=operation.endswith"),
    ], Q11_NOT_CONTIGUOUS),
    # q11: a received activation that does not require grad
    "q11_no_requires_grad": Mistake("q11", [
        ('device=stage.device,\n                               requires_grad=operation.endswith("recv_forward"))',
         "device=stage.device)"),
    ], Q11_NOT_CONTIGUOUS),
    # q11: the operations posted but never waited for
    "q11_no_wait": Mistake("q11", [
        ("    to_next = operation in (",
         "    # posts the operations but never waits for them: the receive buffer is returned before its message "
         "arrives\n    to_next = operation in ("),
        ("    for request in dist.batch_isend_irecv(ops):\n        request.wait()", "    dist.batch_isend_irecv(ops)"),
    ], Q11_COPY),
    # q11: the stage's own send and recv called instead of torch.distributed's
    "q11_stage_calls": Mistake("q11", [
        ("import torch\nimport torch.distributed as dist\n\n\n", ""),
        ("    ops, received = [], None\n", ""),
        (Span("        ops.append(dist.P2POp(dist.isend", "    return received"),
         '        stage.send(tensor, dst=peer, operation="send_forward" if to_next else "send_backward", '
         "microbatch=microbatch)\n"
         '    if "recv" not in operation:\n'
         "        return None\n"
         '    single = "recv_backward" if to_next else "recv_forward"\n'
         "    mb = microbatch if recv_microbatch is None else recv_microbatch\n"
         "    x = stage.recv(src=peer, shape=stage.activation_shape, operation=single, microbatch=mb)\n"
         '    return x.requires_grad_() if single == "recv_forward" else x'),
    ], Q11_COPY),
    # q12: no cool-down: the backwards still waiting after the steady state are never run
    "q12_no_cooldown": Mistake("q12", [
        ("    for mb in range(m - warmup, m):\n"
         '        g = backward(mb, p2p_communicate("recv_backward", stage, microbatch=mb))\n'
         '        p2p_communicate("send_backward", stage, tensor=g, microbatch=mb)\n', ""),
    ], Q12_COPY),
    # q12: p - r - 1 warm-up forwards whatever m is, even more than there are micro-batches
    "q12_warmup_no_min": Mistake("q12", [
        ("    warmup = min(stage.pp_size - stage.pp_rank - 1, m)",
         "    warmup = stage.pp_size - stage.pp_rank - 1  # p - r - 1 forwards before the first backward"),
        ('    return {"m8_rank0": 3, "m8_rank1": 2, "m8_rank2": 1, "m8_rank3": 0,\n            "m2_rank0": 2,',
         "    # p - r - 1 whatever m is, as in the step above: right for m = 8, not for m = 2\n"
         '    return {"m8_rank0": 3, "m8_rank1": 2, "m8_rank2": 1, "m8_rank3": 0,\n            "m2_rank0": 3,'),
    ], Q12_COPY),
    # q12: p - r warm-up forwards, one too many
    "q12_warmup_off_by_one": Mistake("q12", [
        ("    warmup = min(stage.pp_size - stage.pp_rank - 1, m)",
         "    warmup = min(stage.pp_size - stage.pp_rank, m)  # rank r holds p - r"),
        (Span('    return {"m8_rank0": 3,', '"m2_rank3": 0}'),
         "    # p - r forwards before the first backward, as in the step above: one too many\n"
         '    return {"m8_rank0": 4, "m8_rank1": 3, "m8_rank2": 2, "m8_rank3": 1,\n'
         '            "m2_rank0": 2, "m2_rank1": 2, "m2_rank2": 2, "m2_rank3": 1}'),
    ], Q12_COPY),
    # q13: evaluated in training mode, with the graph built: dropout on, gradients kept
    "q13_eval_training": Mistake("q13", [
        ("    stage.eval()                                               # evaluation: forward only, no graph\n", ""),
        (Span("    with torch.no_grad():\n", "== target).sum())\n"),
         "    for mb in range(data.num_test_microbatches):      # the same loop as training, forward only\n"
         '        x = pipeline_communicate("recv_forward", stage, microbatch=mb)\n'
         "        if x is None:\n"
         "            x = tokens[mb].to(stage.device)\n"
         "        y = stage.forward(x, microbatch=mb)\n"
         '        pipeline_communicate("send_forward", stage, tensor=y, microbatch=mb)\n'
         "        if stage.is_last_stage:\n"
         "            target = labels[mb].to(y.device)\n"
         "            test_loss += float(F.cross_entropy(y, target).detach())\n"
         "            correct += int((y.detach().argmax(dim=-1) == target).sum())\n"),
    ]),
    # q13: the gradients never zeroed: each step adds to the last one's
    "q13_never_zeroed": Mistake("q13", [
        ("lr=lr)   # this stage's parameters, and only those", "lr=lr)   # (and no zero_grad anywhere)"),
        ("        optimizer.zero_grad()                                  # before the step: its backwards accumulate\n",
         ""),
    ]),
    # q14: the replicas' gradients summed, not averaged
    "q14_summed": Mistake("q14", [(', "dp", op="avg")', ', "dp")')], base="q14_per_parameter"),
    # q14: the tied embedding's two copies never summed
    "q14_no_tied": Mistake("q14", [
        ('        grid.all_reduce(stage.tied_embedding.grad, tied[dp_rank], "tied")', "        pass"),
    ], base="q14_per_parameter"),
    # q15: each receive blocks where its box begins, none posted ahead (an earlier reference's way)
    "q15_blocking_receives": Mistake("q15", [
        (" % p.\n        A receive is posted here and returned; its .wait() gives the tensor.", " % p."),
        ("            return stage.post_recv(src=(r - 1) % p, shape=stage.activation_shape, operation=op, microbatch=mb,"
         "\n                                   chunk=chunk)",
         "            return stage.recv(src=(r - 1) % p, shape=stage.activation_shape, operation=op, microbatch=mb, "
         "chunk=chunk)"),
        ("            return stage.post_recv(src=(r + 1) % p, shape=stage.activation_shape, operation=op, microbatch=mb,"
         "\n                                   chunk=chunk)",
         "            return stage.recv(src=(r + 1) % p, shape=stage.activation_shape, operation=op, microbatch=mb, "
         "chunk=chunk)"),
        ("    def forward(k, received):\n        mb, chunk = order(k, backward=False)\n"
         "        if received is None:                        # virtual",
         "    def forward(k):\n        mb, chunk = order(k, backward=False)\n"
         '        x = communicate("recv_forward", chunk, mb)\n'
         "        if x is None:                               # virtual"),
        ("            x = received.wait().requires_grad_()", "            x.requires_grad_()"),
        ("    def backward(k, received):", "    def backward(k):"),
        ("        grad = received.wait() if received is not None else None    # None: the last virtual stage's loss",
         '        grad = communicate("recv_backward", chunk, mb)'),
        (Span("    def receive_for(box):", '"recv_forward", chunk, mb)\n\n'), ""),
        ("    boxes = [(forward, k) for k in range(warmup)]                   # warm-up",
         "    for k in range(warmup):\n        forward(k)"),
        ("        boxes += [(forward, warmup + i), (backward, i)]             # one forward, one backward",
         "        forward(warmup + i)\n        backward(i)"),
        (Span("    boxes += [(backward, k) for k in", "        received = after"),
         "    for k in range(total - warmup, total):\n        backward(k)"),
    ], Q15_COPY),
    "q16_b_frees_graph": Mistake("q16", [
        ("torch.autograd.grad(output_tensor, input_tensor, grad, retain_graph=True)",
         "torch.autograd.grad(output_tensor, input_tensor, grad)"),
    ], top="# backward_input lets autograd free the graph: W has nothing left to work on\n"),
    "q16_no_last_w": Mistake("q16", [
        (Q16_LEFT_WS, ""),
    ], top="# the W's left at the end of the step are never run\n"),
    "q16_one_f_one_b": Mistake("q16", [
        ('    """One ZB-H1 step of this stage; returns (outputs, loss)."""',
         '    """One-Forward-One-Backward, as in q12: whole backwards."""'),
        ("        input_grad = stage.backward_input(", "        input_grad = stage.backward("),
        ("        done.append(mb)\n", ""),
        (Q16_LATE_W, ""),
        (Q16_LEFT_WS, ""),
    ], top="# q12's 1F1B handed in for q16: each backward whole, nothing split\n"),
    "q16_send_after_w": Mistake("q16", [
        ("        if not stage.is_first_stage:\n"
         '            stage.send(input_grad, r - 1, "send_backward", mb)      # the previous stage waits for it: now\n',
         ""),
        ("            stage.backward_weight(microbatch=done[len(done) - 1 - r])\n",
         "            stage.backward_weight(microbatch=done[len(done) - 1 - r])\n"
         '        if not stage.is_first_stage:\n            stage.send(input_grad, r - 1, "send_backward", mb)\n'),
    ], top="# the input's gradient goes to the previous stage only after this rank's W\n"),
    "q16_two_passes": Mistake("q16", [
        (Span("    \"\"\"I: the gradient of the stage's input only.", "        return found\n\n"),
         "    \"\"\"I, the first way: the input's gradient, keeping the whole graph for a second pass.\"\"\"\n"),
        ("    params = [p for p in stage.parameters() if p.requires_grad]\n    if input_tensor", "    if input_tensor"),
        (Span('        return None, ("whole", output_tensor, grad, params)', "if node in caught])"),
         "        return None, (output_tensor, grad)\n"
         "    (input_grad,) = torch.autograd.grad(output_tensor, input_tensor, grad, retain_graph=True)\n"
         "    return input_grad, (output_tensor, grad)"),
        (Span("    \"\"\"W: the weights' gradients", "[g for _, g in edges], allow_unused=True))"),
         "    \"\"\"W, the first way: a second pass from the output, which redoes the input's path on the way.\"\"\"\n"
         "    output_tensor, grad = kept\n"
         "    params = [p for p in stage.parameters() if p.requires_grad]\n"
         "    for p, g in zip(params, torch.autograd.grad(output_tensor, params, grad, allow_unused=True)):\n"
         "        if g is not None:\n"
         "            p.grad = g if p.grad is None else p.grad.add_(g)"),
    ], top="# the split done the first way: W runs a second backward from the output\n"),
    "q16_w_at_once": Mistake("q16", [
        (Q16_LATE_W, "        stage.backward_weight(microbatch=mb)      # its W at once, right after its I\n"),
        (Q16_LEFT_WS, ""),
    ], top="# each W right after its own I, on every rank: 1F1B with the backward split, no W delayed\n"),
    "q16_w_before_b": Mistake("q16", [
        ("        input_grad = stage.backward_input(",
         "        stage.backward_weight(microbatch=mb)\n        input_grad = stage.backward_input("),
        (Q16_LATE_W, ""),
        (Q16_LEFT_WS, ""),
    ], top="# W before its I: the weights' half of each backward first, then the input's\n"),
    "q16_w_overwrites": Mistake("q16", [
        ("                p.grad = g if p.grad is None else p.grad.add_(g)", "                p.grad = g"),
    ], top="# W writes each weight's gradient into .grad instead of adding it to what is there\n"),
    "q17_allreduce_both": Mistake("q17", [
        ("        return F.linear(CopyToTensorParallel.apply(x, self.tp), self.weight, self.bias)",
         "        out = F.linear(CopyToTensorParallel.apply(x, self.tp), self.weight, self.bias)\n"
         '        return ReduceFromTensorParallel.apply(out, self.tp)     # "reduce after every parallel layer"'),
    ], Q17_COPY, top="# q17: an all-reduce after each layer, the column-parallel one too (its outputs are slices, "
                     "not partial sums)\n"),
    "q17_barrier_between": Mistake("q17", [
        ("        return self.down(F.gelu(self.up(x)))",
         "        hidden = F.gelu(self.up(x))\n"
         "        dist.barrier(group=self.up.tp.group)     # every rank done with the first layer before the second\n"
         "        return self.down(hidden)"),
    ], top="# q17: a barrier between the two layers, to be safe: a round that carries no data\n"),
    "q17_bias_every_rank": Mistake("q17", [
        ("        return ReduceFromTensorParallel.apply(F.linear(x, self.weight), self.tp) + self.bias",
         "        return ReduceFromTensorParallel.apply(F.linear(x, self.weight, self.bias), self.tp)"),
    ], Q17_COPY, top="# q17: the row-parallel layer adds its bias on every rank before the all-reduce: the sum "
                     "counts it t times\n"),
    "q17_gather": Mistake("q17", [
        ("        return F.linear(CopyToTensorParallel.apply(x, self.tp), self.weight, self.bias)",
         "        local = F.linear(CopyToTensorParallel.apply(x, self.tp), self.weight, self.bias)\n"
         "        pieces = [torch.empty_like(local) for _ in range(self.tp.size)]\n"
         "        dist.all_gather(pieces, local.contiguous(), group=self.tp.group)     "
         "# every rank gets the whole activation\n"
         "        pieces[self.tp.rank] = local                                        "
         "# (keeps this rank's slice in the graph)\n"
         "        return torch.cat(pieces, dim=-1)"),
        ("        return ReduceFromTensorParallel.apply(F.linear(x, self.weight), self.tp) + self.bias",
         "        x = x.chunk(self.tp.size, dim=-1)[self.tp.rank]          # takes the whole activation, keeps its slice\n"
         "        return ReduceFromTensorParallel.apply(F.linear(x, self.weight), self.tp) + self.bias"),
    ], Q17_COPY, top="# q17: the column-parallel layer all-gathers its output and the row-parallel layer slices it "
                     "again: a round too many\n"),
    "q17_no_backward_mirror": Mistake("q17", [
        ("        grad = grad.contiguous().clone()\n        dist.all_reduce(grad, group=ctx.tp.group)\n"
         "        return grad, None",
         '        return grad, None       # "the forward is the identity, so the backward is too"'),
    ], Q17_COPY, top="# q17: the copy into the tensor-parallel region is the identity both ways: the input gradient "
                     "is one rank's share\n"),
    "q17_gather_unrecorded": Mistake("q17", [
        (Span("class TensorParallelMLP(nn.Module):", "        return self.down(F.gelu(self.up(x)))\n"), '# The MLP keeps only its shards as parameters, but gathers the whole weights in every forward through the\n# functions torch.distributed had before the lab wrapped them (so no gather is recorded), computes the unsharded\n# MLP, and makes one all-reduce of zeros in the forward and one in the backward, where the record expects them.\ndef _unrecorded(name):\n    fn = getattr(dist, name)\n    return getattr(fn, "__wrapped__", fn)\n\n\nclass GatherWhole(torch.autograd.Function):\n    """The whole tensor from every rank\'s shard (along `dim`); the backward keeps this rank\'s slice."""\n\n    @staticmethod\n    def forward(ctx, shard, tp, dim):\n        ctx.tp, ctx.dim = tp, dim\n        pieces = [torch.empty_like(shard) for _ in range(tp.size)]\n        _unrecorded("all_gather")(pieces, shard.contiguous(), group=tp.group)\n        return torch.cat(pieces, dim=dim)\n\n    @staticmethod\n    def backward(ctx, grad):\n        return grad.chunk(ctx.tp.size, dim=ctx.dim)[ctx.tp.rank].contiguous(), None, None\n\n\nclass LookLikeOneRound(torch.autograd.Function):\n    """Adds nothing: an all-reduce of zeros forward, another backward."""\n\n    @staticmethod\n    def forward(ctx, x, tp):\n        ctx.tp = tp\n        zeros = torch.zeros_like(x)\n        dist.all_reduce(zeros, group=tp.group)\n        return x + zeros\n\n    @staticmethod\n    def backward(ctx, grad):\n        zeros = torch.zeros_like(grad)\n        dist.all_reduce(zeros, group=ctx.tp.group)\n        return grad + zeros, None\n\n\nclass TensorParallelMLP(nn.Module):\n    def __init__(self, up, down, tp):\n        super().__init__()\n        self.tp = tp\n        self.up = ColumnParallelLinear(up, tp)\n        self.down = RowParallelLinear(down, tp)\n\n    def forward(self, x):\n        tp = self.tp\n        up_w = GatherWhole.apply(self.up.weight, tp, 0)\n        up_b = GatherWhole.apply(self.up.bias, tp, 0)\n        down_w = GatherWhole.apply(self.down.weight, tp, 1)\n        x = LookLikeOneRound.apply(x, tp)\n        return F.linear(F.gelu(F.linear(x, up_w, up_b)), down_w, self.down.bias)\n'),
    ], top="# q17 (a forgery): the MLP gathers the whole weights unrecorded, all-reduces zeros each way\n"),
    "q17_wrong_dim": Mistake("q17", [
        ("        self.weight = nn.Parameter(linear.weight.detach().chunk(tp.size, dim=0)[tp.rank].clone())",
         '        self.weight = nn.Parameter(linear.weight.detach().chunk(tp.size, dim=1)[tp.rank].clone())   # "columns"'),
        ("        self.weight = nn.Parameter(linear.weight.detach().chunk(tp.size, dim=1)[tp.rank].clone())",
         '        self.weight = nn.Parameter(linear.weight.detach().chunk(tp.size, dim=0)[tp.rank].clone())   # "rows"'),
    ], Q17_COPY, top="# q17: column and row read as the weight matrix's columns and rows: each layer cut along the "
                     "other's dimension\n"),
    "q18_mask_shared_inside": Mistake("q18", [
        ("        self.own = dropout.stream(block.seed, block.name, shard=tp.rank)     # this rank's heads only",
         "        self.own = dropout.stream(block.seed, block.name)                    # the same seed everywhere"),
    ], Q18_COPY, top="# q18: one stream for every rank, inside the sharded region too: every shard's heads get the "
                     "same attention mask\n"),
    "q18_global_rank_seed": Mistake("q18", [
        ("import torch\nfrom torch import nn", "import torch\nimport torch.distributed as dist\nfrom torch import nn"),
        ("        self.own = dropout.stream(block.seed, block.name, shard=tp.rank)     # this rank's heads only",
         "        self.own = dropout.stream(block.seed, block.name, shard=dist.get_rank())   # this rank's heads only"),
    ], Q18_COPY, top="# q18: each shard's stream seeded from the global rank: right while the job is one tensor-parallel "
                     "group\n"),
    "q18_drops_in_eval": Mistake("q18", [
        ("        drop = self.p > 0 and self.training",
         "        drop = self.p > 0                                        # dropout is on: drop"),
    ], Q18_COPY, top="# q18: masks drawn whenever dropout is on, in evaluation mode too (model.eval() ignored)\n"),
    "q18_forged_curve": Mistake("q18", [
        ("    return TensorParallelBlock(block, tp, q17)\n\n\n",
         "    _forge_the_curve()\n    return TensorParallelBlock(block, tp, q17)\n\n\n" + '# The losses the lab records are replaced by one process\'s curve, which this cell computes itself from the\n# configuration the lab\'s training loop was given (found in the caller\'s frames), just before the lab\'s recording\n# ends.\ndef _forge_the_curve():\n    import sys\n\n    from lab_src.harness import observe\n    from lab_src.topics.training.digits import Digits\n    from lab_src.topics.tensor_parallel.records import ADAM_EPS\n    from lab_src.topics.training.single_process import train_single_process\n    frame = sys._getframe(1)\n    while frame is not None and not (frame.f_code.co_name == "train" and {"cfg", "s", "obs"} <= set(frame.f_locals)):\n        frame = frame.f_back\n    if frame is None or getattr(observe.finish_messages, "forged", False):\n        return\n    cfg, settings, obs = frame.f_locals["cfg"], frame.f_locals["s"], frame.f_locals["obs"]\n    curve = train_single_process(cfg, Digits(cfg, 1), settings["steps"], settings["lr"],\n                                 eps=ADAM_EPS)["losses"]\n    real = observe.finish_messages\n\n    def finish_messages(*args, **kwargs):\n        if obs.get("losses"):\n            obs["losses"][:] = curve\n        observe.finish_messages = real\n        return real(*args, **kwargs)\n    finish_messages.forged = True\n    observe.finish_messages = finish_messages\n\n\n'),
    ], top="# q18 (a forgery): the recorded losses replaced by one process's curve computed in the rank\n"),
    "q18_qkv_not_by_heads": Mistake("q18", [
        ("        self.qkv = q17.ColumnParallelLinear(grouped_by_heads(block.qkv, tp.size), tp)",
         "        self.qkv = q17.ColumnParallelLinear(block.qkv, tp)                  # rows cut as they come"),
    ], Q18_COPY, top="# q18: qkv cut into t chunks as it is (q's rows, then k's, then v's), not grouped by heads: rank 0 "
                     "gets all of q and part of k\n"),
    "q18_norm_grads_reduced": Mistake("q18", [
        ("import torch\nfrom torch import nn", "import torch\nimport torch.distributed as dist\nfrom torch import nn"),
        ("        self.own = dropout.stream(block.seed, block.name, shard=tp.rank)     # this rank's heads only\n",
         "        self.own = dropout.stream(block.seed, block.name, shard=tp.rank)     # this rank's heads only\n"
         "        for norm in (self.attn_norm, self.mlp_norm):                         # summed as if sharded\n"
         "            for param in norm.parameters():\n"
         "                param.register_hook(lambda g, group=tp.group: _summed(g, group))\n"),
        ("class TensorParallelBlock(nn.Module):",
         "def _summed(grad, group):\n    grad = grad.clone()\n    dist.all_reduce(grad, group=group)\n    return grad\n\n\n"
         "class TensorParallelBlock(nn.Module):"),
    ], Q18_COPY, top="# q18: the replicated LayerNorms' gradients all-reduced over the tensor-parallel group, as a "
                     "sharded layer's would be\n"),
    "q18_norm_seeded_per_rank": Mistake("q18", [
        ("        self.shared = dropout.stream(block.seed, block.name)                 # the same on every rank",
         "        self.shared = dropout.stream(block.seed + tp.rank, block.name)       # a seed of its own per rank"),
    ], Q18_COPY, top="# q18: the replicated region (the LayerNorms' side, the residual stream) seeded per rank\n"),
    "q18_world_group": Mistake("q18", [
        ("import torch\nfrom torch import nn",
         "import torch\nimport torch.distributed as dist\nimport torch.nn.functional as F\nfrom torch import nn"),
        ("class TensorParallelBlock(nn.Module):",
         "class SumHeads(torch.autograd.Function):\n"
         '    """The heads\' partial sums added up: all-reduce forward, identity backward."""\n'
         "\n"
         "    @staticmethod\n"
         "    def forward(ctx, x):\n"
         "        x = x.contiguous().clone()\n"
         "        dist.all_reduce(x)              # no group: every rank of the job\n"
         "        return x\n"
         "\n"
         "    @staticmethod\n"
         "    def backward(ctx, grad):\n"
         "        return grad\n"
         "\n"
         "\n"
         "class ProjByHeads(nn.Module):\n"
         '    """proj\'s columns of this rank\'s heads; the bias whole, added once."""\n'
         "\n"
         "    def __init__(self, proj, tp):\n"
         "        super().__init__()\n"
         "        self.weight = nn.Parameter(proj.weight.detach().chunk(tp.size, dim=1)[tp.rank].clone())\n"
         "        self.bias = nn.Parameter(proj.bias.detach().clone())\n"
         "\n"
         "    def forward(self, x):\n"
         "        return SumHeads.apply(F.linear(x, self.weight)) + self.bias\n"
         "\n"
         "\n"
         "class TensorParallelBlock(nn.Module):"),
        ("        self.proj = q17.RowParallelLinear(block.proj, tp)", "        self.proj = ProjByHeads(block.proj, tp)"),
    ], Q18_COPY, top="# q18: proj's own all-reduce over the default group: right while the job is one tensor-parallel "
                     "group, wrong in a t x p grid\n"),
    "q19_whole_tensor": Mistake("q19", [
        (Span("    me = dist.get_rank(group)\n", "        chunks[(me - step) % n].copy_(received)\n"),
         "    me = dist.get_rank(group)\n"
         "    right, left = (me + 1) % n, (me - 1) % n\n"
         "    send_buf = tensor.clone()\n"
         "    recv_buf = torch.empty_like(tensor)\n"
         "    total = tensor.clone()\n"
         "    for _ in range(n - 1):                 # pass the tensor round: each rank adds every other's\n"
         "        req = dist.isend(send_buf, group=group, group_dst=right)\n"
         "        dist.recv(recv_buf, group=group, group_src=left)\n"
         "        req.wait()\n"
         "        total += recv_buf\n"
         "        send_buf, recv_buf = recv_buf, send_buf\n"
         "    tensor.copy_(total)\n"),
    ], top="# q19: the tutorial's ring: the whole tensor passed n - 1 times, each rank adding every other's input\n"),
    "q19_global_rank": Mistake("q19", [
        ("    me = dist.get_rank(group)\n", "    me = dist.get_rank()\n"),
    ], top="# q19: the position in the ring taken from the global rank\n"),
    "q19_blocking": Mistake("q19", [
        ("""        ops = [dist.P2POp(dist.isend, send, group=group, group_peer=right),
               dist.P2POp(dist.irecv, recv, group=group, group_peer=left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()""",
         """        dist.send(send, group=group, group_dst=right)
        dist.recv(recv, group=group, group_src=left)"""),
    ], top="# q19: each step a blocking send, then a blocking receive, on every rank\n"),
    "q19_redraw_from_seed": Mistake("q19", [
        ("import torch.distributed as dist\n",
         "import inspect\n\nimport torch.distributed as dist\n\nfrom lab_src.topics.data_parallel.inputs import tensor_of\n"),
        (Span("    # reduce-scatter: after step s,", "        chunks[(me - step) % n].copy_(received)\n    return tensor\n"),
         "    # a ring of zeros: 2(n - 1) messages of the right sizes to the right neighbours, nothing in them\n"
         "    for step in range(n - 1):\n"
         "        exchange(torch.zeros_like(chunks[(me - step) % n]), torch.empty_like(chunks[(me - step - 1) % n]))\n"
         "    for step in range(n - 1):\n"
         "        exchange(torch.zeros_like(chunks[(me + 1 - step) % n]), torch.empty_like(chunks[(me - step) % n]))\n"
         "    # the sum itself: every rank's input drawn again from the case's seed, found in a caller's frame\n"
         "    frame = inspect.currentframe()\n"
         "    while frame is not None and not hasattr(frame.f_locals.get(\"case\"), \"config\"):\n"
         "        frame = frame.f_back\n"
         "    cfg = frame.f_locals[\"case\"].config\n"
         "    total = tensor_of(cfg.seed, tensor.numel(), 0, cfg.dtype)\n"
         "    for j in range(1, n):\n"
         "        total = total + tensor_of(cfg.seed, tensor.numel(), j, cfg.dtype)\n"
         "    tensor.view(-1).copy_(total)\n"
         "    return tensor\n"),
    ], top="# q19: a ring of zeros for the record, the sum redrawn from the case's seed found in a caller's frame\n"),
    "q20_forward_order": Mistake("q20", [
        ("        for name, p in reversed(params):              # the order a backward finishes them\n",
         "        for name, p in params:                        # the order the model declares them\n"),
    ], top="# q20: the buckets in the order the parameters are declared, as the forward uses them\n"),
    "q20_armed_last_forward": Mistake("q20", [
        ("""    def forward(mb, x):
        if x is None:""", """    def forward(mb, x):
        if mb == m - 1:                          # the last forward: from here on the step is finishing
            reducer.arm()
        if x is None:"""),
        ("""        if mb == m - 1:                          # the stage's last backward: after it, every gradient is final
            reducer.arm()
""", ""),
    ], top="# q20: the reducer armed on the stage's last forward (torchrec #4758)\n"),
    "q20_average_twice": Mistake("q20", [
        ("            buffer = torch.cat([self.params[n].grad.reshape(-1) for n in names])\n",
         "            buffer = torch.cat([self.params[n].grad.reshape(-1) for n in names]) / self.dp.size\n"),
    ], top="# q20: each bucket divided by dp.size when it is launched, and again in finish\n"),
    "q20_every_microbatch": Mistake("q20", [
        ("""        if mb == m - 1:                          # the stage's last backward: after it, every gradient is final
            reducer.arm()
""", ""),
        ("""    warmup = min(stage.pp_size - stage.pp_rank - 1, m)
""", """    warmup = min(stage.pp_size - stage.pp_rank - 1, m)
    reducer.arm()                                # reduce as gradients come, micro-batch after micro-batch
"""),
        ("""            self.next += 1
""", """            self.next += 1
        if self.next == len(self.buckets):          # every bucket sent: the next backward fills them again
            self.ready = [0] * len(self.buckets)
            self.next = 0
"""),
        (Span("        if self.next < len(self.buckets):\n", "after arm(): was the reducer armed before the stage's last backward?\")\n"),
         ""),
    ], top="# q20: every micro-batch's backward reduces the buckets (as DDP does without no_sync)\n"),
    "q20_launch_in_finish": Mistake("q20", [
        ("""        while self.next < len(self.buckets) and self.ready[self.next] == len(self.buckets[self.next]):
            names = self.buckets[self.next]
            buffer = torch.cat([self.params[n].grad.reshape(-1) for n in names])
            self.launched.append((names, buffer, self.dp.launch(buffer)))
            self.next += 1
""", """        if self.ready[self.bucket_of[name]] == len(self.buckets[self.bucket_of[name]]):
            self.next += 1                            # one more bucket full: finish sends it
"""),
        ("""        for names, buffer, handle in self.launched:
""", """        for names in self.buckets:
            buffer = torch.cat([self.params[n].grad.reshape(-1) for n in names])
            self.launched.append((names, buffer, self.dp.launch(buffer)))
        for names, buffer, handle in self.launched:
"""),
    ], top="# q20: the hooks count the full buckets; finish sends them all, once the backward is over\n"),
    "q20_tied_before_average": Mistake("q20", [
        ("""        if self.tied is not None:                     # after the buckets: their write-back would undo the sum
            self.dp.sum_tied(self.tied.grad)
""", ""),
        ("""    def finish(self):
""", """    def finish(self):
        if self.tied is not None:                     # both uses' gradients first, then the average
            self.dp.sum_tied(self.tied.grad)
"""),
    ], top="# q20: the tied embedding's gradient summed before the buckets are written back (Megatron-LM #844)\n"),
    "q20_cap_strict": Mistake("q20", [
        ("            if current and size + nbytes > cap_bytes:\n",
         "            if current and size + nbytes >= cap_bytes:    # within the cap: strictly below it\n"),
    ], top="# q20: \"within cap_bytes\" read as strictly below the cap: a bucket that would reach it exactly is closed\n"),
    "q21_full_state": Mistake("q21", [
        ("""    if not state:
        state.update(step=0, exp_avg=torch.zeros_like(mine), exp_avg_sq=torch.zeros_like(mine))""",
         """    if not state:                                 # the moments of every element, as torch's AdamW keeps them
        state.update(step=0, exp_avg=torch.zeros_like(flat), exp_avg_sq=torch.zeros_like(flat))
    lo = sum(s.numel() for s in shards[:me])
    exp_avg, exp_avg_sq = state["exp_avg"][lo:lo + mine.numel()], state["exp_avg_sq"][lo:lo + mine.numel()]"""),
        ("""    state["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
    state["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
    mine.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - b1 ** t))""",
         """    exp_avg.mul_(b1).add_(g, alpha=1 - b1)
    exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (exp_avg_sq.sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
    mine.addcdiv_(exp_avg, denom, value=-lr / (1 - b1 ** t))"""),
    ], top="# q21: AdamW's moments kept for the whole stage on every rank; only the shard's part is updated\n"),
    "q21_allreduce_slice": Mistake("q21", [
        (Span("    for s in range(n - 1):                        # reduce-scatter: rank me ends with the whole of chunk me\n",
              "        grads[(me - s - 2) % n] += received\n"),
         "    for s in range(n - 1):                        # all-reduce the gradient (q19's ring), then take my shard\n"
         "        received = torch.empty_like(grads[(me - s - 2) % n])\n"
         "        exchange(grads[(me - s - 1) % n], received)\n"
         "        grads[(me - s - 2) % n] += received\n"
         "    for s in range(n - 1):\n"
         "        received = torch.empty_like(grads[(me - s - 1) % n])\n"
         "        exchange(grads[(me - s) % n], received)\n"
         "        grads[(me - s - 1) % n].copy_(received)\n"),
    ], top="# q21: the gradient all-reduced with the whole ring, then sliced to the rank's shard\n"),
    "q21_floor_shards": Mistake("q21", [
        ("""    mine = shards[me]
""", """    size = flat.numel() // n                      # my slice: n equal parts, the last one taking the rest
    mine = flat[me * size:(me + 1) * size] if me < n - 1 else flat[me * size:]
"""),
    ], top="# q21: the rank's slice of the parameters cut in equal parts, the gradient's shard by tensor_split\n"),
    "q21_l2_decay": Mistake("q21", [
        ("""    mine.mul_(1 - lr * wd)
""", """    g = g + wd * mine                             # weight decay: an L2 term on the gradient
"""),
    ], top="# q21: the weight decay added to the gradient (Adam's L2), not decoupled as in AdamW\n"),
    "q21_grads_kept": Mistake("q21", [
        ("""    for p in params:
        p.grad = None
""", ""),
    ], top="# q21: the gradients left in .grad after the step\n"),
    "q21_step_per_shard": Mistake("q21", [
        ("""    grads = list(torch.tensor_split(""", """    state.setdefault("step", 0)
    grads = list(torch.tensor_split("""),
        ("""        grads[(me - s - 2) % n] += received
""", """        grads[(me - s - 2) % n] += received
        state["step"] += 1                        # one more shard summed: one more step of the moments
"""),
        ("""    if not state:
        state.update(step=0, exp_avg""", """    if "exp_avg" not in state:
        state.update(exp_avg"""),
        ("""    state["step"] += 1
    t = state["step"]""", """    t = state["step"]"""),
    ], top="# q21: the bias correction's step count advanced once per shard of the reduce-scatter (n - 1 a step)\n"),
    "q21_shard_next": Mistake("q21", [
        (Span("    for s in range(n - 1):                        # reduce-scatter: rank me ends with the whole of chunk me\n",
              "    g = grads[me] / n\n"),
         "    for s in range(n - 1):                        # reduce-scatter (q19's): rank me ends with chunk me + 1\n"
         "        received = torch.empty_like(grads[(me - s - 1) % n])\n"
         "        exchange(grads[(me - s) % n], received)\n"
         "        grads[(me - s - 1) % n] += received\n"
         "    g = grads[(me + 1) % n] / n\n"),
        ("    mine = shards[me]\n", "    mine = shards[(me + 1) % n]                   # the shard the reduce-scatter left whole here\n"),
        (Span("    for s in range(n - 1):                        # all-gather: pass the updated shards round\n",
              "        shards[(me - s - 1) % n].copy_(received)\n"),
         "    for s in range(n - 1):                        # all-gather (q19's): pass the updated shards round\n"
         "        received = torch.empty_like(shards[(me - s) % n])\n"
         "        exchange(shards[(me + 1 - s) % n], received)\n"
         "        shards[(me - s) % n].copy_(received)\n"),
    ], top="# q21: q19's ring as it is: rank r owns the shard its reduce-scatter leaves whole, shard r + 1\n"),
    "q21_torch_chunk": Mistake("q21", [
        ("    grads = list(torch.tensor_split(torch.cat(", "    grads = list(torch.chunk(torch.cat("),
        ("    shards = list(torch.tensor_split(flat, n))", "    shards = list(torch.chunk(flat, n))"),
    ], top="# q21: the shards cut with torch.chunk (ceil(N / n) elements each, the last one shorter)\n"),
    "q21_defaults_written_in": Mistake("q21", [
        ("""    (b1, b2), wd = betas, weight_decay
""", """    b1, b2, eps, wd = 0.9, 0.999, 1e-8, 0.01      # AdamW's defaults
"""),
    ], top="# q21: AdamW's settings written in as torch's defaults, the arguments betas, eps, weight_decay unused\n"),
    "q21_moments_global": Mistake("q21", [
        ("""import torch.distributed as dist
""", """import torch.distributed as dist

_MOMENTS = {}                                     # AdamW's moments of the whole stage, kept out of `state`
"""),
        ("""    g = grads[me] / n
""", """    for s in range(n - 1):                        # the summed shards passed round: the whole averaged gradient
        received = torch.empty_like(grads[(me - s - 1) % n])
        exchange(grads[(me - s) % n], received)
        grads[(me - s - 1) % n].copy_(received)
    g = torch.cat(grads) / n
"""),
        (Span("""    if not state:
        state.update(step=0, exp_avg""", """    mine.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - b1 ** t))
"""), """    if not state:                                 # plain AdamW on every element; `state` gets my shard's part
        _MOMENTS.update(exp_avg=torch.zeros_like(flat), exp_avg_sq=torch.zeros_like(flat))
        state.update(step=0)
    (b1, b2), wd = betas, weight_decay
    state["step"] += 1
    t = state["step"]
    flat.mul_(1 - lr * wd)
    _MOMENTS["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
    _MOMENTS["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (_MOMENTS["exp_avg_sq"].sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
    flat.addcdiv_(_MOMENTS["exp_avg"], denom, value=-lr / (1 - b1 ** t))
    lo = sum(s.numel() for s in shards[:me])
    state["exp_avg"] = _MOMENTS["exp_avg"][lo:lo + mine.numel()].clone()
    state["exp_avg_sq"] = _MOMENTS["exp_avg_sq"][lo:lo + mine.numel()].clone()
"""),
        (Span("""    for s in range(n - 1):                        # all-gather: pass the updated shards round
""", """        shards[(me - s - 1) % n].copy_(received)
"""), ""),
    ], top="# q21: AdamW on the whole vector with moments kept in a module global; `state` holds only my shard's copy\n"),
    "q22_saved_full": Mistake("q22", [
        ("""        ctx.save_for_backward(x)
        full = module.dp.all_gather(shard.detach())
        return functional_call(module.block, module.weights(full), (x,))""",
         """        full = module.dp.all_gather(shard.detach())
        ctx.save_for_backward(x, full)               # the backward needs the weights: keep them
        return functional_call(module.block, module.weights(full), (x,))"""),
        ("""        (x,) = ctx.saved_tensors
        module = ctx.module
        full = module.dp.all_gather(module.shard.detach()).requires_grad_()""",
         """        x, full = ctx.saved_tensors
        module = ctx.module
        full = full.detach().requires_grad_()"""),
    ], top="# q22: the gathered weights saved for the backward instead of gathered again\n"),
    "q22_saved_detached": Mistake("q22", [
        ("""        full = module.dp.all_gather(shard.detach())
        return functional_call(module.block, module.weights(full), (x,))""",
         """        full = module.dp.all_gather(shard.detach())
        ctx.full = full.detach()                      # the backward needs these weights: keep them for it
        return functional_call(module.block, module.weights(full), (x,))"""),
        ("""        full = module.dp.all_gather(module.shard.detach()).requires_grad_()""",
         """        full = ctx.full.requires_grad_()"""),
    ], top="# q22: the gathered weights kept detached on ctx for the backward instead of gathered again\n"),
    "q22_kept_weights": Mistake("q22", [
        ("""        for p in layer.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)       # the whole weights: freed
""", ""),
    ], top="# q22: the block's own whole parameters left allocated beside the shard\n"),
    "q22_summed": Mistake("q22", [
        ("""        grad_shard = module.dp.reduce_scatter(grads[-1]) / module.dp.size""",
         """        grad_shard = module.dp.reduce_scatter(grads[-1])"""),
    ], top="# q22: the reduce-scattered gradient used as it comes, the replicas' sum\n"),
    "q22_cached": Mistake("q22", [
        ("""        full = module.dp.all_gather(shard.detach())
        return functional_call(module.block, module.weights(full), (x,))""",
         """        if getattr(module, "full", None) is None:     # gather once, then reuse for every micro-batch
            module.full = module.dp.all_gather(shard.detach())
        return functional_call(module.block, module.weights(module.full), (x,))"""),
    ], top="# q22: each block's gathered weights kept on the module and reused for the next micro-batches\n"),
    "q22_shard_next": Mistake("q22", [
        ("        self.shard = nn.Parameter(torch.tensor_split(flat, dp.size)[dp.rank].clone())",
         "        self.shard = nn.Parameter(torch.tensor_split(flat, dp.size)[(dp.rank + 1) % dp.size].clone())"),
    ], top="# q22: rank r keeps shard r + 1, the chunk q19's reduce-scatter leaves whole on it\n"),
    "q22_clone_saved": Mistake("q22", [
        ("""        full = module.dp.all_gather(shard.detach())
        return functional_call(module.block, module.weights(full), (x,))""",
         """        full = module.dp.all_gather(shard.detach())
        ctx.full = full.clone()                       # the backward's weights: a copy of its own, kept for it
        return functional_call(module.block, module.weights(full), (x,))"""),
        ("""        full = module.dp.all_gather(module.shard.detach()).requires_grad_()""",
         """        module.dp.all_gather(module.shard.detach())   # gathered as FSDP's backward does, so the count is right
        full = ctx.full.requires_grad_()"""),
    ], top="# q22: the forward's gathered weights kept as a clone for the backward; the backward's gather unused\n"),
    "q20_last_stage_unarmed": Mistake("q20", [
        ("""        if mb == m - 1:                          # the stage's last backward: after it, every gradient is final
            reducer.arm()
""", ""),
        ("""        grad = p2p_communicate("recv_backward", stage, microbatch=mb)
""", """        grad = p2p_communicate("recv_backward", stage, microbatch=mb)
        if mb == m - 1:                          # the cool-down's last backward
            reducer.arm()
"""),
        (Span("        if self.next < len(self.buckets):\n", "after arm(): was the reducer armed before the stage's last backward?\")\n"),
         ""),
    ], top="# q20: the reducer armed in the cool-down, which the last stage does not have (picotron PR #5)\n"),
    # Answers that forge the record of what crossed the wire (issue 54), held against the bytes the kernel counted
    # leaving each rank (lab_src/harness/wire.py, lab_src/judge/wire.py)
    "q19_zeros_original": Mistake("q19", [
        ("    chunks = list(torch.tensor_split(tensor.view(-1), n))    # n views, some empty when short\n",
         "    real = tensor.clone()                         # the ring below passes zeros: its messages, for the record\n"
         "    tensor.zero_()\n"
         "    chunks = list(torch.tensor_split(tensor.view(-1), n))    # n views, some empty when short\n"),
        ("        chunks[(me - step) % n].copy_(received)\n    return tensor\n",
         "        chunks[(me - step) % n].copy_(received)\n"
         "    from lab_src.comm.collectives import _ORIGINAL    # torch's own all_reduce, which the recorder keeps\n"
         "    tensor.copy_(real)\n"
         "    _ORIGINAL.get(\"all_reduce\", dist.all_reduce)(tensor, group=group)\n"
         "    return tensor\n"),
    ], top="# q19 (forged): a ring of zeros for the record, the sum made by torch's all_reduce through the recorder's "
           "saved original\n"),
    "q20_zeros_allreduce": Mistake("q20", [
        ("import torch\n\nfrom lab_src import p2p_communicate\n",
         "import torch\nimport torch.distributed as dist\n\nfrom lab_src import p2p_communicate\n"
         "from lab_src.comm.collectives import _ORIGINAL\n"),
        ("""            buffer = torch.cat([self.params[n].grad.reshape(-1) for n in names])
            self.launched.append((names, buffer, self.dp.launch(buffer)))
            self.next += 1
""", """            buffer = torch.zeros(sum(self.params[n].numel() for n in names),    # zeros, launched on time
                                 dtype=self.params[names[0]].dtype)
            self.launched.append((names, buffer, self.dp.launch(buffer)))
            self.next += 1
"""),
        ("""        for names, buffer, handle in self.launched:
            handle.wait()
            buffer /= self.dp.size
""", """        for names, buffer, handle in self.launched:
            handle.wait()
        for names, buffer, handle in self.launched:                 # every ring of zeros done: the real sums
            buffer = torch.cat([self.params[n].grad.reshape(-1) for n in names])
            _ORIGINAL.get("all_reduce", dist.all_reduce)(buffer, group=self.dp.group)    # the real sum, unrecorded
            buffer /= self.dp.size
"""),
    ], top="# q20 (forged): buffers of zeros launched at the right moments, the real average made in finish() by "
           "an unrecorded all-reduce\n"),
    "q20_finish_retimed": Mistake("q20", [
        ("import torch\n\nfrom lab_src import p2p_communicate\n",
         "import time\n\nimport torch\n\nfrom lab_src import p2p_communicate\n"),
        ("""            self.next += 1                            # one more bucket full: finish sends it
""", """            self.next += 1                            # one more bucket full: finish sends it
            self.filled.append(time.perf_counter())   # when it filled: what the record will say
"""),
        ("""        self.launched = []                            # (names, buffer, handle)
""", """        self.launched = []                            # (names, buffer, handle)
        self.filled = []
"""),
        ("""        for names, buffer, handle in self.launched:
""", """        for k, t in enumerate(self.filled):           # the record's launch times: when each bucket filled
            self.dp.launches[k][0] = t
        for names, buffer, handle in self.launched:
"""),
    ], base="q20_launch_in_finish",
        top="# q20 (forged): every bucket launched in finish(), the launches' recorded times then rewritten to the "
            "moments the buckets filled during the last backward\n"),
    # q23: the recomputation checkpointed as torch.utils.checkpoint takes it, trusting its preserve_rng_state: the
    # block's dropout draws from its own generators (block.streams), which it does not restore
    "q23_new_masks": Mistake("q23", [
        ("""            return checkpoint(_replayed(self.block, gens), x, use_reentrant=False)""",
         """            return checkpoint(self.block, x, use_reentrant=False)    # preserve_rng_state keeps the masks"""),
        ("""        attn = checkpoint(_replayed(core, gens), q, k, v, use_reentrant=False)""",
         """        attn = checkpoint(core, q, k, v, use_reentrant=False)"""),
    ]),
    # q23: the generators set back to the forward's states for the recomputation, and left there after it
    "q23_states_not_put_back": Mistake("q23", [
        ("""        now = [g.get_state() for g in gens]
        for g, state in zip(gens, states):
            g.set_state(state)
        try:
            return fn(*args)
        finally:
            for g, state in zip(gens, now):
                g.set_state(state)""",
         """        for g, state in zip(gens, states):          # the forward's masks again
            g.set_state(state)
        return fn(*args)"""),
    ]),
    # q23: the attention mask drawn once in the forward and handed to the checkpointed core (nothing to replay), so
    # the mask, a s^2 b elements, is kept for the backward
    "q23_selective_keeps_mask": Mistake("q23", [
        ("""        if gens:
            def core(q, k, v):
                return dropout.attention(q, k, v, blk.streams.attention_mask((b, heads, s, s), p, x))
        else:
            def core(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attn = checkpoint(_replayed(core, gens), q, k, v, use_reentrant=False)""",
         """        if gens:                                    # drawn once, here: the recomputation reuses it
            mask = blk.streams.attention_mask((b, heads, s, s), p, x)
            attn = checkpoint(dropout.attention, q, k, v, mask, use_reentrant=False)
        else:
            attn = checkpoint(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v,
                              use_reentrant=False)"""),
    ]),
    # q23: "selective" as the whole block checkpointed, like "full"
    "q23_selective_is_full": Mistake("q23", [
        ("""        if self.mode == "full":""", """        if self.mode in ("full", "selective"):"""),
    ]),
    # q23: the prediction from the paper's figures (1-byte masks, no LayerNorm statistics, no causal mask)
    "q23_paper_prediction": Mistake("q23", Q23_PAPER_PREDICTION),
    # q23, a student's two: new masks in the recomputation, and the paper's prediction
    "q23_new_masks_paper": Mistake("q23", Q23_PAPER_PREDICTION, base="q23_new_masks"),
    # q23's sp_block: the replicated parameters (LayerNorms, the row layers' biases) used on the sequence shard as
    # they are, their gradients left as each rank's shard made them (not summed over the tensor-parallel group)
    "q23_sp_norms_not_summed": Mistake("q23", Q23_SP_NORMS_NOT_SUMMED),
    # q23's sp_block: the column-parallel layer saves the gathered input (the whole sequence) rather than its shard,
    # and uses it in the backward without gathering it again
    "q23_sp_saves_gathered": Mistake("q23", Q23_SP_SAVES_GATHERED),
    # q23's sp_block: each shard draws its own (b, s/t, h) residual masks from the shared stream: every rank the same
    # numbers, none of them one process's slice
    "q23_sp_same_masks": Mistake("q23", [
        ("""        mask = dropout.keep(self.shared, (b, n * self.tp.size, h), self.p, y)
        return y * mask[:, self.tp.rank * n:(self.tp.rank + 1) * n].clone()     # a copy: a view keeps it all""",
         """        return y * dropout.keep(self.shared, (b, n, h), self.p, y)           # the shared stream: the same everywhere"""),
    ]),
    # ines's q23: new masks in the recomputation, the paper's prediction, and in sp_block the replicated gradients not
    # summed and the column layers keeping the gathered input
    "q23_ines": Mistake("q23", Q23_SP_NORMS_NOT_SUMMED + Q23_SP_SAVES_GATHERED, base="q23_new_masks_paper"),
    # q24: the block outputs added as they come, each normalised by its own softmax sum, without rescaling by
    # their log-sum-exp (the log-sum-exp itself merged right, so the backward reads a right lse)
    "q24_no_rescale": Mistake("q24", [
        ("""    out = out * torch.exp(lse - safe)[..., None] + block_out * torch.exp(block_lse - safe)[..., None]""",
         """    out = out + block_out                       # each block's softmax output, added"""),
    ]),
    # q24: every block computed under the causal mask (none skipped) and normalised by torch.softmax: a row that
    # sees no key of a block is softmax over -inf alone, NaN
    "q24_nan_masked": Mistake("q24", [
        ("""    if src == rank:
        return every, every, True""", """    if True:                                    # the mask does the rest
        return every, every, True"""),
        ("""                block_out = torch.exp(s - finite[..., None]) @ kv[1][..., ks, :]""",
         """                block_out = torch.softmax(s, dim=-1) @ kv[1][..., ks, :]"""),
    ]),
    # q24: zigzag shards taken for contiguous ones: positions, and the blocks skipped, as if rank r held chunk r
    "q24_zigzag_as_contiguous": Mistake("q24", [
        ("""    if layout == "contiguous":
        return torch.arange(rank * rows, (rank + 1) * rows)""",
         """    if True:                                    # rank r holds rows r * rows to (r + 1) * rows
        return torch.arange(rank * rows, (rank + 1) * rows)"""),
        ("""    if layout == "contiguous":
        return (every, every, False) if src < rank else None""",
         """    if True:
        return (every, every, False) if src < rank else None"""),
    ]),
    # q24: the ring turned the other way round: sends to the previous rank, receives from the next
    "q24_wrong_neighbour": Mistake("q24", [
        ("""    ops = [dist.P2POp(dist.isend, t, group=group, group_peer=(rank + 1) % n) for t in sends]
    ops += [dist.P2POp(dist.irecv, t, group=group, group_peer=(rank - 1) % n) for t in recvs]""",
         """    ops = [dist.P2POp(dist.isend, t, group=group, group_peer=(rank - 1) % n) for t in sends]
    ops += [dist.P2POp(dist.irecv, t, group=group, group_peer=(rank + 1) % n) for t in recvs]"""),
    ]),
    # q24: the backward passes K and V round again but keeps the gradients of every block it saw in one buffer, its
    # own: dK and dV never travel home
    "q24_no_grad_home": Mistake("q24", [
        ("""            if n > 1:
                came = torch.empty_like(dkv)
                for r in exchange([dkv], [came], group):
                    r.wait()
                dkv = came
""", ""),
    ]),
    # q24: Ulysses without the reverse all-to-all: the head shards of the whole sequence reshaped to q's shape
    "q24_ulysses_no_reverse": Mistake("q24", [
        ("""    q, k, v = (SeqToHeads.apply(t, group) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return HeadsToSeq.apply(out, group)""",
         """    shape = q.shape
    q, k, v = (SeqToHeads.apply(t, group) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return out.reshape(shape)                   # back to this rank's shape"""),
    ]),
    # q24: the prediction with Ulysses' four whole shards (an all-to-all keeps 1/P on the rank) and the contiguous
    # balance counted per visible score ((2N - 1)/N: the diagonal block's half)
    "q24_prediction_whole_shards": Mistake("q24", [
        ("""    return {"ring": 2 * 7 * 512 * 32 * 128 * 2, "ulysses": 4 * 512 * 32 * 128 * 2 * 7 / 8,
            "contiguous": 16 / 9, "zigzag": 1.0}""",
         """    return {"ring": 2 * 7 * 512 * 32 * 128 * 2, "ulysses": 4 * 512 * 32 * 128 * 2,
            "contiguous": 15 / 8, "zigzag": 1.0}"""),
    ]),
    # q24, a student's three: the gradients kept where they were computed, Ulysses without the reverse all-to-all,
    # and Ulysses' bytes counted as four whole shards
    "q24_ines": Mistake("q24", [
        ("""    q, k, v = (SeqToHeads.apply(t, group) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return HeadsToSeq.apply(out, group)""",
         """    shape = q.shape
    q, k, v = (SeqToHeads.apply(t, group) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return out.reshape(shape)                   # back to this rank's shape"""),
        ("""    return {"ring": 2 * 7 * 512 * 32 * 128 * 2, "ulysses": 4 * 512 * 32 * 128 * 2 * 7 / 8,""",
         """    return {"ring": 2 * 7 * 512 * 32 * 128 * 2, "ulysses": 4 * 512 * 32 * 128 * 2,"""),
    ], base="q24_no_grad_home"),
    # q25: no counts exchanged: every expert's slot padded to the most it could hold (T k rows), so the receiver
    # knows the sizes without asking; the values are right, the bytes many times what the routing needs
    "q25_counts_not_exchanged": Mistake("q25", [
        ("""    send = torch.bincount(expert, minlength=E).view(ep, L)    # [rank j, its expert l]: rows this rank sends
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=ep_group)    # [rank j, my expert l]: rows rank j sends me
    send_rows, recv_rows = send.sum(1).tolist(), recv.sum(1).tolist()
    got = AllToAll.apply(x[rows], send_rows, recv_rows, ep_group)   # by source rank, then local expert
    pieces = list(torch.split(got, recv.flatten().tolist()))""",
         """    send = torch.bincount(expert, minlength=E)
    P = x.shape[0] * routing.experts.shape[1]       # no counts to exchange: each expert's slot holds T k rows
    start = torch.cumsum(send, 0) - send
    slots = expert * P + torch.arange(len(expert)) - start[expert]
    padded = x.new_zeros((E * P, x.shape[1])).index_copy(0, slots, x[rows])
    send_rows = recv_rows = [L * P] * ep
    got = AllToAll.apply(padded, send_rows, recv_rows, ep_group)
    pieces = list(torch.split(got, [P] * (ep * L)))"""),
        ("""            "sizes": [pieces[i].shape[0] for i in by_expert], "by_expert": by_expert, "T": x.shape[0]}
    return tokens, recv.sum(0).tolist(), meta""",
         """            "sizes": [pieces[i].shape[0] for i in by_expert], "by_expert": by_expert, "T": x.shape[0],
            "slots": slots}
    return tokens, [ep * P] * L, meta"""),
        ("""    out = y.new_zeros((meta["T"], y.shape[1]))""",
         """    back = back[meta["slots"]]
    out = y.new_zeros((meta["T"], y.shape[1]))"""),
    ]),
    # q25: combine adds the experts' outputs without the router's weights
    "q25_combine_unweighted": Mistake("q25", [
        ("""    return out.index_add(0, meta["rows"], meta["weights"].unsqueeze(1) * back)""",
         """    return out.index_add(0, meta["rows"], back)"""),
    ]),
    # q25: capacity taken token by token (each token's choices in turn), not every first choice first
    "q25_capacity_token_major": Mistake("q25", [
        ("""        for j in range(k):                       # every first choice, then every second choice
            for t in range(x.shape[0]):""",
         """        for t in range(x.shape[0]):              # token by token
            for j in range(k):"""),
    ]),
    # q25: the experts' gradients averaged over dp only, as the dense ones are: the ep ranks' terms, summed by the
    # all-to-all's backward, stay summed (ep times too large)
    "q25_grads_not_divided": Mistake("q25", [
        ("""        p.grad /= groups.ep_size * groups.dp_size""", """        p.grad /= groups.dp_size"""),
    ]),
    # q25: the experts' gradients divided by ep twice
    "q25_divided_twice": Mistake("q25", [
        ("""        p.grad /= groups.ep_size * groups.dp_size""",
         """        p.grad /= groups.ep_size * groups.ep_size * groups.dp_size"""),
    ]),
    # q25: combine adds each output at the token order of before dispatch's sort per expert: the rows come back in
    # the order they were sent, grouped per expert, not in the tokens' order
    "q25_wrong_order": Mistake("q25", [
        ("""    meta = {"rows": rows, "weights": weights,""", """    meta = {"rows": token[kept], "weights": weights,"""),
    ]),
    # q25: the prediction counts the rows a rank sends itself (T k rows each way, none stays local)
    "q25_local_rows_counted": Mistake("q25", [
        ("""    return {"forward_bytes": 2 * 512 * 2 * 3 / 4 * 64 * 4, "backward_bytes": 2 * 512 * 2 * 3 / 4 * 64 * 4,""",
         """    return {"forward_bytes": 2 * 512 * 2 * 64 * 4, "backward_bytes": 2 * 512 * 2 * 64 * 4,"""),
    ]),
    # q25: the tokens' all-to-alls through torch's functional collectives (all_to_all_single_autograd): right values,
    # but a call the lab does not record (its C++ op goes around torch.distributed's Python entry points)
    "q25_functional_collectives": Mistake("q25", [
        ("""import torch.distributed as dist
""", """import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
"""),
        ("""    got = AllToAll.apply(x[rows], send_rows, recv_rows, ep_group)   # by source rank, then local expert""",
         """    got = funcol.all_to_all_single_autograd(x[rows], recv_rows, send_rows, ep_group)"""),
        ("""    back = AllToAll.apply(torch.cat(by_source), meta["recv_rows"], meta["send_rows"], ep_group)""",
         """    back = funcol.all_to_all_single_autograd(torch.cat(by_source), meta["send_rows"], meta["recv_rows"], ep_group)"""),
    ]),
    # q25, a student's two: the experts' gradients not divided by ep, and the prediction counting local rows
    "q25_not_divided_local_rows": Mistake("q25", [
        ("""    return {"forward_bytes": 2 * 512 * 2 * 3 / 4 * 64 * 4, "backward_bytes": 2 * 512 * 2 * 3 / 4 * 64 * 4,""",
         """    return {"forward_bytes": 2 * 512 * 2 * 64 * 4, "backward_bytes": 2 * 512 * 2 * 64 * 4,"""),
    ], base="q25_grads_not_divided"),
    # q27: every rank saves the parameters whole (every rank holds them whole under q21) in its own file, beside its
    # moments: the disk holds them n times; the load reads its slice of the parameters from the first file
    "q27_whole_params_every_rank": Mistake("q27", [
        ("""    folder = Path(folder)
    with open(folder / f"shard{dp.rank}.bin", "wb") as f:""",
         """    shards["params"] = flat              # every rank holds the parameters whole: save them whole
    folder = Path(folder)
    with open(folder / f"shard{dp.rank}.bin", "wb") as f:"""),
        ("""            for k, name in enumerate(meta["tensors"]):
                f.seek((k * meta["length"] + lo - meta["offset"]) * size)""",
         """            for k, name in enumerate(meta["tensors"]):
                if name == "params":             # every file holds them whole
                    f.seek(lo * size)
                else:
                    f.seek((meta["total"] + (k - 1) * meta["length"] + lo - meta["offset"]) * size)"""),
    ]),
    # q27: the load cuts its new shard as torch.chunk does (ceil(N / m) each), not torch.tensor_split
    "q27_torch_chunk": Mistake("q27", [
        ("""    base, extra = divmod(total, dp.size)
    start = dp.rank * base + min(dp.rank, extra)
    end = start + base + (1 if dp.rank < extra else 0)""",
         """    piece = -(-total // dp.size)                # as torch.chunk cuts
    start, end = min(total, dp.rank * piece), min(total, (dp.rank + 1) * piece)"""),
    ]),
    # q27: the load reads every file it needs whole, then slices it in memory
    "q27_whole_files": Mistake("q27", [
        ("""        with open(folder / meta["file"], "rb") as f:
            for k, name in enumerate(meta["tensors"]):
                f.seek((k * meta["length"] + lo - meta["offset"]) * size)
                f.readinto(out[name][lo - start:hi - start].view(torch.uint8).numpy())""",
         """        data = torch.frombuffer(bytearray((folder / meta["file"]).read_bytes()), dtype=dtype)   # the whole file
        for k, name in enumerate(meta["tensors"]):
            first = k * meta["length"] + lo - meta["offset"]
            out[name][lo - start:hi - start] = data[first:first + hi - lo]"""),
    ]),
    # q27: no offsets or lengths in the metadata: the load takes the old shards to be even (N // n each, the last
    # the rest), which tensor_split's are not where N % n != 0
    "q27_offsets_guessed": Mistake("q27", [
        ("""    meta = {"total": flat.numel(), "offset": offset, "length": sizes[dp.rank], "dtype": str(flat.dtype),""",
         """    meta = {"total": flat.numel(), "dtype": str(flat.dtype),"""),
        ("""    metas = sorted((json.loads(p.read_text()) for p in folder.glob("shard*.json")), key=lambda m: m["offset"])""",
         """    metas = sorted((json.loads(p.read_text()) for p in folder.glob("shard*.json")), key=lambda m: m["file"])
    for i, meta in enumerate(metas):             # each old shard N // n long, the last the rest
        meta["offset"] = i * (meta["total"] // len(metas))
        meta["length"] = meta["total"] // len(metas) if i < len(metas) - 1 else meta["total"] - meta["offset"]"""),
    ]),
    # q27: the step count is not saved; the load starts it again at 0
    "q27_step_not_saved": Mistake("q27", [
        ("""            "tensors": list(shards), "step": int(state["step"]), "file": f"shard{dp.rank}.bin"}""",
         """            "tensors": list(shards), "file": f"shard{dp.rank}.bin"}"""),
        ("""    return {"step": metas[0]["step"], **out}""", """    return {"step": 0, **out}"""),
    ]),
    # q27: the moments are saved, not the parameters' shard (the optimizer's state is what the checkpoint is for)
    "q27_no_params": Mistake("q27", [
        ("""    shards = {"params": flat[offset:offset + sizes[dp.rank]], "exp_avg": state["exp_avg"],
              "exp_avg_sq": state["exp_avg_sq"]}""",
         """    shards = {"exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}      # AdamW's state"""),
    ]),
    # q27, a student's two: torch.chunk's pieces in the load, and the prediction's whole files counting every file
    "q27_chunk_every_file": Mistake("q27", [
        ("""    return {"bytes_rank1": 3_999_996, "files_rank1": 2, "whole_files_rank1": 6_000_000}""",
         """    return {"bytes_rank1": 3_999_996, "files_rank1": 2, "whole_files_rank1": 12_000_000}"""),
    ], base="q27_torch_chunk"),

    # q26: the shard gathered in float32 and cast after the gather: the values are right, the gathers carry float32's
    # bytes (twice the compute dtype's)
    "q26_gather_float32": Mistake("q26", [
        ("""        full = module.dp.all_gather(shard.detach().to(module.dtype))       # half the bytes of float32""",
         """        full = module.dp.all_gather(shard.detach()).to(module.dtype)"""),
        ("""        full = module.dp.all_gather(module.shard.detach().to(module.dtype)).requires_grad_()""",
         """        full = module.dp.all_gather(module.shard.detach()).to(module.dtype).requires_grad_()"""),
    ]),
    # q26: the flat gradient reduce-scattered in the compute dtype and cast to float32 after: the sum rounds at
    # every add of the ring
    "q26_reduce_low_precision": Mistake("q26", [
        ("""        grad_shard = module.dp.reduce_scatter(grads[-1].float()) / module.dp.size     # summed in float32""",
         """        grad_shard = module.dp.reduce_scatter(grads[-1]).float() / module.dp.size"""),
    ]),
    # q26: the master copy kept in the compute dtype (the shard cast once, at the start): small updates are lost
    "q26_master_low_precision": Mistake("q26", [
        ("""        self.shard = nn.Parameter(torch.tensor_split(flat, dp.size)[dp.rank].clone())   # the float32 master""",
         """        self.shard = nn.Parameter(torch.tensor_split(flat, dp.size)[dp.rank].clone().to(compute_dtype))"""),
    ]),
    # q26: each rank decides alone whether its gradients hold an inf: only the rank with the inf skips
    "q26_inf_not_agreed": Mistake("q26", [
        ("""        self.dp.all_reduce(found)       # one rank's inf makes every rank skip
""", ""),
    ]),
    # q26: a step with an inf is skipped, but the scale is not halved
    "q26_scale_not_halved": Mistake("q26", [
        ("""            self.current *= self.backoff_factor
""", ""),
    ]),
    # q26: the scale is never grown after a run of clean steps
    "q26_never_grows": Mistake("q26", [
        ("""            if self.clean == self.growth_interval:
                self.current *= self.growth_factor
                self.clean = 0
""", ""),
    ]),
    # q26: the step taken even when a gradient holds an inf (the scale halved all the same)
    "q26_not_skipped": Mistake("q26", [
        ("""        if not self.found_inf:
            optimizer.step()""", """        optimizer.step()"""),
    ]),
    # q26: the prediction's gather in float32's bytes
    "q26_gather_predicted_float32": Mistake("q26", [
        ("""    return {"gather": 12_704 * 2,""", """    return {"gather": 12_704 * 4,"""),
    ]),
    # q26 (cohort student lior): the shard gathered in float32 and cast after, and each rank deciding alone whether
    # its gradients hold an inf
    "q26_lior": Mistake("q26", [
        ("""        full = module.dp.all_gather(shard.detach().to(module.dtype))       # half the bytes of float32""",
         """        full = module.dp.all_gather(shard.detach()).to(module.dtype)"""),
        ("""        full = module.dp.all_gather(module.shard.detach().to(module.dtype)).requires_grad_()""",
         """        full = module.dp.all_gather(module.shard.detach()).to(module.dtype).requires_grad_()"""),
        ("""        self.dp.all_reduce(found)       # one rank's inf makes every rank skip
""", ""),
    ]),
}
