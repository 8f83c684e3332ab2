"""One case of a run, saved for drawing: its events and its shape, as a small JSON file.

The visible checks keep a view per case (`CheckReport.views`); the grader saves the view of its own run
of a student's answer, which nbgrader's execution of the notebook then draws in the timeline cell.
Everything in a view is what the run recorded (events, each rank's blocks), never what an answer
should have been.
"""
from __future__ import annotations

import json
from pathlib import Path

from lab_src.pipeline.trace import Event


def case_view(outcome) -> dict:
    """What the timeline needs of one case (a `harness.runner.CaseOutcome`): its events and its shape,
    and for a run that did not finish, where each rank was left (`waits`, `ends`) and why (`verdict`)."""
    case = outcome.case
    layers = [len(outcome.obs[r].optional("layers") or []) if r in outcome.obs else 0 for r in range(case.stages)]
    return {"events": outcome.events(recovered=True), "stages": case.stages, "microbatches": case.microbatches,
            "schedule": case.schedule, "stage_layers": layers if all(layers) else None, "label": case.label,
            "waits": outcome.waits(), "ends": [list(e) for e in outcome.ends()], "verdict": verdict(outcome)}


def kind_view(outcome) -> dict:
    """The view the case's kind declares (`Kind.view`: q19's ring names each call above the ranks and draws no
    schedule), else `case_view`: the one view of a case, for the visible check and the grader's saved run alike."""
    import importlib

    from lab_src.harness.kinds import KINDS
    name = KINDS[outcome.case.kind].view
    if not name:
        return case_view(outcome)
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)(outcome)


def verdict(outcome) -> str:
    """Why a case did not finish, in one line ("" when it did): the ranks that raised first, those left
    waiting after them (issue 41: a run where three ranks raised read "every rank was waiting")."""
    from lab_src.harness.records import gave_up_waiting
    raised = {r: e for r, e in outcome.errors().items()
              if e.get("type") not in ("NotRun", "Stopped") and gave_up_waiting(e.get("message", ""), e.get("type", "")) is None}
    if raised and (outcome.stuck is not None or len(raised) < outcome.case.stages):
        kinds = sorted({e["type"] for e in raised.values()})
        who = ", ".join(map(str, sorted(raised)))
        return (f"rank{'s' if len(raised) > 1 else ''} {who} raised {' and '.join(kinds)}; the other ranks were left "
                f"waiting" + (" until the check stopped them" if outcome.stuck is not None else ""))
    if outcome.stuck is not None:
        if outcome.stuck.absent:
            return ("stopped by the check: every rank was waiting, in a collective that a member of its group "
                    "was not going to join or for a message that no rank was going to send")
        return "stopped by the check: every rank was waiting for a message that no rank was going to send"
    if outcome.failure:
        return outcome.failure.splitlines()[0]
    errors = outcome.errors()
    if errors:
        return "; ".join(f"rank {r}: {e['type']}" for r, e in sorted(errors.items()))
    return ""


def save_view(view: dict, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**view, "events": [e.to_row() for e in view["events"]],
                                "waits": [e.to_row() for e in view.get("waits", [])]}))


def load_view(path: Path) -> dict:
    view = json.loads(Path(path).read_text())
    return {**view, "events": [Event.from_row(r) for r in view["events"]],
            "waits": [Event.from_row(r) for r in view.get("waits", [])]}


def draw(view: dict, title: str = ""):
    """The timeline widget of a view (the static figure while autograding)."""
    from lab_src.views.timeline import show
    title = view.get("title") or title or f"{view['stages']} stages, {view['microbatches']} micro-batches"
    return show(view["events"], view["stages"], view["microbatches"], title=title,
                schedule=view.get("schedule", "afab"), stage_layers=view.get("stage_layers"),
                waits=view.get("waits", []), ends=[tuple(e) for e in view.get("ends", [])],
                verdict=view.get("verdict", ""), emulate=view.get("emulate"), compute_free=view.get("compute_free", ""),
                **({"sections": view["sections"]} if view.get("sections") else {}))
