"""Hidden tests of q15 (interleaved_step): interleaved pipelines of 2 to 4 ranks with 1, 2 and 4 chunks per
rank, as many micro-batches as ranks and more, uneven layers, float64 and other seeds. Each run is
compared with the baseline and judged against Interleaved 1F1B's program and rules (lab_src/topics/interleaved/judge.py):
the chunks' blocks, the messages per chunk with the wrap-around from the last rank to the first, the
memory bound and the order in which the chunks are visited; and the prediction of the bubble and the
messages for v = 1, 2 and 4 (predicted_interleaving(), read from the answer file, never run). In every case rank
0 changes its embedding once built (pipeline/perturb.py), and the outputs must follow."""
from pathlib import Path

from lab_src.topics.interleaved.judge import PREDICTION_NAME, check_interleaved_run, interleaved_errors, prediction_problems
from lab_src.judge.numeric import NotANumber, read_numbers
from lab_src.judge.problems import Problem, stamped
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.schedules import Interleaved1F1B
from lab_src.registry import exercise

from .common import Item, compare_numbers, perturbing

QID = "q15"

# label -> (configuration, chunks per rank); simplest first (an answer that deadlocks stops being tried
# after two cases). The number of micro-batches is a multiple of the ranks, as Interleaved 1F1B needs.
CONFIGS = {
    "2 ranks, 2 chunks, 2 micro-batches": (LabConfig(num_stages=2, num_layers=4, num_microbatches=2,
                                                     global_batch_size=4), 2),
    "2 ranks, 4 chunks, 4 micro-batches": (LabConfig(num_stages=2, num_layers=8, num_microbatches=4,
                                                     global_batch_size=8), 4),
    "4 ranks, 2 chunks, 8 micro-batches": (LabConfig(num_stages=4, num_layers=8, num_microbatches=8,
                                                     global_batch_size=16), 2),
    "3 ranks, 2 chunks, uneven layers, seed 7": (LabConfig(num_stages=3, num_layers=7, num_microbatches=3,
                                                           global_batch_size=6, seed=7), 2),
    "4 ranks, 2 chunks, float64, seed 123": (LabConfig(num_stages=4, num_layers=8, num_microbatches=4,
                                                       global_batch_size=8, seed=123, dtype="float64"), 2),
    # the contract allows one chunk per rank: Interleaved 1F1B's warm-up 2(p - r - 1), not 1F1B's
    "2 ranks, 1 chunk, 4 micro-batches": (LabConfig(num_stages=2, num_layers=4, num_microbatches=4,
                                                    global_batch_size=8), 1),
}


def cases(ctx):
    ctx.baselines.add(cfg for cfg, _ in CONFIGS.values())
    return [ctx.case(QID, "interleaved", cfg, label=label, schedule=Interleaved1F1B(v).name,
                     settings=perturbing(cfg)) for label, (cfg, v) in CONFIGS.items()]


def judge(ctx, outcomes):
    items = []
    ref_layers = ctx.reference_fn("q05")
    for out in outcomes:
        label = out.case.label
        item = Item("pipelines", label, stamped(interleaved_errors(out), QID, label),
                    credit=exercise(QID).other_schedule_credit)
        if not item.problems:
            cfg, p = out.case.config, out.case.stages
            # the pipeline's own faults first: a swapped message or a wrong peer explains wrong numbers
            item.problems += stamped(check_interleaved_run(out) + compare_numbers(ctx, out), QID, label)
            for r, o in sorted(out.obs.items()):
                for c, got in enumerate(o.get("chunk_layers") or []):
                    s, virtual = c * p + r, len(o["chunk_layers"]) * p
                    want = ref_layers(cfg.num_layers, s, virtual)
                    if got != want:
                        item.problems.append(Problem(f"chunk {c} (virtual stage {s}) holds blocks {got}; it "
                                                     f"should hold {want}", exercise=QID, rank=r, case=label))
        items.append(item)
    return items + [prediction_item(ctx)]


def prediction_item(ctx) -> Item:
    """The bubble and the messages of v = 1, 2, 4 chunks (topics/interleaved/judge.py), read from the answer file, never
    run: one item among the pipelines."""
    path = ctx.student.get(QID)
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), PREDICTION_NAME) if path else {}
        problems = prediction_problems(got)
    except NotANumber as e:
        problems = [Problem(f"the prediction could not be read: {e}")]
    return Item("pipelines", "prediction", stamped(problems, QID, "prediction"))
