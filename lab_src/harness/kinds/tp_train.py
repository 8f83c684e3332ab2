"""Kind "tp_train" (q18): the digits model with the answer's tensor-parallel blocks, trained (written below)."""
from __future__ import annotations


def run(case, ctx, group, tracer, obs) -> None:
    raise NotImplementedError("tp_train")
