"""The lab's own torch.distributed: one floor under the topics, above pipeline/ and harness/.

    mesh.py         `Mesh`: a case's ranks as named dimensions (dp, pp, tp, cp, ep), every group of a dimension made
                    on every rank in one order, each rank's coordinates and neighbours; the one place seconds
                    become a process group's timeout
    grid.py         a grid case's prologue and epilogue (the mesh, the stage, the recorders bounded to the case,
                    the messages finished, the groups destroyed): what each grid kind used to copy
    lanes.py        the student's q19 ring run in a rank's lane 1 (a thread of its own, journalled as that lane)
    messages.py     the recorder of the answer's raw point-to-point calls (isend, irecv, send, recv,
                    batch_isend_irecv), journalled for the deadlock watch, optionally over an emulated network
    collectives.py  the recorder of the answer's raw collectives (all-reduce, all-gather, reduce-scatter,
                    all-to-all, broadcast, reduce, barrier), whichever dimension of a mesh their group spans

This module is data only (no torch): the event kinds the recorders write, which the timeline, the figures and the
deadlock watch read beside the topics' own (topics.event_kinds()), and the recorders every rank installs before its
first case (topics.recorders()). A topic that needs a new collective or a new dimension adds nothing here but a
row of `EVENTS` when torch has a new function; labels say what an operation is, never which topic first used it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EventKind:
    """A kind of event ranks record beside the stage's operations (pipeline/ops.py's Op): the core's below, a topic's
    in its declaration (lab_src/topics/__init__.py)."""
    name: str                   # the `kind` of its events
    label: str                  # what a legend and a tooltip call it
    colour: str                 # how the timeline and the figures draw it
    collective: bool = True     # a collective over a group of ranks (no peer); False: a compute box of `Op`
    lane_label: str = ""        # what names a rank's lane row holding only these (q22's gathers): not "its lane 1"


# the answer's own torch.distributed collectives, as comm/collectives.py records them (its KINDS)
EVENTS = (EventKind("all_reduce", "all-reduce (torch.distributed)", "#17becf"),
          EventKind("all_gather", "all-gather (torch.distributed)", "#bcbd22"),
          EventKind("reduce_scatter", "reduce-scatter (torch.distributed)", "#8c564b"),
          EventKind("all_to_all", "all-to-all (torch.distributed)", "#e377c2"),
          EventKind("broadcast", "broadcast", "#7f7f7f"),
          EventKind("reduce", "reduce", "#7f7f7f"),
          EventKind("dist_barrier", "barrier", "#525252"))

RECORDERS = ("lab_src.comm.messages", "lab_src.comm.collectives")
