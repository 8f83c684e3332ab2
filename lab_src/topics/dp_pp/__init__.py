"""Data x pipeline parallel on a grid of ranks, tied embeddings (q14).

    grid.py          Grid: what one rank of the grid is given (its groups, its recorded all-reduces)
    traffic.py       what a step sends, by kind, read from its events; the prediction's configuration
    network.py       a what-if model of a step's communication on a network you describe
    kind.py          rank side: the student's step on the grid
    judge.py         parent side: replicas, tied embeddings, groups, traffic, the graded prediction
    timeline.py      the grid's run drawn, one row per rank
    traffic_plot.py  the what-if figure
"""
from lab_src.topics import LAYOUT, EventKind, Kind, Topic

TOPIC = Topic(
    name="dp_pp",
    title="Data x pipeline parallel on a grid of ranks, tied embeddings",
    exercises=("q14",),
    kinds={"grid": Kind("kind", record="records:GridObserved",
                        calls=LAYOUT + ("needs_dataloader", "pipeline_communicate", "afab_step"),
                        what="the student's step on a data x pipeline grid of all the case's ranks (q14)")},
    events=(EventKind("allreduce_dp", "data-parallel all-reduce", "#9467bd"),
            EventKind("allreduce_tied", "tied-embedding all-reduce", "#e377c2")),
)
