"""Visible check of q14 (dp_pp_step): the student's step on 4 ranks as 2 data-parallel replicas of a 2-stage
pipeline, then as one 4-stage pipeline (1 x 4) and as 4 replicas of one stage (4 x 1), all with tied
embeddings. Each run is compared with the single-process baseline of the global batch (the student's
q04), its groups, shards and tied copies are checked, and its traffic is counted by kind, next to the
student's prediction for the 2 x 2 grid.

    report = check("q14")
    report.timeline()                  # the 2 x 2 run: every rank, messages and all-reduces
    what_if(report, nodes=2, ...)      # the traffic model: predicted and measured times, and a plot
"""
from __future__ import annotations

from lab_src.checks.common import (UNFINISHED, CheckReport, errors, finish, indent, make_case, nothing_to_draw,
                                   run_cases, run_dir, sources)
from lab_src.pipeline.config import LabConfig
from lab_src.topics.dp_pp.traffic import PREDICTION_CONFIG, PREDICTION_NAME

GRIDS = [PREDICTION_CONFIG,
         LabConfig(num_layers=8, num_stages=4, num_microbatches=3, global_batch_size=12, tie_embeddings=True),
         LabConfig(num_layers=4, num_stages=1, num_microbatches=3, global_batch_size=48, dp_size=4, tie_embeddings=True)]


class GridReport(CheckReport):
    """A check report whose pictures know the grid: views hold global events and the grid's shape."""

    def timeline(self, case: int | None = None):
        """The run of one grid (by default the first that failed, else the 2 x 2 one)."""
        if not self.views:
            print(nothing_to_draw(self))
            return None
        from lab_src.topics.dp_pp.timeline import show_grid
        v = self.views[self.failed_case() if case is None else case]
        return show_grid(v["events"], v["dp"], v["pp"], v["microbatches"], v["title"], v.get("predicted"),
                         v.get("note", ""))

    def chrome_trace(self, path, case: int = 0):
        """Write one run's events, all-reduces included, as a Chrome trace (open it in ui.perfetto.dev)."""
        from lab_src.views.chrome_trace import write_chrome_trace
        v = self.views[case]
        return write_chrome_trace(v["events"], path, v["title"])


def check() -> CheckReport:
    from lab_src.harness.baselines import baselines_for
    from lab_src.topics.dp_pp.judge import failure_problems, judge_grid
    from lab_src.judge.problems import stamped
    from lab_src.topics.dp_pp.traffic import bytes_by_kind, table, wire_bytes_by_kind
    from lab_src.views import text_grid
    srcs = sources("q14")
    prediction, why = read_prediction(srcs["q14"])
    baselines = baselines_for(GRIDS, srcs)
    cases = [make_case("grid", cfg, srcs, "q14", stages=cfg.world_size,
                       probes=["network"] if cfg is PREDICTION_CONFIG else []) for cfg in GRIDS]
    run = run_cases(cases, run_dir("q14"))
    problems, lines, views = [], ["q14 dp_pp_step"], []
    for cfg, out in zip(GRIDS, run.outcomes):
        label = f"{cfg.dp_size} x {cfg.num_stages}"
        lines.append(f"\n  {label} grid: {cfg.describe()}")
        errs = stamped(failure_problems(out), "q14", label) if errors(out, "q14", label) else []
        view = grid_view(out, label)
        views.append(view)
        if errs:
            problems += errs
            lines.append(UNFINISHED)
            continue
        verdict = judge_grid(out, baselines[cfg])
        found = stamped(verdict.data_parallel + verdict.tied, "q14", label)
        problems += found
        lines.append(indent(coordinates(out)))
        lines.append("    outputs, losses and every rank's gradients " +
                     ("match" if not found else "were checked:") + " the single-process baseline of the global batch"
                     + (", and the tied copies stayed equal after an SGD step" if not found and cfg.tie_embeddings else "")
                     + (" (see the problems below)" if found else ""))
        lines.append(indent(text_grid.time_grid(view["events"], cfg.world_size)))
        measured = bytes_by_kind(view["events"])
        if cfg is PREDICTION_CONFIG:
            lines.append("    bytes of one step, by kind (the record; a ring all-reduce puts 2(n-1)/n of each buffer "
                         "on the wire):")
            lines.append(indent(table(measured, prediction, wire_bytes_by_kind(view["events"])), "      "))
            lines.append("      " + compare_prediction(prediction, measured, why))
        else:
            lines.append(indent(table(measured, wire=wire_bytes_by_kind(view["events"])), "      "))
    return finish("q14", run, problems, lines, views=views, cls=GridReport)   # printed, and returned even if failed


# The cluster a student describes by default: 4 GPUs a node on a fast interconnect, nodes on 100 Gb/s.
CLUSTER = dict(nodes=2, ranks_per_node=4, intra_gbps=800, inter_gbps=100, intra_latency_us=3, inter_latency_us=15)


