"""Hidden tests of q24 (ring_attention, and ulysses_attention beside it): ring attention on 2, 3 and 4 ranks, causal
with contiguous and zigzag shards and not causal, one sequence no multiple of 2N in each case (padded at its end by
the lab), several heads and head sizes; Ulysses on the same ranks, and on more ranks than heads (it must refuse,
naming both), judged by topics/long_sequences/judge_attention.py; and the graded prediction. Every input is changed
by noise from a seed drawn outside the answer (settings "perturb").

Four parts, each a quarter of the points (an item per case and run):
    values      the outputs and dq, dk, dv of every rank, in sequence order, against one process's
                scaled_dot_product_attention (float64); the refusal of a Ulysses run whose heads do not divide
    messages    ring: to the next rank only, from the previous only, no collective; bytes per rank exactly
                2 (N - 1) shards forward and (4N - 2) backward; the next block's receive posted before computing.
                Ulysses: four all-to-alls each way, (P - 1)/P of each shard sent. The record against the bytes the
                kernel counted leaving each rank over the case (judge/wire.py): bytes no recorded message or
                collective carried fail the messages of every run of the case
    work        ring: each rank's forward matmuls at most the tiles with a visible key, at least its visible scores
    prediction  ring and Ulysses bytes per rank, and the busiest rank's causal work over the mean per layout, at S =
                4096, 32 heads of 128, bfloat16, N = P = 8
"""
from __future__ import annotations

from lab_src.judge.numeric import matches
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.long_sequences.judge_attention import PARTS, judge_run, run_label
from lab_src.topics.long_sequences.records import PREDICTION_Q24, PREDICTION_Q24_KEYS, prediction_q24_wanted

from .common import Item, case_problems, judge_prediction

QID = "q24"


def ring(layout, causal=True, seq=24, heads=2, dim=8):
    return {"fn": "ring", "layout": layout, "causal": causal, "seq": seq, "heads": heads, "dim": dim}


def ulysses(causal=True, seq=24, heads=4, dim=8):
    return {"fn": "ulysses", "causal": causal, "seq": seq, "heads": heads, "dim": dim}


# label -> (ranks, settings): simplest first; in each case the ring's runs, then Ulysses' (an answer that has only the
# ring keeps its ring runs). One run is long (N = 4, S = 512: 128 KiB of K and V a rank, 384 KiB sent in its forward):
# the bytes counted on the wire (the kind is `wire`) have a slack of 16 KiB a rank (judge/wire.py), more than the
# short runs' whole K and V, so that a ring's messages sent for the record beside K and V moved around the recorder
# are seen there
CASES = {
    "N = 2": (2, {"runs": [ring("contiguous"), ring("zigzag"), ring("contiguous", causal=False, dim=4),
                           ring("zigzag", seq=19, heads=3), ulysses(), ulysses(causal=False, seq=22, heads=2)]}),
    "N = 3": (3, {"runs": [ring("contiguous", seq=30), ring("zigzag", seq=30, heads=1, dim=16),
                           ring("zigzag", causal=False), ring("contiguous", seq=22), ulysses(seq=30, heads=6),
                           ulysses(heads=2)]}),
    "N = 4": (4, {"runs": [ring("contiguous", seq=32), ring("zigzag", seq=32, heads=3), ring("zigzag", seq=37),
                           ring("contiguous", causal=False, seq=512, heads=4, dim=16), ulysses(seq=32, heads=8),
                           ulysses(heads=6)]}),
}


def cases(ctx):
    return [ctx.case(QID, "attention", LabConfig(num_stages=n, seed=70 + n), stages=n, label=label,
                     settings={**settings, "perturb": True}, schedule="", step="")
            for label, (n, settings) in CASES.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        failed = case_problems(QID, out, label)
        found = None if failed else judge_run(out)
        for part in PARTS:
            for run in out.case.settings["runs"]:
                if part == "work" and run["fn"] != "ring":
                    continue
                name = run_label(run)
                items.append(Item(part, f"{label}, {name}", list(failed) if failed else
                                  stamped(found[part].get(name, []), QID, label)))
    return items + prediction_items(ctx)


def prediction_items(ctx) -> list[Item]:
    said = {"ring": "bytes one rank sends in the ring's forward", "ulysses": "bytes one rank sends in Ulysses' forward",
            "contiguous": "the busiest rank's causal work over the mean, contiguous shards",
            "zigzag": "the busiest rank's causal work over the mean, zigzag shards"}

    def wrong(k, got, want):
        why = ""
        if k == "ulysses" and matches(got, want * 8 / 7):
            why = " (four whole shards: each all-to-all keeps 1/P of its input on the rank, (P - 1)/P leaves)"
        elif k == "ring" and matches(got, want / 2):
            why = " (K or V alone: both go round)"
        elif k == "contiguous" and matches(got, 15 / 8):
            why = " (counted per visible score; the rank computes its diagonal tile whole: count tiles, r + 1 on rank r)"
        return f"the predicted {k!r} is {got:,.6g}; {said[k]} is {want:,.6g}{why}"
    return judge_prediction(ctx, QID, PREDICTION_Q24, prediction_q24_wanted(), wrong, PREDICTION_Q24_KEYS)
