"""Point-to-point messages with torch.distributed's own calls (q11); the recorder is the core's (comm/messages.py).

    calls.py     the four operations and their raw torch.distributed calls, as the judge and the kind name them
    kind.py      rank side: q11's operations in the order of the case's schedule
    judge.py     parent side: messages, buffers, the pipeline around them, the graded prediction
"""
from lab_src.topics import LAYOUT, Kind, Topic

TOPIC = Topic(
    name="p2p",
    title="Point-to-point messages with torch.distributed",
    exercises=("q11",),
    kinds={"p2p": Kind("kind", record="records:P2PObserved", calls=LAYOUT + ("p2p_communicate",),
                       what="q11's raw torch.distributed operations in the order of the case's schedule")},
)
