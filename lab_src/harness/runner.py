"""Run a list of check cases in as few torchrun launches as possible, each under a deadline.

All cases go to one launch of max(stages) processes (sandboxed: one launch of groups of cases, forked in
turn by the fork server, harness/zygote.py). A case that raises on some rank is simply
recorded, and the launch goes on. A case that crashes a rank or overruns its deadline ends the launch:
the runner writes the per-rank report for that case and launches again for the cases after it. An
exercise whose cases end two launches is not tried again in that run, so a deadlocking answer costs
two deadlines, not one per case.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from lab_src.harness import deadlock, limits, runfolder, sandbox, warm_launch, wire
from lab_src.harness.case import Case, CaseOutcome, Run
from lab_src.harness.case_watch import CaseWatch
from lab_src.harness.launcher import Launch, launch, launch_groups, worker_env  # noqa: F401 - worker_env: scripts
from lab_src.harness.observed import observed
from lab_src.harness.records import ENDED_WITHOUT_RETURNING, RankError, exit_text
from lab_src.pipeline.trace import save_events
from lab_src.registry import EXERCISES


def _load_obs(path: Path) -> dict | None:
    import torch
    try:
        if path.stat().st_size > limits.OBS_LIMIT_BYTES:
            return {"error": RankError("OversizedObservation", f"{path.name} is {path.stat().st_size} bytes, "
                                                               f"more than a rank observes").to_dict()}
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 - a damaged file is reported, never trusted
        return {"error": RankError("UnreadableObservation", str(e)[:300]).to_dict()}


def _launch_failure(result: Launch, run_dir: Path, case: Case, obs: dict) -> str:
    exited = result.exit_codes or exit_codes(result.launcher_log)
    crashed = {r: c for r, c in exited.items() if c != -15}  # -15: torchrun's SIGTERM to the others
    if result.sandbox_ended is not None:
        # every process of the sandbox was killed while this case ran, and only its own answer is the student's
        head = (f"your answer to {case.qid} ended the grading sandbox (its processes were killed, status "
                f"{result.sandbox_ended}) while case {case.index} ({case.stages} stages) ran; the cases after it ran "
                f"in a new sandbox")
        return head + "\n" + deadlock.report(run_dir, case.index, range(case.stages), done_ranks=set(obs), exited={})
    if result.stopped:
        why = f"stopped: {result.stopped}"
    elif crashed:
        why = "a rank exited during the case (" + ", ".join(f"rank {r}: {exit_text(c)}" for r, c in crashed.items()) + ")"
    else:
        why = f"the run ended during the case (torchrun exit status {result.returncode})"
    head = f"case {case.index} ({case.qid}, {case.stages} stages) {why}"
    return head + "\n" + deadlock.report(run_dir, case.index, range(case.stages), done_ranks=set(obs),
                                         exited=crashed)


def exit_codes(launcher_log: str) -> dict[int, int]:
    """{rank: exit code} from torchrun's failure summary ("rank : 1 (local_rank: 1)", "exitcode : 7 ...")."""
    codes, rank = {}, None
    for line in launcher_log.splitlines():
        words = line.replace(":", " ").split()
        if len(words) >= 2 and words[0] == "rank" and words[1].isdigit():
            rank = int(words[1])
        elif len(words) >= 2 and words[0] == "exitcode" and rank is not None:
            try:
                codes[rank] = int(words[1])
            except ValueError:
                pass
            rank = None
    return codes


def holds(case: Case) -> set[str]:
    """The exercises whose expected answers a case's inputs hold: the references it is given (every
    answer but the graded exercise's), and, where it carries a baseline, the exercises judged on the
    numbers a baseline holds (registry: `judged_on_numbers`)."""
    held = {q for q, path in case.answers.items() if q != case.qid and path is not None}
    if case.baseline and {"check_outputs", "check_gradients"} & set(case.probes):
        held |= {e.id for e in EXERCISES.values() if e.judged_on_numbers}
    return held


def group_cases(cases: list[Case]) -> list[list[Case]]:
    """Cases in groups such that no group holds what one of its own graded exercises is judged against:
    a group never runs the student's answer to q08 beside the reference q08 that q09's cases need.
    Each case joins the first group it can; the groups run one after the other, each seeing only its
    own inputs (harness/zygote.py)."""
    groups: list[tuple[set[str], set[str], list[Case]]] = []     # (graded, held, cases)
    for case in cases:
        held = holds(case)
        for graded, holding, members in groups:
            if case.qid not in holding and not held & graded:
                graded.add(case.qid)
                holding |= held
                members.append(case)
                break
        else:
            groups.append(({case.qid}, set(held), [case]))
    return [members for _, _, members in groups]


