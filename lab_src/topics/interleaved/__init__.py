"""Interleaved 1F1B with virtual stages, and a model cut by tracing (q15); torch.distributed.pipelining's
schedules run on the lab's stages (the notebooks' bridge, q12 and q15).

    chunked.py       InterleavedStage: a rank holding v model chunks, virtual stage c * p + r each
    traced.py        cutting a model into stages by torch.fx tracing, at named cut points
    torch_bridge.py  the lab's stages under torch's own Schedule1F1B / ScheduleInterleaved1F1B
    kind.py          rank side: the student's interleaved step
    kind_torch.py    rank side: torch's schedule on the case's stages, its calls recorded (ungraded)
    judge.py         parent side: chunks, order, the graded prediction
"""
from lab_src.topics import LAYOUT, Kind, Topic

TOPIC = Topic(
    name="interleaved",
    title="Interleaved 1F1B with virtual stages",
    exercises=("q15",),
    kinds={
        "interleaved": Kind("kind", record="records:InterleavedObserved", settings="lab_src.harness.settings:PerturbSettings", calls=LAYOUT + ("needs_dataloader",),
                            step=True, what="an interleaved step (q15) on ranks holding several model chunks each"),
        "torch": Kind("kind_torch", record="lab_src.harness.observed:StageObserved", calls=LAYOUT,
                      what="torch.distributed.pipelining's Schedule1F1B on the case's stages (the notebooks' "
                           "bridge, ungraded)"),
    },
)
