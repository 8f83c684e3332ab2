"""What torchrun runs on every rank: the cases of one spec file, one after the other.

    python -m torch.distributed.run --standalone --nproc-per-node N -m lab_src.harness.worker SPEC.json

(or, as the checks and the grader start ranks, `main` called in a rank forked by torch's elastic agent
from a warm process: harness/elastic.py).

Before the first case, every rank runs the answer cell under test of each of its cases once and waits
for the others (`load_answers_under_test`). For each case, ranks 0..p-1 of a p-stage case run it in
their pipeline group, with the answers the case names (`answers.use_answers`), and save what they
observed to obs/c<index>.rank<r>.pt. All ranks then agree, through the world group, on whether any rank
failed; after a failure every pipeline group is rebuilt, so that a message left in flight cannot leak
into the next case. Once two cases of one exercise have deadlocked or timed out, its remaining cases are
skipped. The journal (journal.rank<r>.log) marks where each case starts and ends and each operation: the
launching process follows it, and when every rank of a case waits for a message nobody will send, it
asks the ranks to stop waiting (pipeline/waiting.py), so a deadlock costs a fraction of a second instead
of a timeout.
"""
from __future__ import annotations

import ctypes
import dataclasses
import gc
import importlib
import io
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from lab_src.harness import limits
from lab_src.harness.records import Q11_CALL, RankError, gave_up_waiting
from lab_src.registry import exercise


class CappedWriter(io.TextIOBase):
    """A stream that keeps the first `limit` characters and drops the rest (a student may print a lot)."""

    def __init__(self, stream, limit: int):
        self.stream, self.limit, self.written, self.dropped = stream, limit, 0, False

    def write(self, s: str) -> int:
        room = self.limit - self.written
        if room > 0:
            self.stream.write(s[:room])
            self.written += min(len(s), room)
        if len(s) > room and not self.dropped:
            self.dropped = True
            self.stream.write(f"\n[output beyond {self.limit} characters dropped]\n")
        return len(s)

    def flush(self) -> None:
        self.stream.flush()


def _redirect_output(path: Path, limit: int) -> None:
    f = open(path, "a", buffering=1, errors="replace")
    os.dup2(f.fileno(), 1)
    os.dup2(f.fileno(), 2)
    sys.stdout = sys.stderr = CappedWriter(f, limit)


