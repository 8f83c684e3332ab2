"""Visible check of q03 (activation_shape): the embedding of a micro-batch, a block and the head, each run on a
tensor of the answer's shape in its own rank."""
from __future__ import annotations

from lab_src.checks.common import CheckReport, VISIBLE, errors, finish, make_case, run_cases, run_dir, sources
from lab_src.judge.problems import Problem


def check() -> CheckReport:
    srcs = sources("q03")
    cfg = VISIBLE
    problems, lines = [], [f"q03 activation_shape, {cfg.describe()}"]
    run = run_cases([make_case("shapes", cfg, srcs, "q03")], run_dir("q03"))
    out = run.outcomes[0]
    problems += errors(out, "q03", cfg.describe())
    for r, o in sorted(out.obs.items()):
        shape = o.get("activation_shape")
        if r == 0 and "embed" in o:
            got = o["embed"]
            lines.append(f"  rank 0: the embedding of a micro-batch of tokens has shape {_shape(got)}; "
                         f"your activation_shape says {shape}")
            if got.get("value", {}).get("tensor_shape") != shape:
                problems.append(Problem(f"the first stage sends a tensor of shape {_shape(got)}, "
                                        f"but receivers would allocate {shape}", exercise="q03", rank=0))
        if "block" in o:
            got = o["block"]
            lines.append(f"  rank {r}: a block maps a tensor of shape {shape} to {_shape(got)}")
            if got["outcome"] != "returned" or got["value"].get("tensor_shape") != shape:
                problems.append(Problem(f"a block cannot take an input of shape {shape} and give the same "
                                        f"shape back: {_shape(got)}", exercise="q03", rank=r))
        if "head" in o:
            lines.append(f"  rank {r} (last): the head turns it into logits of shape {_shape(o['head'])}, "
                         f"which stay on this rank")
    return finish("q03", run, problems, lines)


def _shape(attempted: dict) -> str:
    if attempted.get("outcome") == "returned":
        v = attempted["value"]
        return str(tuple(v["tensor_shape"])) if isinstance(v, dict) and "tensor_shape" in v else repr(v)
    return f"an error ({attempted.get('type')}: {attempted.get('message', '')[:120]})"
