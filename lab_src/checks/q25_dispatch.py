"""Visible check of q25 (dispatch, with route, combine and sync_gradients): the lab's MoE model (2 MoE layers,
float64) on 2 ranks (ep = 2, two experts a rank, top-2, a capacity that drops assignments) and on 4 (ep = 2 x dp = 2,
one rank of experts starved: it receives no token), three SGD steps each, judged by topics/experts/judge.py: outputs,
gradients and the curve against one process's MoE routed by the answer's own route, the all-to-alls per layer and
their bytes against what that routing sends off-rank, and what route returned held to the rule's properties (the
student package holds no rule: the hidden tests bring the grader's). It prints per rank what was sent beside what
the routing needs, and the prediction beside the grader's figures.

    report = check("q25")
    traffic_figure(report)     # the first case's first layer: rows per rank per destination, load per expert, drops
    report.timeline()          # each rank's all-to-alls and all-reduces, per step: forward, backward, the sync
    example_figure()           # the same picture of the rule on random tokens (recorded: figure.py EXAMPLE)
"""
from __future__ import annotations

from pathlib import Path

from lab_src.checks.common import (
    UNFINISHED,
    CheckReport,
    errors,
    finish,
    make_case,
    nothing_to_draw,
    run_cases,
    run_dir,
    sources,
)
from lab_src.judge.problems import Problem, stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.experts.records import (
    ITEMSIZE,
    PARTS,
    PREDICTION_KEYS,
    PREDICTION_NAME,
    PREDICTION_SHAPE,
    WHAT,
    prediction_wanted,
)


def _cfg(seed: int) -> LabConfig:
    return LabConfig(num_layers=2, hidden_size=16, num_heads=2, seq_len=8, vocab_size=32, num_stages=1,
                     dtype="float64", seed=seed)


CASES = [("ep = 2, two experts a rank, top-2, capacity 1.0 (drops)", _cfg(41), 2,
          {"ep": 2, "experts": 4, "k": 2, "capacity_factor": 1.0}),
         ("ep = 2 x dp = 2, two experts a rank, top-2, rank 1's experts receive no token", _cfg(42), 4,
          {"ep": 2, "experts": 4, "k": 2, "starve": True})]


class MoeReport(CheckReport):
    """A check report that also holds what the first case's first layer sent (for traffic_figure); its timeline()
    draws each rank's all-to-alls and all-reduces per step (topics/experts/figure.py moe_view)."""
    routing: dict | None = None


def traffic_figure(report):
    """The first case's first MoE layer, from the lab's record of the answer's run (a report skipped while
    autograding, or stopped by a missing answer, draws nothing and says why)."""
    from lab_src.topics.experts.figure import routing_figure
    routing = getattr(report, "routing", None)
    if not routing:
        print(nothing_to_draw(report))
        return None
    return routing_figure(**routing)


def example_figure():
    """The rule on random tokens of 4 ranks, 8 experts, top-2, capacity factor 1.0 (figure.py EXAMPLE, recorded)."""
    from lab_src.topics.experts.figure import example_routing, routing_figure
    return routing_figure(**example_routing(), title="the rule: 4 ranks, 8 experts, top-2, capacity factor 1.0, "
                                                     "64 tokens a rank (random tokens, one router)")


def check():
    from lab_src.topics.experts.judge import flat, judge_run, reference_run
    from lab_src.topics.experts.kind import answer_functions
    srcs = sources("q25")
    cases = [make_case("moe", cfg, srcs, "q25", stages=ranks, label=label, settings=settings)
             for label, cfg, ranks, settings in CASES]
    run = run_cases(cases, run_dir("q25"))
    problems, lines = [], ["q25 dispatch: the lab's MoE model, 2 MoE layers, float64, three SGD steps"]
    routing = {}
    for i, out in enumerate(run.outcomes):
        lines.append(f"\n  {out.case.label}")
        errs = errors(out, "q25", out.case.label)
        if errs:
            problems += errs
            lines.append(UNFINISHED)
            continue
        try:
            route = answer_functions()["route"]
            found = judge_run(out, route, rule=False)
        except Exception as e:                         # the answer's route, run here as one process's rule
            problems += stamped([Problem(f"route, run in this process on the case's inputs to route one process's "
                                         f"MoE, raised {type(e).__name__}: {e}")], "q25", out.case.label)
            lines.append(UNFINISHED)
            continue
        problems += stamped(flat(found), "q25", out.case.label)
        lines.append(table(out, found, reference_run(out, route), route))
        if i == 0:
            routing = first_layer(out)
    predicted, said = prediction(srcs.get("q25"))
    lines.append(said)
    report = finish("q25", run, problems, lines, cls=MoeReport)
    report.routing = routing
    report.predicted = predicted
    return report


