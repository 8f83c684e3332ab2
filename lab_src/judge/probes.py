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


def judge_comm(out, qid: str, label: str) -> list[Problem]:
    """What each receive got, against what the case's schedule implies; and the messages' rules."""
    case = out.case
    p, m, sched = case.stages, case.microbatches, schedule(case.schedule)
    problems = []
    for r, o in sorted(out.obs.items()):
        for name, res in (o.get("probes", {}).get("noop_ends") or {}).items():
            if res["outcome"] != "returned" or res.get("value") is not None or res.get("messages"):
                end = "last" if Op(name).towards_next else "first"
                got = res.get("type") or res.get("value")
                problems.append(Problem(qid, f"{name} on the {end} stage must do nothing and return None "
                                             f"(got {got!r}, {res.get('messages', 0)} messages)", r, 0, label))
        for name, mb, got in o.get("calls", []):
            op = Op(name)
            if op.is_send:
                if got is not None:
                    problems.append(Problem(qid, f"{op} should return None", r, mb, label))
                continue
            peer = op.peer(r, p)
            if peer is None:
                if got is not None:
                    problems.append(Problem(qid, f"{op} has no peer on this stage and must return None", r, mb, label))
            elif got is None:
                problems.append(Problem(qid, f"{op} returned None, but this stage receives from rank {peer}", r, mb, label))
            elif got.get("from") != peer or got.get("mb") != mb or got.get("phase") != op.phase:
                problems.append(Problem(qid, f"{op} received {got}, expected the {op.phase} tensor of micro-batch {mb} "
                                             f"from rank {peer}", r, mb, label))
    if not out.errors() and not out.failure:
        shape = out.obs.get(0, {}).get("activation_shape", ())
        # no compute in a communication case: the counts of operations are left to the receive checks above
        problems += [pr for pr in check_messages(out.events(), p, m, tuple(shape), qid, label, sched)
                     if "forward operations" not in pr.message and "backward operations" not in pr.message]
    return problems


def judge_check_outputs(out, qid: str, label: str) -> list[Problem]:
    p = out.case.stages
    problems = []
    for r, o in sorted(out.obs.items()):
        probe = o.get("probes", {}).get("check_outputs", {})
        true, disturbed = probe.get("true", {}), probe.get("disturbed")
        want = r == p - 1
        if true.get("outcome") != "returned":
            problems.append(Problem(qid, f"check_outputs raised {true.get('type')} on correct outputs: "
                                         f"{true.get('message', '')[:200]}", r, None, label))
        elif true.get("value") is not want:
            why = "the last stage holds the outputs" if want else "only the last stage has outputs to check"
            problems.append(Problem(qid, f"check_outputs returned {true.get('value')!r}; expected {want} ({why})",
                                    r, None, label))
        if disturbed is not None and (disturbed.get("outcome") != "raised" or disturbed.get("type") != "AssertionError"):
            problems.append(Problem(qid, "check_outputs accepted outputs whose last micro-batch was changed: "
                                         "compare every micro-batch (concatenate them) with the baseline, "
                                         "and let assert_close raise", r, None, label))
    return problems


def judge_check_gradients(out, qid: str, label: str) -> list[Problem]:
    problems = []
    for r, o in sorted(out.obs.items()):
        probe = o.get("probes", {}).get("check_gradients", {})
        true = probe.get("true", {})
        owned = probe.get("owned", [])
        if true.get("outcome") != "returned":
            problems.append(Problem(qid, f"check_gradients raised {true.get('type')} on correct gradients: "
                                         f"{true.get('message', '')[:200]}", r, None, label))
        elif sorted(true.get("value") or []) != sorted(owned):
            got = true.get("value") or []
            extra = sorted(set(got) - set(owned))
            lost = sorted(set(owned) - set(got))
            why = (f"it checked {extra[:2]}, which this stage does not own" if extra else
                   f"it did not check {lost[:2]}{' and more' if len(lost) > 2 else ''}")
            problems.append(Problem(qid, f"check_gradients must return the names of exactly the parameters this "
                                         f"stage owns: {why}", r, None, label))
        for key, what in (("disturbed", "a baseline gradient was changed"), ("missing", "a gradient was missing")):
            res = probe.get(key)
            if res is not None and (res.get("outcome") != "raised" or res.get("type") != "AssertionError"):
                got = "returned normally" if res.get("outcome") == "returned" else f"raised {res.get('type')}"
                problems.append(Problem(qid, f"when {what}, check_gradients {got}; it must raise AssertionError",
                                        r, None, label))
    return problems
