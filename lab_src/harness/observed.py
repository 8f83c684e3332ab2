"""What one rank observed in one case, as a typed record: the fields are declared, per kind of case.

A kind's ranks fill the record (`obs["grads"] = ...`), the worker saves it as a plain dict (obs/c<i>.rank<r>.pt,
loaded with `weights_only`), and the launching process reads it back as the same class (`observed`) for the
judges: `o.grads`, `o["grads"]`, `o.get("grads")`. Every access names a declared field, on either side of the
process boundary: a field written, read or loaded that its record does not declare raises `UndeclaredField`
at once, so a renamed field can never read as None on the other side. A declared field that a rank did not
fill (its part raised first) reads as None (`o.x`, `o.get("x")`) or raises KeyError (`o["x"]`), as a dict does.

The core's kinds declare their records here; a topic's in its `records.py` (torch-free), named by its `Kind`
(`record="module:Class"`, lab_src/topics/__init__.py). Fields are class annotations, each with what it holds.
"""
from __future__ import annotations


class UndeclaredField(KeyError):
    pass


class Observed(dict):
    """The fields every case has (the worker's), and those every kind that traces its run adds (observe.py)."""
    kind: str                   # the case's kind
    rank: int
    stages: int                 # the ranks the case runs on
    error: dict                 # the rank's error (records.RankError.to_dict), None if its part ran to its end
    events: list                # what it recorded, as Event rows (pipeline/trace.py)
    built: list                 # the model pieces it built (pipeline/model.py's instrumentation)
    ran: dict                   # piece -> how many forwards it ran
    dataloaders: int            # how many training dataloaders it created
    lab_sent: int               # bytes the lab's own unrecorded collectives sent from this rank in the case, as
                                # gloo's ring algorithms send them (comm/collectives.py LAB_SENT; judge/wire.py)
    caught: list                # what the answer raised that the kind kept as an observation and ran past (a part
                                # of q17's and q18's cases): [{"type", "message", "line", "what"}], for a case
                                # that then deadlocked (judge/failures.py `raised_then_stuck`)

    FIELDS: frozenset = frozenset()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.FIELDS = frozenset(name for c in cls.__mro__ for name in getattr(c, "__annotations__", {})
                               if name != "FIELDS")

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.update(*args, **kwargs)

    def _declared(self, key) -> str:
        if key not in self.FIELDS:
            raise UndeclaredField(f"{type(self).__name__} declares no field {key!r} (its fields: "
                                  f"{', '.join(sorted(self.FIELDS))}): declare it in {type(self).__module__}")
        return key

    def __setitem__(self, key, value):
        super().__setitem__(self._declared(key), value)

    def __getitem__(self, key):
        return super().__getitem__(self._declared(key))

    def get(self, key, default=None):
        return super().get(self._declared(key), default)

    def setdefault(self, key, default=None):
        return super().setdefault(self._declared(key), default)

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __getattr__(self, name):
        if name.startswith("_") or name not in type(self).FIELDS:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        return super().get(name)

    def optional(self, name):
        """A field some kinds' records have and others not, for a reader of every kind (a view that draws any
        case): None where this record does not declare it or the rank did not fill it."""
        return super().get(name) if name in self.FIELDS else None

    def plain(self) -> dict:
        """What crosses the process boundary: a plain dict (torch.load's weights_only reads it)."""
        return dict(self)


Observed.__init_subclass__()        # the base's own fields


class StageObserved(Observed):
    """A case whose ranks build a pipeline stage (harness/observe.py's build_stage, observe_stage)."""
    micro_batch_size: int       # what q02's answer gave
    layers: list                # the blocks the rank's stage holds (q05)
    activation_shape: list      # what q03's answer gave


class StepObserved(StageObserved):
    """A case whose ranks run a pipelined step (harness/kinds/pipeline.py)."""
    needs_dataloader: object    # what q06's answer gave (observe.plain)
    perturbed: int              # the seed of the lab's change to stage 0's embedding (pipeline/perturb.py)
    outputs: list               # the last stage's outputs, one tensor per micro-batch
    loss: float
    returned: str               # what was wrong with what the step returned, if anything
    grads: dict                 # parameter name -> its gradient after the step
    memory: dict                # harness/records.Memory.to_dict: the peak memory the step held
    probes: dict                # what the probes of q07, q09 and q10 saw (harness/kinds/probes.py)


class CommObserved(StageObserved):
    probes: dict                # {"noop_ends": ...}: q07's operations at the ends of the pipeline
    calls: list                 # each call the rank made, with what it returned


class LayoutObserved(StageObserved):
    parameters: int             # the parameters of the rank's stage
    needs_dataloader: object    # what q06's answer gave
    feed: dict                  # feeding the stage a batch (observe.attempt)


class ShapesObserved(StageObserved):
    embed: dict                 # the activation shape tried on the embedding, a block, the head (observe.attempt)
    block: dict
    head: dict


class BaselineObserved(Observed):
    """The unsharded model's step (q04), pipeline/baseline.py's compute_baseline."""
    config: dict
    output: object
    loss: float
    grads: dict


class UnitsObserved(Observed):
    results: list               # each call's outcome (observe.attempt)


class SeedsObserved(Observed):
    """What the seed does to weights and data on different ranks (q01's demo): fingerprints and indices."""
    same_seed: list
    rank_seed: list
    block3: list
    data_same: list
    data_split: list


def record_class(kind: str) -> type[Observed]:
    """The record of a case kind, as its declaration names it (harness/kinds)."""
    from lab_src.harness.kinds import declared_class
    return declared_class(kind, "record", Observed)


def observed(kind: str, plain) -> Observed:
    """A rank's observations of a case of `kind`, as read back (or as a test writes them), in its record."""
    if isinstance(plain, Observed) or plain is None:
        return plain
    return record_class(kind)(plain)
