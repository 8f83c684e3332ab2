"""Data parallel from first principles: a ring all-reduce written from point-to-point messages (q19), then gradient
buckets reduced with it during the student's own 1F1B backward (q20).

    records.py   what the kind and the judge share, torch-free: the record, the rings of a case, the seed's layers
    inputs.py    the tensors a case sums, drawn from its seed (the ranks and the judge make the same ones)
    kind.py      rank side: the answer's ring over the case's ranks (or a grid's columns), length after length
    sizes.py     rank side: each send held against the size of the receive it matches, before gloo sees it
    judge.py     parent side: the sums, the bits, the messages, the graded prediction
    kind_study.py  rank side of the study: the ring and gloo's all-reduce timed, length after length
    study.py     parent side: the ring's time against its length beside gloo's, the alpha-beta fit, algbw, busbw
    figure.py    the pictures: the ring's two phases, a run's messages per rank (each call named), q20's buckets
    network.py   the emulated network under the point-to-point layer: latency, bandwidth and a seeded tail
    kind_network.py  rank side of the network study: the seed's four layers all-reduced step after step over it
    tail.py      parent side: each layer's and each step's time as a distribution, against 1 - (1 - q)^k
    buckets.py   q20's bucket rule, and the three properties a plan is judged on
    bucket_ring.py  rank side: what a Reducer is given, a reducing thread (lane 1) that runs the q19 ring
    kind_buckets.py rank side of q20: the answer's Reducer and 1F1B step on a grid, step after step
    judge_buckets.py parent side: values against one process, the plans, one ring per bucket, placement, overlap
"""
from lab_src.harness.limits import COLLECTIVE_TIMEOUT_FACTOR
from lab_src.topics import LAYOUT, Kind, Topic

TOPIC = Topic(
    name="data_parallel",
    title="Data parallel from first principles: a ring all-reduce, then gradient buckets under the pipeline",
    exercises=("q19", "q20"),
    kinds={
        "ring": Kind("kind", wire=True, record="records:RingObserved", settings="records:RingSettings", calls=("ring_all_reduce",),
                     view="figure:ring_view",
                     timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                     what="q19's ring all-reduce over the case's ranks (or the columns of a grid of them), one "
                          "length after another: what each rank holds afterwards and every message it made"),
        "ring_study": Kind("kind_study", record="records:StudyObserved", settings="records:StudySettings", calls=("ring_all_reduce",),
                           timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                           what="q19's ring and gloo's all-reduce timed at lengths from a few elements to "
                                "millions, each repeated: the ring's alpha-beta fit, algbw and busbw"),
        "ring_network": Kind("kind_network", record="records:NetworkObserved", settings="records:NetworkSettings",
                             calls=("ring_all_reduce",),
                             timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                             what="q19's ring all-reducing the seed's four layers' gradients step after step "
                                  "over an emulated network with a latency tail: each layer's and each step's "
                                  "time, and every message's emulated delay"),
        "buckets": Kind("kind_buckets", wire=True, record="records:BucketsObserved", settings="records:BucketsSettings",
                        calls=LAYOUT + ("p2p_communicate", "ring_all_reduce", "bucketed_step"),
                        timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                        what="q20's Reducer and 1F1B step on a data x pipeline grid of the case's ranks, a few "
                             "optimizer steps: the plan, every launch and the reducing lane's messages, the gradients"),
    },
)
