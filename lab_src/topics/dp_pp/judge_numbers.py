"""The numbers of a run on a data-parallel x pipeline-parallel grid (q14): every replica's starting weights,
outputs, losses and gradients against the single-process baseline of the global batch, and the tied
embedding's copies and gradient (judge.py's verdict; its docstring says what each part checks)."""
from __future__ import annotations


import torch

from lab_src.judge.compare import close, compare_loss, compare_outputs, explain_scale, scale_between
from lab_src.judge.problems import Problem
from lab_src.topics.dp_pp.records import TIED_NAMES, Layout

def shard_baseline(baseline: dict, lay: Layout, d: int) -> dict:
    """The baseline's output and loss for replica d's shard of the global batch."""
    out = baseline["output"]
    n = out.shape[0] // lay.dp
    part = out[d * n:(d + 1) * n]
    return {"output": part, "loss": float(part.double().mean())}


def weight_problems(obs: dict, lay: Layout, cfg) -> list[Problem]:
    """Every replica's stage starts from the weights the run seed gives its pieces (a checksum each)."""
    from lab_src.pipeline.model import build_piece
    want: dict[str, float] = {}
    problems = []
    for r, o in sorted(obs.items()):
        got = o.get("weights") or {}
        for name, value in got.items():
            piece = name.split(".")[0] if not name.startswith("blocks.") else ".".join(name.split(".")[:2])
            if name not in want:
                built = build_piece(cfg, piece)
                want.update({f"{piece}.{n}": float(t.detach().double().sum()) for n, t in built.named_parameters()})
            if name in want and abs(value - want[name]) > 1e-4 * (1 + abs(want[name])):
                d, p = lay.coords(r)
                problems.append(Problem(f"replica {d}'s stage {p} starts from other weights than the run seed "
                                        f"gives ({name} differs): every replica must build its stage from the same "
                                        f"cfg (the same seed), so that the replicas hold the same model; only "
                                        f"their data differs", rank=r))
                break
    return problems


def number_problems(obs: dict, lay: Layout, cfg, baseline: dict) -> list[Problem]:
    problems = weight_problems(obs, lay, cfg)
    if problems:
        return problems
    m = cfg.num_microbatches
    shards = [shard_baseline(baseline, lay, d) for d in range(lay.dp)]
    for d in range(lay.dp):
        last = d * lay.pp + lay.pp - 1
        got = obs.get(last, {}).get("outputs")
        other = _matching_shard(got, shards, m) if got else None
        if other is not None and other != d:
            problems.append(Problem(f"replica {d}'s outputs are those of shard {other}: it read replica {other}'s "
                                    f"samples", rank=last))
            continue
        problems += compare_outputs(obs.get(last, {}), shards[d], m, last)
        problems += compare_loss(obs.get(last, {}), shards[d], m, last)
    for r, o in sorted(obs.items()):
        problems += grad_problems(o, lay, baseline, r)
        if lay.coords(r)[1] != lay.pp - 1 and (o.get("outputs") or o.get("loss") is not None):
            problems.append(Problem("a stage other than the last returned outputs or a loss; return what "
                                    "afab_step returned there ([], None)", rank=r))
    return problems


def _matching_shard(outputs, shards, m) -> int | None:
    for e, shard in enumerate(shards):
        chunks = shard["output"].chunk(m)
        if len(outputs) == len(chunks) and all(close(a, b) for a, b in zip(outputs, chunks)):
            return e
    return None