def what_if(report, **described):
    """The traffic model on the 2 x 2 run of `report`: each kind's predicted time on this machine and on
    the cluster `described` (CLUSTER's keywords: nodes, ranks_per_node, intra_gbps, inter_gbps,
    intra_latency_us, inter_latency_us) beside the measured time, then the plot of predicted time
    against the number of replicas and of micro-batches on that cluster. Returns the figure."""
    from lab_src.topics.dp_pp import network
    from lab_src.topics.dp_pp.traffic_plot import scaling, what_if_figure
    views = getattr(report, "views", None) or []
    if not isinstance(report, GridReport) or not views:
        print("No run to model: the check did not run (while autograding, checks launch nothing).")
        return None
    v = views[0]
    if not report.ok or not any(e.is_collective or e.is_send for e in v["events"]):
        print("No measured pipeline to model: the check above did not pass, so its 2 x 2 run's messages and "
              "all-reduces are not your step's. Make the check pass, then run this cell again.")
        return None
    here = network.this_machine(v.get("link"))
    there = network.cluster(**{**CLUSTER, **described})
    ops = network.operations(v["events"])
    predicted = {"model: this machine": network.predict(ops, here), f"model: {there.name}": network.predict(ops, there)}
    print(f"The {v['dp']} x {v['pp']} run's operations ({len(ops)}), time per step on the busiest rank:")
    print(network.table(predicted, network.measure(v["events"])))
    print(f"\n{here.describe()}\n{there.describe()}")
    sizes = network.sizes_of(v["events"], v["dp"], v["pp"])
    import textwrap
    print("\n" + textwrap.fill(scaling(sizes, v["pp"], v["microbatches"], there, tied=v["config"].tie_embeddings), 110))
    return what_if_figure(sizes, v["dp"], v["pp"], v["microbatches"], there, tied=v["config"].tie_embeddings)


def read_prediction(path: str | None) -> tuple[dict | None, str]:
    """The student's predicted bytes (parsed from the answer file, never run), or None and why not."""
    from pathlib import Path

    from lab_src.judge.numeric import NotANumber, read_numbers
    if path is None:
        return None, "no answer file"
    try:
        return read_numbers(Path(path).read_text(), PREDICTION_NAME), ""
    except NotANumber as e:
        return None, str(e)


def compare_prediction(prediction: dict | None, measured: dict, why: str) -> str:
    if prediction is None:
        return f"your prediction: not read ({why})"
    off = [k for k, v in measured.items() if prediction.get(k) is None or abs(prediction[k] - v) > 0.005 * max(v, 1)]
    if not off:
        return "your prediction matches the measurement"
    return (f"your prediction differs from the measurement for {', '.join(off)}: find what your count left out "
            f"(the prediction is graded)")


def coordinates(outcome) -> str:
    """Each rank's coordinates and groups, as its stage saw them."""
    rows = []
    for r, o in sorted(outcome.obs.items()):
        dp_groups = sorted({tuple(e[-1]) for e in o.get("events", []) if e[1] == "allreduce_dp" and len(e) > 9})
        tied = sorted({tuple(e[-1]) for e in o.get("events", []) if e[1] == "allreduce_tied" and len(e) > 9})
        rows.append(f"rank {r}: stage {o.get('pp_rank')} of pipeline {o.get('pipeline_group')}"
                    + (f", data-parallel all-reduce over {list(dp_groups[0])}" if dp_groups else "")
                    + (f", tied all-reduce over {list(tied[0])}" if tied else ""))
    return "\n".join(rows)


def grid_view(outcome, label: str) -> dict:
    """What the pictures need of one grid case: global events and the grid's shape."""
    from lab_src.topics.dp_pp import network
    from lab_src.topics.dp_pp.timeline import global_events, predicted_events
    cfg = outcome.case.config
    dp, pp, m = cfg.dp_size, cfg.num_stages, cfg.num_microbatches
    pipeline_of = {r: o.get("pipeline_group") for r, o in outcome.obs.items() if o.get("pipeline_group")}
    events = global_events(outcome.events(), pipeline_of)
    view = {"events": events, "dp": dp, "pp": pp, "microbatches": m, "config": cfg,
            "title": f"q14: {label} grid, {m} micro-batches", "link": outcome.obs.get(0, {}).get("link")}
    layers = [len(outcome.obs.get(r, {}).get("layers") or []) for r in range(pp)]
    if all(layers) and any(e.is_compute for e in events):   # the step as the model sees it: the widget's second view
        here = network.this_machine(view["link"])
        view["predicted"] = predicted_events(events, dp, pp, m, here, layers, network.sizes_of(events, dp, pp),
                                             cfg.tie_embeddings)
        view["note"] = f"messages {here.intra.describe()}, ring all-reduces; compute: the measured averages"
    return view


__all__ = ["check", "what_if", "GridReport", "CLUSTER"]
