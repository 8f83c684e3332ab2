"""Following a launch while it runs (harness/runner.py): each rank's journal read as it grows, a case whose
ranks all wait for messages nobody will send stopped at once (harness/deadlock.py), a case over its deadline
or a run folder over its disk limit stopped, and what each rank began recorded for the judges
(`CaseOutcome.observed`, judge/record.py).

Deadlines are on the ranks' own clocks (harness/own_time.py), so that a busy machine does not decide a
verdict, with backstops on the wall clock; every limit, with why it has its value: harness/limits.py.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from lab_src.harness import deadlock, limits, own_time, runfolder, sandbox


class CaseWatch:
    """Follows the journals while a launch runs: stops a case whose ranks all wait for messages nobody
    will send (at once, harness/deadlock.py), and the launch when a case overruns its deadline."""

    def __init__(self, run_dir: Path, nproc: int, case_deadline_s: float, startup_s: float,
                 stages: dict[int, int] | None = None, settle_s: float = 0.3, stop_grace_s: float = limits.STOP_GRACE_S,
                 disk_limit: int | None = None, load_limit_s: float = 0.0):
        self.run_dir = run_dir
        self.paths = [runfolder.journal_path(run_dir, r) for r in range(nproc)]
        self.offsets = [0] * nproc
        self.case_deadline_s, self.startup_s = case_deadline_s, startup_s
        self.stages = stages or {}
        self.settle_s, self.stop_grace_s = settle_s, stop_grace_s
        self.started_at = time.monotonic()
        self.current, self.current_since = None, None
        self.case_clock, self.clock_read_at = None, 0.0    # the current case's ranks' clock, when last read
        self.ended: set[int] = set()
        self.loading: dict[int, int] = {}               # rank -> the case whose answer it is loading now
        # time some rank spent loading an answer: the startup deadline does not count it, up to a backstop.
        # The ranks end a load on their own clock (worker.load_answers_under_test), which leaves out the time
        # a busy machine kept them waiting: this wall clock would not, and would decide the verdict by the load
        self.loading_s, self.polled_at = 0.0, self.started_at
        self.loading_backstop_s = limits.LOADING_BACKSTOP * load_limit_s
        self.died: set[int] = set()                     # cases whose answer, as it loaded, killed the ranks' parents
        self.progress = deadlock.Progress()
        self.stuck: dict[int, deadlock.Stuck] = {}      # case -> its state when the watch stopped it
        self.stopped_at: dict[int, float] = {}          # case -> when (time.monotonic)
        self.stop_clocks: dict = {}                     # case -> its ranks' clock since they were asked to stop
        self.stop_times: dict[int, float] = {}          # case -> when (time.perf_counter, the journals' clock)
        self.disk_limit, self.disk_checked = disk_limit, 0.0
        self.qids: dict[int, str] = {}                  # case -> its exercise, to name in the disk limit's message
        # case -> rank -> the compute operations and messages it began, in the order this process read them
        # live, each [kind, micro-batch, chunk, when read (time.monotonic)]: what judge/record.py holds a
        # rank's returned events to (a rank that rewrites its records afterwards contradicts what was read here)
        self.observed: dict[int, dict[int, list]] = {}
        # case -> rank -> the begins ("B") and ends ("E") of its backwards and the lab's marks ("M": q20's launches),
        # [tag, kind, micro-batch or number], in the order the rank journalled them, as this process read them
        self.order: dict[int, dict[int, list]] = {}
        # the watchdog thread polls, and the launching thread reads the last lines after a group: one reader at a
        # time, or a line is fed twice (a receive counted twice looks like one waiting for a message never sent)
        self._reading = threading.Lock()

    def _read(self) -> None:
        with self._reading:
            self._read_new_lines()

    def _read_new_lines(self) -> None:
        for i, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[i])
                    chunk = f.read()
            except FileNotFoundError:
                continue
            complete = chunk[: chunk.rfind(b"\n") + 1]   # a line still being written waits for the next poll
            self.offsets[i] += len(complete)
            for line in complete.decode(errors="replace").splitlines():
                parsed = runfolder.parse_line(line)
                if parsed is None:
                    continue
                self.progress.feed(i, *parsed)
                self._observe(i, parsed)
                mark = runfolder.parse_case_line(line)
                if mark is None:
                    continue
                what, index = mark
                if what == "load":
                    self.loading[i] = index
                elif what == "loaded":
                    self.loading.pop(i, None)
                elif what == "died":
                    self.died.add(index)
                elif what == "start" and index != self.current and index not in self.ended:
                    self.current, self.current_since = index, time.monotonic()
                    self.case_clock, self.clock_read_at = own_time.TreeClock(), self.current_since
                elif what == "end":
                    self.ended.add(index)

    def _keep_what_was_read(self, case: int) -> None:
        """Each journal as far as the watch had read it when it stopped `case` (runfolder.stopped_journal_path):
        what `deadlock.Progress.stuck` decided on, to replay it (the journals themselves are replaced by the next
        launch group's)."""
        for rank, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    read = f.read(self.offsets[rank])
            except FileNotFoundError:
                continue
            runfolder.stopped_journal_path(self.run_dir, case, rank).write_bytes(read)

    def _observe(self, rank: int, parsed: tuple) -> None:
        _, tag, payload = parsed
        if tag in ("B", "E", "M") and isinstance(payload, list) and len(payload) >= 3 and \
                (payload[1] in ORDERED or tag == "M"):
            try:
                self.order.setdefault(int(payload[0]), {}).setdefault(rank, []).append([tag, payload[1], payload[2]])
            except (TypeError, ValueError):
                pass
        if tag not in ("B", "P") or not isinstance(payload, list) or len(payload) < 3 or payload[1] not in OBSERVED:
            return
        try:
            index = int(payload[0])
        except (TypeError, ValueError):
            return
        chunk = payload[4] if len(payload) > 4 else 0
        self.observed.setdefault(index, {}).setdefault(rank, []).append(
            [payload[1], payload[2], chunk, round(time.monotonic(), 4)])

    def _over_disk_limit(self, now: float) -> str | None:
        """Checked 4 times a second: the run folder over `disk_stop_factor` times `disk_limit` stops the launch
        (sandbox.disk_usage). A case that ends over the limit itself fails on its ranks (worker.py), which is
        what decides whose cases fail; this stops one still writing, and names the case that ran when seen."""
        if self.disk_limit is None or now - self.disk_checked < 0.25:
            return None
        self.disk_checked = now
        used = sandbox.disk_usage(self.run_dir)
        if used <= self.disk_limit * sandbox.Limits().disk_stop_factor:
            return None
        sandbox.remove_large_files(self.run_dir, limits.OBS_LIMIT_BYTES)
        qid = self.qids.get(self.current, "an exercise") if self.current is not None else None
        return sandbox.disk_limit_message(qid, used, self.disk_limit)

    def __call__(self) -> str | None:
        self._read()
        now = time.monotonic()
        full = self._over_disk_limit(now)
        if full:
            return full
        polled_at, self.polled_at = self.polled_at, now
        if self.current is None:
            if self.loading:
                self.loading_s += now - polled_at
            if now - self.started_at > self.startup_s + min(self.loading_s, self.loading_backstop_s):
                return (f"the ranks did not start within {self.startup_s:.0f} s (starting includes running "
                        f"the answer cells under test once on every rank)")
            return None
        case = self.current
        if case in self.ended:
            return None
        if case in self.stopped_at:
            if now - self.stopped_at[case] > self.stop_grace_s and self._past_stop_grace(case, now):
                return (f"a deadlock: every rank was waiting, and the ranks did not stop when asked "
                        f"within {self.stop_grace_s:.0f} s")
        elif case in self.stages and now - self.progress.changed_at >= self.settle_s:
            stuck = self.progress.stuck(case, self.stages[case])
            if stuck is not None:
                self.stuck[case], self.stopped_at[case] = stuck, now
                self.stop_clocks[case] = own_time.TreeClock()
                self.stop_times[case] = time.perf_counter()
                runfolder.stop_path(self.run_dir, case).write_text("\n".join(stuck.lines()) + "\n")
                self._keep_what_was_read(case)
        if now - self.current_since > self.case_deadline_s and self._past_case_deadline(now):
            return f"case deadline of {self.case_deadline_s:.0f} s"
        return None

    def _past_stop_grace(self, case: int, now: float) -> bool:
        """Past the stop's grace on the wall clock, are the ranks past it on their own clock too, or past the
        backstop? A stopped wait returns within a poll, but a rank starved of CPU polls late: under a CI run's load
        nico's q19 ranks did not stop within 5 s of wall time, and the case's feedback changed. Read twice a
        second, as the deadline's."""
        clock = self.stop_clocks.get(case)
        if clock is None or now - self.stopped_at[case] > limits.BUSY_BACKSTOP * self.stop_grace_s:
            return True
        if now - self.clock_read_at < 0.5:
            return False
        self.clock_read_at = now
        return clock.elapsed_s() > self.stop_grace_s

    def _past_case_deadline(self, now: float) -> bool:
        """Past the wall clock's deadline, is the case past it on its ranks' clock too (the time a busy
        machine kept them waiting for a CPU does not count), or past the backstop? Read twice a second."""
        if self.case_clock is None or now - self.current_since > limits.BUSY_BACKSTOP * self.case_deadline_s:
            return True
        if now - self.clock_read_at < 0.5:
            return False
        self.clock_read_at = now
        return self.case_clock.elapsed_s() > self.case_deadline_s


# The operations whose order the watch records: pipeline/ops.py's compute operations and messages, by their
# journal names (this process imports no torch)
ORDERED = ("backward", "backward_input", "backward_weight")     # whose begin and end `order` keeps
OBSERVED = ("forward", "backward", "backward_input", "backward_weight",
            "recv_forward", "send_forward", "recv_backward", "send_backward")