def grad_problems(o: dict, lay: Layout, baseline: dict, rank: int) -> list[Problem]:
    """Every gradient but the tied embedding's against the baseline, explained in data-parallel terms."""
    grads = o.get("grads") or {}
    base = baseline["grads"]
    missing = [n for n, g in grads.items() if g is None]
    if missing:
        return [Problem(f"{len(missing)} parameters have no gradient ({missing[0]}, ...)", rank=rank)]
    names = [n for n in grads if n not in TIED_NAMES]
    wrong = [n for n in names if not close(grads[n], base[n])]
    if not wrong:
        return []
    got = torch.cat([grads[n].reshape(-1).double() for n in wrong])
    want = torch.cat([base[n].reshape(-1).double() for n in wrong])
    return [Problem(f"{len(wrong)} of {len(names)} gradients differ from the baseline's over the global batch "
                    f"({', '.join(wrong[:2])}{' ...' if len(wrong) > 2 else ''}): "
                    + explain_dp_scale(scale_between(got, want), lay.dp, got, want), rank=rank)]


def explain_dp_scale(c: float | None, dp: int, got, want) -> str:
    if c is not None and dp > 1 and abs(c - dp) < 1e-3 * dp:
        return (f"they are {dp}x the baseline's, and {dp} is the data-parallel size: the all-reduce summed the "
                f"replicas' gradients; average them (divide by dp_size, or op=\"avg\")")
    if c is not None and dp > 1 and abs(c - 1 / dp) < 1e-3 / dp:
        return f"they are 1/{dp} of the baseline's: the gradients were divided by the data-parallel size twice"
    if c is not None and abs(c - 1) > 1e-3:
        return explain_scale(c, 1)
    return (f"largest difference {float((got - want).abs().max()):.3g}: each replica's gradient is its own "
            f"shard's until they are averaged over the data-parallel set")


def tied_grad_problems(obs: dict, lay: Layout, cfg, baseline: dict) -> list[Problem]:
    if not cfg.tie_embeddings:
        return []
    want = baseline["grads"]["embed.tokens.weight"]
    problems = []
    for d in range(lay.dp):
        first, last = lay.tied_pair(d)[0], lay.tied_pair(d)[-1]
        copies = {r: _tied_grad(obs.get(r, {})) for r in {first, last}}
        if any(g is None for g in copies.values()):
            problems.append(Problem("the tied embedding's copy has no gradient", rank=first))
            continue
        if all(close(g, want) for g in copies.values()):
            continue
        if first != last and close(copies[first] + copies[last], want):
            problems.append(Problem(f"ranks {first} and {last} each hold only their own use's gradient of the "
                                    f"tied embedding (the two add up to the baseline's): sum them over ranks "
                                    f"{[first, last]}", rank=first))
            continue
        for r, g in sorted(copies.items()):
            if not close(g, want):
                c = scale_between(g, want)
                how = explain_scale(c, 1) if c is not None else f"largest difference {float((g - want).abs().max()):.3g}"
                problems.append(Problem(f"the tied embedding's gradient differs from the baseline's: {how}", rank=r))
    return problems


def _tied_grad(o: dict):
    grads = o.get("grads") or {}
    for name in TIED_NAMES:
        if name in grads:
            return grads[name]
    return None


def tied_copy_problems(obs: dict, lay: Layout, cfg) -> list[Problem]:
    """After one SGD step the first and last stage's copies are equal. (That the replicas agree is the
    data-parallel part's business: their gradients and weights are judged there.)"""
    if not cfg.tie_embeddings:
        return []
    problems = []
    for d in range(lay.dp):
        pair = lay.tied_pair(d)
        copies = {r: obs.get(r, {}).get("tied_after_step") for r in pair}
        if any(c is None for c in copies.values()):
            problems.append(Problem("no copy of the tied embedding was found on this stage after the step",
                                    rank=next(r for r, c in copies.items() if c is None)))
            continue
        a, b = copies[pair[0]], copies[pair[-1]]
        if not close(a, b):
            problems.append(Problem(f"after one SGD step the two copies of the tied embedding differ (ranks "
                                    f"{pair[0]} and {pair[-1]}, largest difference "
                                    f"{float((a.double() - b.double()).abs().max()):.3g}): their gradients were "
                                    f"not the same, so the copies drift apart with every step", rank=pair[0]))
    return problems


# ---- each replica a real pipeline -------------------------------------------------------------------