def stage_inputs(cases: list[Case], run_dir: Path, folder: Path | None = None) -> list[dict]:
    """The cases as the workers get them: every answer file and baseline they name is copied into
    `folder`/inputs (by default the run folder's; a sandboxed worker sees nothing else) and named
    there. A baseline goes along only with the probes whose contract takes it (q09, q10)."""
    inputs = (folder or run_dir) / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    copied: dict[str, str] = {}

    def copy(path: str | None) -> str | None:
        if path is None:
            return None
        if path not in copied:
            dest = inputs / f"{len(copied)}-{Path(path).name}"
            shutil.copyfile(path, dest)
            copied[path] = str(dest)
        return copied[path]

    staged = []
    for case in cases:
        d = case.to_dict()
        d["answers"] = {qid: copy(path) for qid, path in case.answers.items()}
        d["baseline"] = copy(case.baseline) if {"check_outputs", "check_gradients"} & set(case.probes) else None
        staged.append(d)
    return staged


def run_cases(cases: list[Case], run_dir: Path, *, case_deadline_s: float = limits.CHECK_CASE_DEADLINE_S,
              timeout_s: float = limits.CHECK_RECV_TIMEOUT_S, startup_s: float = limits.STARTUP_S,
              env: dict | None = None,
              max_launch_failures_per_exercise: int = limits.LAUNCH_FAILURES_PER_EXERCISE,
              log_limit: int = limits.RANK_LOG_CHARS, sandboxed: bool = False, stop_deadlocks: bool = True,
              load_limit_s: float | None = None) -> Run:
    """Run `cases` in as few launches as possible (see the module's docstring). `sandboxed`: every
    launch in bubblewrap (harness/sandbox.py), as the grader runs students' code. `stop_deadlocks`:
    stop a case as soon as all its ranks wait for messages nobody will send (harness/deadlock.py);
    without it, only the receives' timeouts and the case deadline end a deadlock (the last resort).
    `load_limit_s`: how long an answer cell under test may run as it loads, on every rank before the
    first case (harness/worker.py); by default half the startup deadline."""
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in run_dir.glob("stop.c*"):        # requests to stop the cases of an earlier run here
        old.unlink()
    for i, case in enumerate(cases):
        case.index = i
    outcomes = {i: CaseOutcome(case) for i, case in enumerate(cases)}
    load_limit_s = load_limit_s or startup_s / 2
    launches: list[Launch] = []
    failures_by_exercise: dict[str, int] = {}
    remaining = list(cases)
    while remaining:
        deadline = (startup_s + limits.LOADING_BACKSTOP * load_limit_s
                    + limits.BUSY_BACKSTOP * case_deadline_s * len(remaining) + limits.LAUNCH_SLACK_S)
        counted = wire_cases(remaining)
        wires = wire.WireWatch(run_dir, sandboxed=sandboxed) if counted else None
        if sandboxed:
            groups = group_cases(remaining)
            remaining = [c for g in groups for c in g]      # the order they run in
            result, watches = _launch_grouped(groups, run_dir, len(launches), timeout_s, log_limit, deadline,
                                              case_deadline_s, startup_s, env, stop_deadlocks, load_limit_s, wires)
        else:
            if wires is not None:
                try:
                    wires.attach(wire.open_diag())
                except OSError as e:
                    wires.attach(None, f"no sock_diag socket here ({e})")
            nproc = max(c.stages for c in remaining)
            spec = {"run_dir": str(run_dir), "timeout_s": timeout_s, "cases": stage_inputs(remaining, run_dir),
                    "log_limit": log_limit, "load_limit_s": load_limit_s, "wire_cases": sorted(counted)}
            spec_path = runfolder.spec_path(run_dir, len(launches))
            spec_path.write_text(json.dumps(spec))
            for r in range(nproc):  # a journal tells about one launch only
                runfolder.journal_path(run_dir, r).unlink(missing_ok=True)
            watch = CaseWatch(run_dir, nproc, case_deadline_s, startup_s,
                               {c.index: c.stages for c in remaining} if stop_deadlocks else {},
                               load_limit_s=load_limit_s)
            watches = [watch]
            if warm_launch.use_warm():      # ranks forked by this kernel's warm launcher (harness/warm.py)
                result = warm_launch.launch(nproc, spec_path, run_dir=run_dir, deadline_s=deadline,
                                            watchdog=watch, env=worker_env(env))
            else:
                result = launch(nproc, "lab_src.harness.worker", [str(spec_path)], run_dir=run_dir,
                                deadline_s=deadline, watchdog=watch, env=worker_env(env))
        launches.append(result)
        if wires is not None:
            wires.stop()
            for case in remaining:
                if case.index in counted:
                    outcome = outcomes[case.index]
                    outcome.wire = {r: c for r in range(case.stages) if (c := wires.count(case.index, r)) is not None}
                    outcome.wire_unseen, outcome.wire_loopback = wires.unseen(case.index, range(case.stages)) or (None, None)
                    outcome.wire_failed = wires.failed
        if watches:
            # the lines written since its last poll (earlier groups': in `after`), before anything is decided
            # from them: a sandbox killed mid-case may end before the watch's next poll saw the case start
            watches[-1]._read()
        started = any(w.current is not None for w in watches)
        for w in watches:
            for index, by_rank in w.observed.items():
                if index in outcomes:
                    outcomes[index].observed = by_rank
            for index, by_rank in w.order.items():
                if index in outcomes:
                    outcomes[index].order = by_rank
            for index, stuck in w.stuck.items():
                outcomes[index].stuck, outcomes[index].stopped_at = stuck, w.stop_times[index]
        next_remaining = []
        for pos, case in enumerate(remaining):
            outcome = outcomes[case.index]
            for r in range(case.stages):
                o = _load_obs(runfolder.obs_path(run_dir, case.index, r))
                if o is not None:
                    outcome.obs[r] = observed(case.kind, o)
            if len(outcome.obs) == case.stages:
                continue
            blamed = blame_loading(watches, remaining, result)
            if blamed:
                # an answer ended the sandbox as it loaded: its exercise's cases fail, the others run again
                gone = {c.index for c in blamed}
                next_remaining = [c for c in remaining[pos:] if c.index not in gone]
                for other in blamed:
                    outcomes[other.index].failure = loading_failure(other, result)
                break
            if not started and not result.ok:
                # no rank ever started a case: the launch itself is broken (an import error, say)
                broken = (f"torchrun could not start the checks ({result.stopped or f'exit status {result.returncode}'}):\n"
                          + result.launcher_log[-3000:] + "\n".join(result.rank_logs.values())[-3000:])
                for other in remaining[pos:]:
                    outcomes[other.index].failure = broken
                break
            outcome.failure = _launch_failure(result, run_dir, case, outcome.obs)
            now = time.perf_counter()
            outcome.recovered = {r: deadlock.recover(runfolder.journal_path(run_dir, r), case.index, r, now)
                                 for r in range(case.stages) if r not in outcome.obs}
            failures_by_exercise[case.qid] = failures_by_exercise.get(case.qid, 0) + 1
            for later in remaining[pos + 1:]:
                if failures_by_exercise.get(later.qid, 0) >= max_launch_failures_per_exercise:
                    outcomes[later.index].failure = (
                        f"case {later.index} not run: earlier cases of {later.qid} stopped the "
                        f"run {max_launch_failures_per_exercise} times")
                else:
                    next_remaining.append(later)
            break
        remaining = next_remaining
    for i, outcome in outcomes.items():  # every case's events, all ranks on one clock, kept with the run
        events = outcome.events()
        if events:
            save_events(events, runfolder.events_path(run_dir, i))
    return Run(run_dir, [outcomes[i] for i in range(len(cases))], launches)


