"""Hidden tests of q14 (dp_pp_step): the student's step on grids of 4 ranks (1 x 4, 4 x 1 and 2 x 2, tied
and untied, uneven layers, float64, other seeds), with the reference answers of q02..q08 inside it,
compared with the single-process baseline of the global batch; and the prediction of the bytes a step
sends, read from the answer cell's `predicted_bytes()` as numbers (parsed, never run).

Three parts, each a third of the points:
    data parallel    per grid: coordinates, groups, shards, outputs, losses, gradients, real pipelines
    tied embeddings  per tied grid: the tied all-reduce's group, the copies equal after a step, their gradient
    prediction       the three byte counts of PREDICTION_CONFIG
"""
from __future__ import annotations


from lab_src.topics.dp_pp.judge import failure_problems, judge_grid
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.dp_pp.traffic import PREDICTION_CONFIG, PREDICTION_NAME, TRAFFIC_KINDS

from .common import Item, case_problems, judge_prediction

QID = "q14"

# Simplest first: an answer that keeps crashing the 2 x 2 grids still gets the others graded.
GRIDS = {
    "1 x 4, tied": LabConfig(num_stages=4, num_layers=8, num_microbatches=2, global_batch_size=8, tie_embeddings=True),
    "4 x 1, tied, seed 5": LabConfig(num_stages=1, num_layers=3, num_microbatches=2, global_batch_size=16, dp_size=4,
                                     tie_embeddings=True, seed=5),
    "2 x 2, tied": PREDICTION_CONFIG,
    "2 x 2, tied, uneven layers, float64, seed 7": LabConfig(num_stages=2, num_layers=5, num_microbatches=2,
                                                             global_batch_size=8, dp_size=2, tie_embeddings=True,
                                                             seed=7, dtype="float64"),
    "2 x 2, untied, more micro-batches": LabConfig(num_stages=2, num_layers=4, num_microbatches=4, global_batch_size=16,
                                                  dp_size=2, seed=11),
}
TOLERANCE = 0.005   # a prediction within half a percent counts


def cases(ctx):
    ctx.baselines.add(GRIDS.values())          # judged here, never handed to the ranks
    return [ctx.case(QID, "grid", cfg, stages=cfg.world_size, label=label) for label, cfg in GRIDS.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        failed = stamped(failure_problems(out), QID, label) if case_problems(QID, out, label) else []
        dp = Item("data parallel", label, list(failed))
        tied = Item("tied embeddings", label, list(failed)) if out.case.config.tie_embeddings else None
        if not failed:
            verdict = judge_grid(out, ctx.baselines[out.case.config])
            dp.problems += stamped(verdict.data_parallel, QID, label)
            if tied is not None:
                tied.problems += stamped(verdict.tied, QID, label)
        items += [dp] + ([tied] if tied is not None else [])
    return items + prediction_items(ctx)


# ---- the prediction ---------------------------------------------------------------------------------
def expected_bytes(cfg: LabConfig, distribute_layers) -> dict[str, int]:
    """The bytes of one step of `cfg` by kind (topics/dp_pp/traffic.py), from the configuration alone."""
    from lab_src.pipeline.model import build_piece
    dp, pp, m = cfg.dp_size, cfg.num_stages, cfg.num_microbatches
    elem = 8 if cfg.dtype == "float64" else 4
    mbs = cfg.global_batch_size // (dp * m)
    activation = mbs * cfg.seq_len * cfg.hidden_size * elem
    sizes = {name: sum(p.numel() for p in build_piece(cfg, name).parameters())
             for name in ["embed", "head"] + [f"blocks.{i}" for i in range(cfg.num_layers)]}
    stage_params = []
    for p in range(pp):
        n = sum(sizes[f"blocks.{i}"] for i in distribute_layers(cfg.num_layers, p, pp))
        n += sizes["embed"] if p == 0 else 0
        n += sizes["head"] if p == pp - 1 else 0
        if pp == 1 and cfg.tie_embeddings:       # one stage: one shared parameter, not two
            n -= cfg.vocab_size * cfg.hidden_size
        stage_params.append(n)
    tied = cfg.tie_embeddings and pp > 1
    return {"pipeline": dp * 2 * (pp - 1) * m * activation,
            "data_parallel": dp * sum(stage_params) * elem if dp > 1 else 0,
            "tied": dp * 2 * cfg.vocab_size * cfg.hidden_size * elem if tied else 0}


HINTS = {
    "pipeline": "every pipeline sends each micro-batch's activation forward across each of its pp_size - 1 "
                "boundaries, and the activation's gradient (the same size) back",
    "data_parallel": "every rank hands all the gradients of its stage (tied copy included) to its data-parallel "
                     "all-reduce, in every replica",
    "tied": "the first and the last stage of every pipeline each hand their copy's gradient (vocab x hidden) "
            "to the tied all-reduce",
}


def prediction_items(ctx) -> list[Item]:
    want = expected_bytes(PREDICTION_CONFIG, ctx.reference_fn("q05"))

    def wrong(k, got, want):
        ratio = f" ({got / want:.3g}x)" if want else ""
        return f"the predicted {k} bytes are {got:,.0f}; one step sends {want:,}{ratio}: {HINTS[k]}"
    return judge_prediction(ctx, QID, PREDICTION_NAME, {k: want[k] for k in TRAFFIC_KINDS}, wrong,
                            close=lambda got, want: abs(got - want) <= TOLERANCE * max(want, 1))
