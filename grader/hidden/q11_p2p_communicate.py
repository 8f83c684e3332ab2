"""Hidden tests of q11 (p2p_communicate): labelled messages with no compute, in the order of a 1F1B step
(the combined operations of its steady state) for 1 to 4 stages and in float64, and in AFAB order (the
four single operations); what every receive got, how its buffer was allocated, the no-ops at the ends;
then full 1F1B pipelines (the reference q12 step) built on the student's operations.

Parts: messages (one item per communication case), receive buffers (the cases with receives that ran to
the end), pipelines, and the prediction of the blocking-sends experiment (read from the answer, not run). Cases that can deadlock come after those that cannot: an exercise whose cases time
out twice is not tried further (harness/worker.py)."""
from pathlib import Path

from lab_src.topics.p2p.judge import judge_p2p, judge_prediction, mutual_sends
from lab_src.judge.problems import Problem, stamped

from .common import Item, case_problems, causes_first, pipeline_item

QID = "q11"
# (grading configuration, schedule whose order the calls follow, label)
COMM = [("a single stage", "1f1b", None), ("one micro-batch", "1f1b", None),
        ("more micro-batches than stages", "afab", "four single operations in AFAB order"),
        ("fewer micro-batches than stages", "1f1b", None), ("more micro-batches than stages", "1f1b", None),
        ("float64, seed 123", "1f1b", None)]
PIPELINES = ["uneven layers, seed 7", "float64, seed 123"]


def cases(ctx):
    comm = [ctx.case(QID, "p2p", config, schedule=sched, **({"label": label, "probes": ["single"]} if label else {}))
            for config, sched, label in COMM]
    return comm + [ctx.case(QID, "pipeline", c) for c in PIPELINES]


def judge(ctx, outcomes):
    items = []
    for out in outcomes[:len(COMM)]:
        label = out.case.label
        failed = stamped(mutual_sends(out.errors()), QID, label) + case_problems(QID, out, label)
        messages, buffers = judge_p2p(out) if not out.failure else ([], [])
        messages, buffers = stamped(messages, QID, label), stamped(buffers, QID, label)
        # a wrong no-op or buffer before what it caused, a rank that raised before those that waited for it
        items.append(causes_first(Item("messages", label, messages + failed)))
        if out.case.stages > 1:     # judged on a case that ran to its end
            unfinished = [Problem("the receive buffers are judged when the messages of the case all went "
                                  "through; here they did not (see the messages)", exercise=QID, case=label)]
            items.append(Item("receive buffers", label, buffers + (unfinished if failed else [])))
    items += [causes_first(pipeline_item(QID, ctx, o)) for o in outcomes[len(COMM):]]
    return items + [prediction_item(ctx)]


def prediction_item(ctx) -> Item:
    """Which micro-batch each rank of the blocking-sends experiment is stuck sending: `predicted_deadlock()`."""
    path = ctx.student.get(QID)
    source = Path(path).read_text(errors="replace") if path else None
    return Item("prediction", "where the blocking pair deadlocks", stamped(judge_prediction(source), QID))
