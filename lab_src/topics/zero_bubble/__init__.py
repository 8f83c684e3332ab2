"""Zero bubble: the backward split into its input half (I) and its weight half (W), ZB-H1 (q16).

The split itself is the core stage's (pipeline/split.py: `PipelineStage.backward_input`, `backward_weight`,
and `Op.BACKWARD_INPUT` / `Op.BACKWARD_WEIGHT`); ZB-H1's program and rules are the core schedule registry's
(pipeline/schedules.py). This folder holds what only q16 needs:

    kind.py     rank side: the two halves against one backward on every stage of the configuration, one rank
    judge.py    parent side: gradients, floating-point operations, what the halves keep alive
"""
from lab_src.topics import LAYOUT, EventKind, Kind, Topic

TOPIC = Topic(
    name="zero_bubble",
    title="Zero bubble: split the backward, fill the bubble",
    exercises=("q16",),
    kinds={"split": Kind("kind", record="records:SplitObserved", calls=LAYOUT, step=True,
                         what="q16's split backward on every stage of the configuration, on one rank: the two "
                              "halves against one backward (gradients, floating-point operations, memory left)")},
    # a backward split in two: each half in its own colour, named in the legend when drawn
    events=(EventKind("backward_input", "I: input's gradient", "#d4621b", collective=False),
            EventKind("backward_weight", "W: weights' gradients", "#eeca3b", collective=False)),
)