def wire_cases(cases: list[Case]) -> set[int]:
    """The cases whose kind is judged on the bytes its ranks sent (Kind.wire)."""
    from lab_src.harness.kinds import KINDS
    return {c.index for c in cases if getattr(KINDS.get(c.kind), "wire", False)}


def blame_loading(watches: list[CaseWatch], remaining: list[Case], result: Launch) -> list[Case]:
    """The cases to blame when a launch ended while its last group's ranks were still loading the answers
    under test: those of the exercise whose answer some rank was loading (the journals mark each load),
    graded with that same answer file. A rank that saw the kill right after a load marks it `died` (the
    latest such mark is blamed); otherwise, as ranks load the same answers in the same order, the load
    open on most ranks (the earliest case on a tie) is blamed. Empty when no
    load was under way (then the launch itself is broken, or a case was running)."""
    if result.ok or not watches or watches[-1].current is not None:
        return []
    if watches[-1].died:
        # a rank saw its ancestors being killed just after loading this answer (harness/lineage.py); the ranks
        # load in case order, and a rank that had not reached it yet may have seen the kill after an earlier one
        index = max(watches[-1].died)
    elif watches[-1].loading:
        open_loads = list(watches[-1].loading.values())
        index = min(set(open_loads), key=lambda i: (-open_loads.count(i), i))
    else:
        return []
    culprit = next((c for c in remaining if c.index == index), None)
    if culprit is None:
        return []
    return [c for c in remaining if (c.qid, c.answers.get(c.qid)) == (culprit.qid, culprit.answers.get(culprit.qid))]