def table(out, found, ref, route) -> str:
    from lab_src.harness.settings import settings_of
    from lab_src.topics.experts.judge import expected_rows, off_rank, rule_layers
    s = settings_of(out.case)
    rules = rule_layers(out, s, route)
    cfg = out.case.config
    row = cfg.hidden_size * ITEMSIZE[s.dtype]
    rows = [(f"    {'rank':>4} {'dp,ep':>5} {'experts':>8} {'counts':>6} {'a2a fwd':>7} {'a2a bwd':>7} "
             f"{'sent fwd (B)':>12} {'needs (B)':>9} {'sent bwd (B)':>12} {'dropped':>7}")]
    for r, o in sorted(out.obs.items()):
        a2a = o.get("a2a") or {}
        fwd, bwd = a2a.get("forward") or [], a2a.get("backward") or []
        want = sum(d + c for d, c in expected_rows(out, rules, s, r)) * row
        got_f = sum(off_rank(a, r) * a["row_bytes"] for a in fwd if not a["integer"] and a["row_bytes"] == row)
        got_b = sum(off_rank(a, r) * a["row_bytes"] for a in bwd if not a["integer"] and a["row_bytes"] == row)
        dropped = sum(int((~rec["keep"].bool()).sum()) for rec in o.get("moe_layers") or []
                      if hasattr(rec.get("keep"), "bool"))
        c = o.get("coords") or {}
        rows.append(f"    {r:>4} {c.get('dp', '?')},{c.get('ep', '?'):<3} {o.get('owned')!s:>8} "
                    f"{sum(1 for a in fwd if a['integer'] or a['row_bytes'] != row):>6} "
                    f"{sum(1 for a in fwd if not a['integer'] and a['row_bytes'] == row):>7} "
                    f"{sum(1 for a in bwd if not a['integer'] and a['row_bytes'] == row):>7} {got_f:>12,} {want:>9,} {got_b:>12,} "
                    f"{dropped:>7}")
    losses = [o.get("losses") or [] for _, o in sorted(out.obs.items())]
    curve = [sum(x[k] for x in losses) / len(losses) for k in range(min(len(x) for x in losses))] if losses else []
    gap = max((abs(a - b) for a, b in zip(curve, ref["losses"])), default=float("nan"))
    rows.append(f"    ({cfg.num_layers} layers: one counts exchange and two all-to-alls of tokens a layer forward, two "
                f"backward; bytes sent to other ranks, and what the kept assignments of your route's routing need)")
    rows.append(f"    loss over {len(curve)} steps: {', '.join(f'{v:.6f}' for v in curve)}; one process's largest "
                f"difference {gap:.2e}")
    for part in PARTS:
        rows.append(f"    {WHAT[part]}: {'as one process' if not found[part] else 'differ (above)'}"
                    if part in ("forward", "gradients", "training") else
                    f"    {WHAT[part]}: {'right' if not found[part] else 'wrong (above)'}")
    return "\n".join(rows)


def first_layer(out) -> dict:
    """The first case's first MoE layer as routing_figure draws it, from the answer's own record."""
    from lab_src.harness.settings import settings_of
    from lab_src.topics.experts.records import capacity
    s = settings_of(out.case)
    ep, E = s.ep, s.experts
    L = E // ep
    ranks = sorted(out.obs)[:ep]           # the first ep group (dp coordinate 0)
    sent = [[0] * ep for _ in range(ep)]
    load = [[0] * ep for _ in range(E)]
    dropped = []
    for r in ranks:
        o = out.obs[r]
        fwd = [a for a in (o.get("a2a") or {}).get("forward") or [] if not a["integer"]]
        if fwd:
            sent[r] = list(fwd[0]["in"])[:ep]
        rec = (o.get("moe_layers") or [{}])[0]
        keep, experts = rec.get("keep"), rec.get("experts")
        if hasattr(keep, "bool") and hasattr(experts, "tolist"):
            for e in experts[keep.bool()].tolist():
                load[e][r] += 1
            dropped.append(int((~keep.bool()).sum()))
        else:
            dropped.append(0)
    T = s.batch * out.case.config.seq_len
    return {"sent": sent, "load": load, "dropped": dropped, "capacity": capacity(T, s.k, E, s.capacity_factor),
            "title": f"your run, first MoE layer: {out.case.label} (L = {L} experts a rank, T = {T} tokens a rank)"}


def prediction(path: str | None) -> tuple[dict, str]:
    from lab_src.judge.numeric import TOLERANCE, NotANumber, read_numbers, verdict_lines
    p = PREDICTION_SHAPE
    head = (f"\n  your prediction, {PREDICTION_NAME}(), graded (right within {TOLERANCE:.1%}):\n"
            f"    ep = {p['ep']} (dp = {p['dp']}), T = {p['tokens']} tokens a rank, k = {p['k']}, h = {p['hidden']}, "
            f"{p['dtype']}, spread evenly, nothing dropped: bytes one rank sends to others per layer, and the factor of "
            f"experts' gradients summed over dp and never divided")
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), PREDICTION_NAME, PREDICTION_KEYS) if path else {}
    except NotANumber as e:
        return {}, head + f"\n    could not be read: {e}"
    return got, "\n".join([head] + verdict_lines(got, prediction_wanted(), "it is"))


__all__ = ["check", "example_figure", "traffic_figure"]