def _die_with_parent() -> None:
    """If torchrun is killed, the kernel kills this worker too (Linux only)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def meet_the_others(error: BaseException, tracer) -> None:
    """After this rank's answer raised in a case: say it sends nothing more (the deadlock watch's W) and
    that it has left the case (harness/case_barrier.py: the others' barriers no longer wait for it), then
    wait at the case's end for the ranks still at work. A rank whose peers wait for its messages instead
    is a deadlock the watch stops at once, and the stop ends this wait too. Not after a wait that failed
    (stopped, timed out, a peer gone): the others are not coming. Whatever the wait raises, the rank's own
    error is the one reported."""
    from lab_src.harness import case_barrier
    tracer.finished()
    case_barrier.leave()
    if not case_barrier.active() or gave_up_waiting(str(error), type(error).__name__):
        return
    try:
        case_barrier.end()
    except BaseException:   # noqa: BLE001 - stopped, or timed out: the case's error stands
        pass


def _describe(e: BaseException, tracer, case=None) -> RankError:
    """An exception as a rank's error. `where`: the frames that help a student, their answer's and
    lab_src's, not torch's insides; the frames of the answer under test carry its file name and line
    (the launch runs a copy), those of the other answers only their exercise (in the grader they are
    the reference answers, whose code a message must not show)."""
    frames = traceback.extract_tb(e.__traceback__)
    keep = [f for f in frames if "/torch/" not in f.filename and "/lib/python3" not in f.filename
            and not f.filename.endswith(("worker.py", "contextlib.py"))]
    answers = {str(Path(path).resolve()): q for q, path in (case.answers if case else {}).items() if path}

    def frame(f) -> list:
        q = answers.get(str(Path(f.filename).resolve()))
        if q is None:
            return [f"lab_src:{Path(f.filename).name}", f.lineno, f.name, f.line]
        if q == case.qid:
            return [exercise(q).answer_file, f.lineno, f.name, f.line]
        return [f"<answer to {q}>", f.lineno, f.name, None]
    full = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return RankError(type(e).__name__, str(e)[:2000], [frame(f) for f in keep][-6:],
                     pending=tracer.pending if tracer is not None else None,
                     pending_since=tracer.pending_since if tracer is not None else None,
                     at=time.perf_counter(), traceback=full[-20_000:], call=getattr(e, Q11_CALL, None))


class SlowToLoad(Exception):
    def __init__(self, limit_s: float):
        super().__init__(f"the cell was still running after {limit_s:g} s: the code outside the function runs "
                         f"as the answer loads, and should only define it")


def load_answers_under_test(cases: list, rank: int, limit_s: float, journal=None, chain=()) -> None:
    """Run the answer cell under test of every case this rank takes part in, once, before any case
    starts. What a cell does as it loads (a slow import, a walk of the disk, a burst of forks that
    fills the launch's process limit for a moment) then makes no rank late for another's message and
    counts against no case's deadline. A cell that fails to load, or runs past `limit_s`, is not run
    again: each of its cases reports why (lab_src.answers keeps the reason). The limit is read on
    harness/own_time.py's clock: time the cell waited for a CPU that the machine's other work held does
    not count, so a verdict does not depend on how busy the grading machine is. The `journal` marks
    which case's answer is loading, so that a cell that kills the sandbox as it loads costs only its own
    exercise (harness/runner.py, `blame_loading`): when, after a load, a process of `chain` (the rank's
    ancestors, harness/lineage.py) is being killed, the rank marks that answer `died` and waits for its end."""
    from lab_src import answers
    from lab_src.exercises import running_for
    from lab_src.harness import lineage, own_time, runfolder

    clock = None

    def too_slow(signum, frame):
        left = limit_s - clock.elapsed_s()
        if left > 0.01:     # the machine was busy and the cell waited for a CPU: it has more of its time left
            signal.setitimer(signal.ITIMER_REAL, left)
            return
        raise SlowToLoad(limit_s)
    previous = signal.signal(signal.SIGALRM, too_slow)
    try:
        for case in cases:
            if rank < case.stages and case.answers.get(case.qid):
                if journal is not None:
                    journal.write(runfolder.case_line("load", case.index))
                with answers.use_answers(case.answers), running_for(case.qid):
                    clock = own_time.OwnClock()
                    signal.setitimer(signal.ITIMER_REAL, limit_s)
                    try:
                        answers.load(case.qid)
                    except (Exception, SystemExit):   # noqa: BLE001 - reported by the cases that call it
                        pass
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                if lineage.dying(list(chain)):
                    if journal is not None:
                        journal.write(runfolder.case_line("died", case.index))
                    lineage.await_end()
                if journal is not None:
                    journal.write(runfolder.case_line("loaded", case.index))
    finally:
        signal.signal(signal.SIGALRM, previous)


def wait_for_every_rank(world_size: int, rank: int, timeout_s: float = 3600) -> None:
    """A barrier through the job's store, without the world group's timeout: loading the answers may take
    one rank much longer than another. The launching process's startup deadline bounds the wait."""
    import torch.distributed as dist

    from lab_src.harness.groups import timeout
    store = dist.distributed_c10d._get_default_store()
    store.set(f"loaded/{rank}", "1")
    store.wait([f"loaded/{r}" for r in range(world_size)], timeout(timeout_s))


def over_disk_limit(run_dir: Path, disk_limit: list | None, qid: str, before: int) -> tuple[RankError | None, int]:
    """After a case: when the run folder holds more than the sandbox's limit (`disk_limit`: [limit, the size
    above which a file is not the lab's]) and more than `before` (what this rank measured after its last
    case), the case's answer wrote it: delete the large files and fail the case. Every rank of the case
    checks, so the rank that wrote the files sees them, whenever the launching process's watch polls
    (harness/runner.py stops only a case still writing). Returns (the failure or None, the bytes there now)."""
    if not disk_limit:
        return None, 0
    from lab_src.harness import sandbox
    used = sandbox.disk_usage(run_dir)
    if used <= disk_limit[0] or used <= before:
        return None, used
    freed = sandbox.remove_large_files(run_dir, disk_limit[1])
    return RankError("DiskLimit", sandbox.disk_limit_message(qid, used, disk_limit[0])), used - freed


STOP_REASON = ("stopped by the check: every rank of this run was waiting, for a message that no rank was "
               "going to send or in a collective that a member of its group was not going to join")


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    run_dir = Path(spec["run_dir"])
    rank = int(os.environ["RANK"])
    from lab_src.harness.runfolder import rank_log_path
    _redirect_output(rank_log_path(run_dir, rank), spec.get("log_limit", limits.RANK_LOG_CHARS))
    _die_with_parent()
    from lab_src.harness import lineage
    chain = lineage.ancestors()     # the agent (or torchrun) and the process that started it

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from lab_src import topics
    from lab_src.answers import use_answers
    from lab_src.comm import collectives
    from lab_src.exercises import running_for
    from lab_src.harness import case_barrier, fence, kinds, observed, own_time, runfolder, sandbox
    from lab_src.harness import groups as process_groups
    from lab_src.harness.case import Case
    from lab_src.pipeline import data, model, trace, waiting

    runners = kinds.runners()
    for recorder in topics.recorders():     # what the topics record beside the stage's own operations: raw
        importlib.import_module(recorder).install()     # torch.distributed messages (q11), collectives (q17)
    ctx = process_groups.init(spec["timeout_s"])
    store = dist.distributed_c10d._get_default_store()      # the case's barriers (harness/case_barrier.py)
    groups = process_groups.PipeGroups(ctx)
    journal = open(runfolder.journal_path(run_dir, rank), "a", buffering=1)

    def write_op(tag: str, pending: list) -> None:
        journal.write(runfolder.op_line(tag, pending))

    (run_dir / "obs").mkdir(exist_ok=True)
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else None

    cases = [Case.from_dict(d) for d in spec["cases"]]
    load_answers_under_test(cases, rank, spec.get("load_limit_s", limits.LOAD_LIMIT_S), journal, chain)
    # What is loaded by now (torch, the lab, the answers: about 170,000 objects) lives as long as the rank: out of
    # the cyclic collector's way. Otherwise a collection of its oldest generation scans them all (70 ms alone, at
    # the same point of a case on every rank, one after another) in the middle of a case: q19's network study
    # on 4 ranks had one step of 300 ms among steps of 30, the 28th in every run, with or without its network.
    gc.freeze()
    wait_for_every_rank(ctx.world_size, rank)

    wire_cases = set(spec.get("wire_cases") or ())      # cases whose bytes the launching process counts
    if wire_cases:
        fence.arm(run_dir, rank)
    timeouts: dict[str, int] = {}
    disk_used = sandbox.disk_usage(run_dir) if spec.get("disk_limit") else 0      # see over_disk_limit
    for case in cases:
        index, stages, qid = case.index, case.stages, case.qid
        # the case's timeout, for its group, its barriers and the groups its kind makes (ctx.timeout_s): the
        # launch's, times its kind's factor (harness/limits.py COLLECTIVE_TIMEOUT_FACTOR)
        factor = getattr(kinds.KINDS.get(case.kind), "timeout_factor", 1)
        case_ctx = dataclasses.replace(ctx, timeout_s=ctx.timeout_s * factor)
        group = groups.get(stages, case_ctx.timeout_s)      # on every rank, in the cases' order
        journal.write(runfolder.case_line("start", index))
        failed = 0
        if wire_cases and not (index in wire_cases and rank < stages):
            fence.passing(index)
        if rank < stages:
            stop_file = runfolder.stop_path(run_dir, index)

            def asked_to_stop(stop_file=stop_file) -> str | None:
                return STOP_REASON if stop_file.exists() else None
            model.reset_instrumentation()
            data.CREATED["dataloaders"] = 0
            tracer = trace.Tracer(rank, write_op, sync, label=str(index))
            if index in wire_cases:
                fence.start(index)
                collectives.LAB_SENT[0] = 0
            case_barrier.begin(store, index, rank, stages, case_ctx.timeout_s)
            obs = observed.record_class(case.kind)(kind=case.kind, rank=rank, stages=stages, error=None)
            if timeouts.get(qid, 0) >= limits.SKIP_AFTER_TIMEOUTS:
                obs["error"] = RankError("NotRun", f"not run: {limits.SKIP_AFTER_TIMEOUTS} earlier cases of {qid} "
                                                   f"deadlocked or timed out").to_dict()
            else:
                try:
                    with use_answers(case.answers), running_for(qid), trace.tracing(tracer), \
                            waiting.stop_when(asked_to_stop), \
                            waiting.time_out_after(case_ctx.timeout_s, own_time.peers_clock(), limits.BUSY_BACKSTOP):
                        try:
                            runners[case.kind](case, case_ctx, group, tracer, obs)
                        except BaseException as e:
                            meet_the_others(e, tracer)
                            raise
                except Exception as e:  # noqa: BLE001 - a failing case is an observation, the run goes on
                    error = _describe(e, tracer, case)
                    obs["error"] = error.to_dict()
                    # a wait the check stopped counts as a timeout: it would have ended in one
                    failed = 2 if gave_up_waiting(error.message, error.type) else 1
                except (SystemExit, KeyboardInterrupt) as e:   # exit() in an answer ends its case, not the run
                    error = _describe(e, tracer, case)
                    error.message = (f"the answer called exit() on rank {rank} ({type(e).__name__}: "
                                     f"{e}); an answer must return, not end the process")
                    obs["error"] = error.to_dict()
                    failed = 1
            full, disk_used = over_disk_limit(run_dir, spec.get("disk_limit"), qid, disk_used)
            if full:
                obs["error"], failed = full.to_dict(), max(failed, 1)
            if lineage.dying(chain):     # the case's answer killed the agent or the sandbox: it observed nothing
                lineage.await_end()
            if fence.end(index):
                obs["lab_sent"] = collectives.LAB_SENT[0]
            case_barrier.finish()
            final = runfolder.obs_path(run_dir, index, rank)
            tmp = final.with_name(f".{final.name}.tmp")
            torch.save(obs.plain(), tmp)
            os.replace(tmp, final)
            tracer.finished()
        # torch names the process groups a process makes by their number (distributed_c10d's group_count), and
        # ranks that made different numbers in this case (a rank that failed while making one, an answer's
        # new_group called on some ranks only) would give the next group of the launch different names, joined
        # to nothing or to a stale group: every rank goes on from the highest number, a name no rank has used
        flag = torch.tensor([failed, c10d._world.group_count], device=ctx.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        fence.run_after_end()       # every rank is past its end fence: the case's groups close now (comm/mesh.py)
        failed_anywhere, c10d._world.group_count = int(flag[0]), int(flag[1])
        if failed_anywhere:
            groups.fresh()
        if failed_anywhere == 2:
            timeouts[qid] = timeouts.get(qid, 0) + 1
        journal.write(runfolder.case_line("end", index))
    dist.barrier()
    dist.destroy_process_group()
    journal.close()
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1])
    # Skip the interpreter's teardown of torch (about a second per launch); every file is closed.
    os._exit(code)
