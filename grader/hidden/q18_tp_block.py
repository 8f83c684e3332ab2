"""Hidden tests of q18 (tp_block): TODO say what they run."""
from .common import case_problems, Item

QID = "q18"


def cases(ctx):
    return [ctx.case(QID, "units", label="calls", calls=[])]


def judge(ctx, outcomes):
    return [Item("calls", o.case.label, case_problems(QID, o, o.case.label)) for o in outcomes]
