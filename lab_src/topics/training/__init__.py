"""Training for real: a loss, an optimizer, the digits, one process's learning curve (q13).

    digits.py          scikit-learn's digits as token sequences (shipped with scikit-learn: no download)
    classifier.py      the class scores and loss on the last stage
    single_process.py  the whole model trained in one process on the same seed and batches
    records.py         the settings both the kind and the judge read, torch-free
    kind.py            rank side: the student's training loop around the step
    judge.py           parent side: the curve against one process's, the optimizer, the data read
    curves.py          the learning curves
"""
from lab_src.topics import LAYOUT, Kind, Topic

TOPIC = Topic(
    name="training",
    title="Train it: a real loss, an optimizer, one process's learning curve",
    exercises=("q13",),
    kinds={"train": Kind("kind", record="records:TrainObserved", settings="records:TrainSettings", calls=LAYOUT, step=True,
                         what="the student's training loop around the step, on the digits (q13)")},
)
