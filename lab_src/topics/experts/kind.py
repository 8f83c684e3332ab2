"""Kind "moe" (q25): the lab's MoE model (moe.py) on a (dp, ep) mesh of the case's ranks, its experts' part run by the
answer's route, dispatch and combine, its gradients made right by the answer's sync_gradients; `steps` SGD steps.

Each rank builds the dense pieces (embedding, attention, routers, head) and only its own experts (ep rank c holds
experts c L .. c L + L - 1), and reads its own rows of each step's batch. In each MoE layer:

    routing = route(x, block.router, k, capacity_factor)            x: (T, h), the rank's tokens after the LayerNorm
    tokens, per_expert, meta = dispatch(x, routing, ep_group)        tokens grouped per local expert
    y = the rank's experts, each on its slice of tokens (the lab's)
    out = combine(y, meta, ep_group)                                  (T, h), added to the residual

then the rank's mean cross-entropy, its backward, `sync_gradients(dense, experts, groups)` (every parameter given a
.grad first: zeros where the step left none), one SGD step. Recorded per rank (plain values, never a verdict): step 0's
logits, each layer's routing (as route returned it), tokens per local expert and combine's output, every gradient after
the sync, each step's loss, and every all-to-all-single the answer called in step 0's forward and backward, with its
splits (comm/collectives.py ALL_TO_ALL). A rank that raises ends its part; `part` says where.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from lab_src import answers, exercises
from lab_src.comm import collectives as coll
from lab_src.comm.mesh import Mesh
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.topics.experts import moe as lab_moe
from lab_src.topics.experts.records import local_experts

FUNCTIONS = ("route", "combine", "sync_gradients")


def answer_functions() -> dict:
    """route, combine and sync_gradients, defined in the answer cell beside dispatch."""
    qid = exercises.dispatch.exercise.id
    fn = answers.load(qid)
    if fn is None:
        raise answers.StubCalled(answers.stub_message(qid))
    scope = getattr(fn, "__globals__", {})
    missing = [name for name in FUNCTIONS if not callable(scope.get(name))]
    if missing:
        raise answers.AnswerError(f"{qid}: your answer cell must define {', '.join(missing)} beside dispatch (see the "
                                  f"contract of dispatch)")
    return {name: _stub_named(scope[name], qid) for name in FUNCTIONS}


def _stub_named(fn, qid: str):
    """`fn`, a bare NotImplementedError from it (the release's stub) said as the exercise's stub is."""
    def called(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NotImplementedError as e:
            if str(e):
                raise
            raise answers.StubCalled(f"{qid} {fn.__name__}() is still the stub from the release (raise "
                                     f"NotImplementedError()): replace it with your code in "
                                     f"{exercises.dispatch.exercise.notebook}") from None
    called.__name__ = getattr(fn, "__name__", "function")
    return called


def _plain(t):
    return t.detach().cpu().clone() if isinstance(t, torch.Tensor) else None


def run(case: Case, ctx, group, tracer, obs) -> None:
    settings = settings_of(case)
    obs["part"] = "setup"
    try:
        with coll.bounded(range(case.stages)):
            mesh = Mesh.of(case, ctx, whole=group).build("ep", "dp")
            try:
                _steps(case, settings, mesh, group, obs)
                observe.finish_messages(None, group, tracer)
            finally:
                coll.ALL_TO_ALL = None
                mesh.destroy()
    finally:
        observe.record_instrumentation(obs, tracer)


def _steps(case, settings, mesh, group, obs) -> None:
    cfg = case.config
    fns = answer_functions()
    coords = mesh.coords()
    ep_group, dp_group = mesh.group("ep"), mesh.group("dp")
    owned = local_experts(coords["ep"], settings.experts, settings.ep)
    obs["coords"], obs["owned"] = coords, owned
    model = lab_moe.MoeModel(cfg, settings.experts, owned, settings.dtype, lab_moe.starved_experts(settings))
    model.train()
    groups = SimpleNamespace(ep=ep_group, dp=dp_group, world=group, ep_size=settings.ep,
                             dp_size=case.stages // settings.ep, ep_rank=coords["ep"], dp_rank=coords["dp"])
    T = settings.batch * cfg.seq_len
    obs["tokens"] = T
    layers, record = [], [True]
    obs["moe_layers"] = layers

    def moe(block, index, x):
        rec = {} if record[0] else None
        if rec is not None:
            layers.append(rec)
            rec["x"] = _plain(x)
        routing = fns["route"](x, block.router, settings.k, settings.capacity_factor)
        if rec is not None:
            rec.update({name: _plain(getattr(routing, name, None)) for name in ("experts", "weights", "keep")})
        tokens, per_expert, meta = exercises.dispatch(x, routing, ep_group)
        per_expert = [int(n) for n in (per_expert.tolist() if isinstance(per_expert, torch.Tensor) else per_expert)]
        if rec is not None:
            rec["per_expert"] = per_expert
        if len(per_expert) != len(owned) or sum(per_expert) != tokens.shape[0]:
            raise ValueError(f"dispatch returned {tokens.shape[0]} tokens and tokens_per_expert {per_expert}: this rank "
                             f"holds {len(owned)} experts {owned}, so tokens_per_expert has {len(owned)} counts that "
                             f"add up to the tokens' rows")
        ys = [block.experts[str(e)](chunk) for e, chunk in zip(owned, torch.split(tokens, per_expert))]
        y = torch.cat(ys) if ys else tokens
        out = fns["combine"](y, meta, ep_group)
        if rec is not None:
            rec["combined"] = _plain(out)
        return out

    obs["losses"], obs["a2a"] = [], {"forward": [], "backward": []}
    for step in range(settings.steps):
        record[0] = step == 0
        tokens, targets = lab_moe.batch(cfg, settings, step, mesh.rank, case.stages)
        obs["part"] = f"step {step}, forward"
        coll.ALL_TO_ALL = obs["a2a"]["forward"] if step == 0 else None
        logits = model(tokens, moe)
        loss = lab_moe.loss_of(logits, targets)
        obs["losses"].append(loss.item())
        if step == 0:
            obs["logits"] = _plain(logits)
        obs["part"] = f"step {step}, backward"
        coll.ALL_TO_ALL = obs["a2a"]["backward"] if step == 0 else None
        model.zero_grad(set_to_none=True)
        loss.backward()
        coll.ALL_TO_ALL = None
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        obs["part"] = f"step {step}, sync_gradients"
        fns["sync_gradients"](model.dense_parameters(), model.expert_parameters(), groups)
        if step == 0:
            obs["grads"] = {n: _plain(p.grad) for n, p in model.named_parameters()}
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= settings.lr * p.grad
    obs["part"] = "done"