def loading_failure(case: Case, result: Launch) -> str:
    why = result.stopped or f"exit status {result.returncode}"
    codes = result.exit_codes or {}
    ended = sorted(r for r, c in codes.items() if c == ENDED_WITHOUT_RETURNING)
    if ended:
        # a rank still connecting to its peers as they ended (gloo's "connection closed by peer") fails with an
        # error of its own: a consequence, said after the cause
        others = sorted(set(codes) - set(ended))
        who = "every rank" if not others else f"rank{'s' if len(ended) > 1 else ''} {', '.join(map(str, ended))}"
        then = (f"; rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} then failed, "
                f"{'their' if len(others) > 1 else 'its'} peers gone ({why})" if others else "")
        return (f"your answer to {case.qid} ended the process of {who} while it loaded (the code outside the "
                f"function ran, and {'each' if not others else 'each such'} rank's process ended with status 0 "
                f"before its work was done: "
                f"os._exit, or something that ends the interpreter, at the top level of the cell){then}; none of "
                f"{case.qid}'s cases could run, and the other exercises were graded in a launch of their own. The "
                f"code outside the function should only define it")
    return (f"your answer to {case.qid} ended the grading sandbox while it loaded (the code outside the "
            f"function ran and every process of the launch ended: {why}); none of {case.qid}'s cases could "
            f"run, and the other exercises were graded in a sandbox of their own")


def _launch_grouped(groups: list[list[Case]], run_dir: Path, launch_no: int, timeout_s: float, log_limit: int,
                    deadline: float, case_deadline_s: float, startup_s: float, env: dict | None,
                    stop_deadlocks: bool, load_limit_s: float, wires=None):
    """One sandboxed launch of `groups` through the fork server: each group's spec and inputs are
    written just before it runs, in a folder of its own, and deleted once it has ended."""
    folders = [run_dir / f"group{launch_no}-{i}" for i in range(len(groups))]
    specs = [(runfolder.spec_path(folder, 0), max(c.stages for c in g)) for folder, g in zip(folders, groups)]
    watches: list[CaseWatch] = []

    def before(i: int) -> None:
        if folders[i].exists():                     # never trust what a sandboxed process left there
            shutil.rmtree(folders[i])
        folders[i].mkdir()
        spec = {"run_dir": str(run_dir), "timeout_s": timeout_s, "log_limit": log_limit, "load_limit_s": load_limit_s,
                "cases": stage_inputs(groups[i], run_dir, folders[i]),
                "disk_limit": [sandbox.Limits().disk_bytes, limits.OBS_LIMIT_BYTES],    # worker.over_disk_limit
                "wire_cases": sorted(c.index for c in groups[i] if wires is not None and c.index in wire_cases(groups[i]))}
        specs[i][0].write_text(json.dumps(spec))
        for r in range(specs[i][1]):
            runfolder.journal_path(run_dir, r).unlink(missing_ok=True)

    def after(i: int) -> None:
        watches[i]._read()                          # its journals' last lines, before the next group's replace them
        shutil.rmtree(folders[i] / "inputs", ignore_errors=True)
        sandbox.remove_large_files(run_dir, limits.OBS_LIMIT_BYTES)    # the run folder emptied of what a group wrote

    def watchdog(i: int, nproc: int):
        watches.append(CaseWatch(run_dir, nproc, case_deadline_s, startup_s,
                                  {c.index: c.stages for c in groups[i]} if stop_deadlocks else {},
                                  disk_limit=sandbox.Limits().disk_bytes, load_limit_s=load_limit_s))
        watches[-1].qids = {c.index: c.qid for c in groups[i]}
        return watches[-1]

    result = launch_groups(specs, run_dir=run_dir, deadline_s=deadline, make_watchdog=watchdog,
                           before_group=before, after_group=after, env=env,
                           on_diag=wires.attach if wires is not None else None)
    for folder in folders:                          # a stopped launch leaves its last group's inputs
        shutil.rmtree(folder / "inputs", ignore_errors=True)
    sandbox.remove_large_files(run_dir, limits.OBS_LIMIT_BYTES)
    return result, watches
