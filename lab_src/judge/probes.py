"""Judges of the probes: what the student's own functions did when the ranks called them on purpose.

- `judge_comm` (q07): what each receive of a communication case got, against the case's schedule; the
  no-ops at the ends; and the messages' rules;
- `judge_check_outputs` (q09) and `judge_check_gradients` (q10): the student's checks called on correct
  data, on disturbed data and on a missing gradient, where they must raise.

The visible checks and the grader's hidden tests share these judges.
"""
from __future__ import annotations

from lab_src.judge.problems import Problem
from lab_src.judge.realness import check_messages
from lab_src.pipeline.schedules import Op, schedule


def judge_comm(out) -> list[Problem]:
    """What each receive got, against what the case's schedule implies; and the messages' rules."""
    case = out.case
    p, m, sched = case.stages, case.microbatches, schedule(case.schedule)
    problems = []
    for r, o in sorted(out.obs.items()):
        for name, res in (o.get("probes", {}).get("noop_ends") or {}).items():
            if res["outcome"] != "returned" or res.get("value") is not None or res.get("messages"):
                end = "last" if Op(name).towards_next else "first"
                got = res.get("type") or res.get("value")
                problems.append(Problem(f"{name} on the {end} stage must do nothing and return None "
                                        f"(got {got!r}, {res.get('messages', 0)} messages)", rank=r, microbatch=0))
        # a communication case's calls; a pipeline case judged here for its no-op probes made none
        for name, mb, got, *traced in o.optional("calls") or []:
            op = Op(name)
            wrong_mb = [t for t in (traced[0] if traced else []) if t != mb]
            if wrong_mb:
                problems.append(Problem(f"{op} was called for micro-batch {mb} but its message was recorded "
                                        f"as micro-batch {wrong_mb[0]}: pass microbatch=microbatch on to "
                                        f"stage.send / stage.recv", rank=r, microbatch=mb))
            if op.is_send:
                if got is not None:
                    problems.append(Problem(f"{op} should return None", rank=r, microbatch=mb))
                continue
            peer = op.peer(r, p)
            if peer is None:
                if got is not None:
                    problems.append(Problem(f"{op} has no peer on this stage and must return None",
                                            rank=r, microbatch=mb))
            elif got is None:
                problems.append(Problem(f"{op} returned None, but this stage receives from rank {peer}",
                                        rank=r, microbatch=mb))
            elif got.get("from") != peer or got.get("mb") != mb or got.get("phase") != op.phase:
                problems.append(Problem(f"{op} received {got}, expected the {op.phase} tensor of micro-batch {mb} "
                                        f"from rank {peer}", rank=r, microbatch=mb))
    if not out.errors() and not out.failure:
        shape = out.obs.get(0, {}).get("activation_shape", ())
        # no compute in a communication case: the counts of operations are left to the receive checks above
        problems += check_messages(out.events(), p, m, tuple(shape), sched, counts=False)
    return problems


def judge_check_outputs(out) -> list[Problem]:
    """The student's check_outputs on correct outputs, then on every kind of wrong ones."""
    return judge_true_outputs(out) + [p for _, p in wrong_data(out, "check_outputs") if p]


def judge_true_outputs(out) -> list[Problem]:
    p = out.case.stages
    problems = []
    for r, o in sorted(out.obs.items()):
        true = o.get("probes", {}).get("check_outputs", {}).get("true", {})
        want = r == p - 1
        if true.get("outcome") != "returned":
            problems.append(Problem(f"check_outputs raised {true.get('type')} on correct outputs: "
                                    f"{true.get('message', '')[:200]}", rank=r))
        elif true.get("value") is not want:
            why = "the last stage holds the outputs" if want else "only the last stage has outputs to check"
            problems.append(Problem(f"check_outputs returned {true.get('value')!r}; expected {want} ({why})", rank=r))
    return problems


HINTS = {"check_outputs": "compare every element of every micro-batch, in order, with the baseline (concatenate "
                          "the micro-batches), and let assert_close raise",
         "check_gradients": "compare the whole gradient of every parameter this stage owns, and raise when one "
                            "is missing"}


def wrong_data(out, probe: str) -> list[tuple[str, Problem | None]]:
    """(what was wrong, the problem if the student's check accepted it) for every wrong-data call of
    `probe` on every rank: each must raise AssertionError."""
    rows = []
    for r, o in sorted(out.obs.items()):
        for name, res in (o.get("probes", {}).get(probe) or {}).items():
            if name in ("true", "owned"):
                continue
            what = f"rank {r}: {name}"
            if res.get("outcome") == "raised" and res.get("type") == "AssertionError":
                rows.append((what, None))
                continue
            got = "returned normally" if res.get("outcome") == "returned" else f"raised {res.get('type')}"
            rows.append((what, Problem(f"given {name}, {probe} {got}; it must raise AssertionError: "
                                       f"{HINTS[probe]}", rank=r)))
    return rows


def judge_check_gradients(out) -> list[Problem]:
    """The student's check_gradients on correct gradients, then on every kind of wrong ones."""
    return judge_true_gradients(out) + [p for _, p in wrong_data(out, "check_gradients") if p]


def judge_true_gradients(out) -> list[Problem]:
    problems = []
    for r, o in sorted(out.obs.items()):
        probe = o.get("probes", {}).get("check_gradients", {})
        true = probe.get("true", {})
        owned = probe.get("owned", [])
        if true.get("outcome") != "returned":
            problems.append(Problem(f"check_gradients raised {true.get('type')} on correct gradients: "
                                    f"{true.get('message', '')[:200]}", rank=r))
        elif sorted(true.get("value") or []) != sorted(owned):
            got = true.get("value") or []
            extra = sorted(set(got) - set(owned))
            lost = sorted(set(owned) - set(got))
            why = (f"it checked {extra[:2]}, which this stage does not own" if extra else
                   f"it did not check {lost[:2]}{' and more' if len(lost) > 2 else ''}")
            problems.append(Problem(f"check_gradients must return the names of exactly the parameters this "
                                    f"stage owns: {why}", rank=r))
    return problems
