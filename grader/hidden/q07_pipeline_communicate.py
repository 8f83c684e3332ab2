"""Hidden tests of q07 (pipeline_communicate): labelled messages in All-Forward-All-Backward order for
1 to 4 stages (what every receive got, the no-ops at the ends), then full pipelines."""
from lab_src.judge.probes import judge_comm
from lab_src.judge.problems import stamped

from .common import Item, case_problems, pipeline_item

QID = "q07"
COMM = ["a single stage", "one micro-batch", "fewer micro-batches than stages", "more micro-batches than stages"]
PIPELINES = ["uneven layers, seed 7", "float64, seed 123"]


def cases(ctx):
    return [ctx.case(QID, "comm", c) for c in COMM] + \
           [ctx.case(QID, "pipeline", c, probes=["noop_ends"]) for c in PIPELINES]


def judge(ctx, outcomes):
    items = []
    for out in outcomes[:len(COMM)]:
        label = out.case.label
        item = Item("messages", label, case_problems(QID, out, label))
        if not item.problems:
            item.problems = stamped(judge_comm(out), QID, label)
        items.append(item)
    # judge_comm on a pipeline run: its no-op probes
    return items + [pipeline_item(QID, ctx, o, extra=judge_comm) for o in outcomes[len(COMM):]]
