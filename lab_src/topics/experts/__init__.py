"""Experts: a mixture of experts with expert parallelism (q25): route, dispatch and combine with data-dependent
all-to-alls, the experts' gradients scaled for the layout.

    records.py   what the kind and the judge share, torch-free: settings and layout, capacity, the traffic the
                 routing implies, the graded prediction, the record each rank fills
    moe.py       the lab's MoE model (the lab's blocks, the MLP replaced by a router and E experts), one process's MoE
                 with a routing rule it is given (what the judge compares with), each step's batch
    kind.py      rank side: the model on a (dp, ep) mesh, its MoE layers run by the answer's route, dispatch and
                 combine, its gradients by the answer's sync_gradients, three SGD steps; what it sent, recorded
    judge.py     parent side: outputs, gradients (a wrong scale named by its factor), the curve, the all-to-alls and
                 their bytes against what the routing sends off-rank, the dropped assignments
    figure.py    the pictures: tokens each rank sends to each rank, the load on each expert, the dropped tokens
"""
from lab_src.harness.limits import COLLECTIVE_TIMEOUT_FACTOR
from lab_src.topics import Kind, Topic

TOPIC = Topic(
    name="experts",
    title="Mixture of experts: expert parallelism, all-to-all dispatch and combine",
    exercises=("q25",),
    kinds={"moe": Kind("kind", record="records:MoeObserved", settings="records:MoeSettings", calls=("dispatch",),
                       timeout_factor=COLLECTIVE_TIMEOUT_FACTOR, view="figure:moe_view",
                       what="q25's route, dispatch, combine and sync_gradients in the lab's MoE model on a (dp, ep) "
                            "mesh: step 0's outputs, routing, gradients and all-to-alls recorded, then SGD steps")},
)
