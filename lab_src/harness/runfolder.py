"""The folder of one run, and the journal format: the one place that knows both.

    run_dir/
        spec<N>.json              the cases of launch N (harness/runner.py writes, worker.py reads)
        journal.rank<r>.log       one line per event as it happens (worker and tracer write; the runner's
                                  watch and the deadlock report read)
        obs/c<i>.rank<r>.pt       what rank r observed in case i (torch.save of plain values)
        events-c<i>.json          case i's events, every rank on one clock
        rank<r>.log, torchrun.log the processes' own output

A journal line is `<time> <tag> <payload>`: tag C marks a case ("start 3", "end 3"); B and E mark the
beginning and end of an operation the rank is in (a forward, a blocking receive...), with payload
[case, kind, micro-batch, peer] as JSON; P marks a message posted that ends later (a raw isend or irecv of
q11: several may be open at once, and the rank goes on meanwhile), A [the same payload] that the rank
now waits for that posted message, and its E comes when the wait returns; W [case] says that the rank
has done its part of the case and only waits for the others (it sends nothing more).

    stop.c<i>                 written by the launching process to stop case i, whose ranks all wait
                              for messages nobody will send (pipeline/waiting.py reads it)
    stop.c<i>.journal.rank<r>.log   rank r's journal as far as the launching process had read it then: what
                              it decided on (harness/deadlock.py `Progress.stuck`, to replay it)
"""
from __future__ import annotations

import json
import time
from pathlib import Path


def spec_path(run_dir: Path, launch: int) -> Path:
    return Path(run_dir) / f"spec{launch}.json"


def journal_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"journal.rank{rank}.log"


def obs_path(run_dir: Path, case_index: int, rank: int) -> Path:
    return Path(run_dir) / "obs" / f"c{case_index}.rank{rank}.pt"


def events_path(run_dir: Path, case_index: int) -> Path:
    return Path(run_dir) / f"events-c{case_index}.json"


def stop_path(run_dir: Path, case_index: int) -> Path:
    return Path(run_dir) / f"stop.c{case_index}"


def stopped_journal_path(run_dir: Path, case_index: int, rank: int) -> Path:
    return Path(run_dir) / f"stop.c{case_index}.journal.rank{rank}.log"


def rank_log_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.log"


def rank_logs(run_dir: Path) -> dict[int, Path]:
    return {int(p.stem[4:]): p for p in sorted(Path(run_dir).glob("rank*.log")) if p.stem[4:].isdigit()}


# ---- journal lines ----------------------------------------------------------------------------------
def case_line(what: str, case_index: int) -> str:
    """'0 C start 3\\n': the case marks carry no time (the watch reads their order only)."""
    return f"0 C {what} {case_index}\n"


def op_line(tag: str, pending: list) -> str:
    return f"{time.perf_counter():.6f} {tag} {json.dumps(pending)}\n"


def parse_case_line(line: str) -> tuple[str, int] | None:
    """('start' | 'end', case index) for a case mark, else None."""
    parts = line.split()
    if len(parts) == 4 and parts[1] == "C" and parts[3].isdigit():
        return parts[2], int(parts[3])
    return None


def parse_line(line: str) -> tuple[float, str, list | str] | None:
    """(time, tag, payload) of one journal line, or None for a torn or foreign line."""
    parts = line.split(" ", 2)
    if len(parts) < 2:
        return None
    try:
        t = float(parts[0])
    except ValueError:
        return None
    tag = parts[1]
    payload = parts[2] if len(parts) > 2 else ""
    if tag in ("B", "E", "W", "P", "A", "M"):
        try:
            payload = json.loads(payload)
        except json.JSONDecodeError:
            return None
    return t, tag, payload


def read_journal(path: Path) -> list[tuple[float, str, list | str]]:
    """(time, 'B' | 'E' | 'P' | 'A' | 'W' | 'C', payload) for each journal line; torn last lines are skipped."""
    if not Path(path).exists():
        return []
    parsed = (parse_line(line) for line in Path(path).read_text(errors="replace").splitlines())
    return [p for p in parsed if p is not None]


# ---- keeping runs/ small ------------------------------------------------------------------------------
KEEP_RUNS = "LAB_KEEP_RUNS"     # how many runs of each exercise (or experiment) runs/ keeps; default 3
DEFAULT_KEEP = 3
RUNS_MB = "LAB_RUNS_MB"         # the most runs/ holds, all runs together, in MB; default 50 (0: no cap)
DEFAULT_RUNS_MB = 50


def _setting(name: str, default, kind):
    """$`name` as a number of `kind`, or `default` when it is unset or not a number."""
    import os
    try:
        return kind(os.environ.get(name, default))
    except ValueError:
        return default


def size_of(folder: Path) -> int:
    """The bytes of the files under `folder`."""
    total = 0
    for p in Path(folder).rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:
            pass
    return total


def drop_observations(run_dir: Path) -> None:
    """Remove a finished run's observation files (obs/): the run's outcomes hold them in memory once read, and
    they are most of a run's bytes (a bubble study's outputs and gradients, 200 MB). The events, the journals
    and the ranks' logs stay: what the figures, the deadlock report and report.outputs() read."""
    import shutil
    shutil.rmtree(Path(run_dir) / "obs", ignore_errors=True)


def cap_size(parent: Path, limit_mb: float | None = None) -> list[Path]:
    """Remove the oldest run folders of `parent` until all of them together weigh at most `limit_mb`
    ($LAB_RUNS_MB, or 50; 0: no cap), the newest one always kept: a hub holds each student's runs/, and a
    cap by count alone let one pass through a module leave 829 MB. Returns the folders removed."""
    import shutil
    limit_mb = _setting(RUNS_MB, DEFAULT_RUNS_MB, float) if limit_mb is None else limit_mb
    parent = Path(parent)
    if limit_mb <= 0 or not parent.is_dir():
        return []
    runs = sorted((d for d in parent.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    sizes = {d: size_of(d) for d in runs}
    total, removed = sum(sizes.values()), []
    for d in runs[:-1]:
        if total <= limit_mb * 1e6:
            break
        shutil.rmtree(d, ignore_errors=True)
        total -= sizes[d]
        removed.append(d)
    return removed


def prune(parent: Path, prefix: str, keep: int | None = None) -> list[Path]:
    """Remove the oldest run folders `<parent>/<prefix>-<time>-<pid>` beyond the newest `keep` - 1 (a new run
    is about to be made): a student's home holds the last few runs of each exercise, not every one (a
    bubble study's observations weigh over a hundred MB). `keep` defaults to $LAB_KEEP_RUNS, or 3; 0 keeps
    every run. Returns the folders removed."""
    import shutil
    keep = _setting(KEEP_RUNS, DEFAULT_KEEP, int) if keep is None else keep
    parent = Path(parent)
    if keep <= 0 or not parent.is_dir():
        return []
    mine = sorted((d for d in parent.iterdir() if d.is_dir() and d.name.startswith(prefix + "-")
                   and d.name[len(prefix) + 1:len(prefix) + 2].isdigit()), key=lambda d: d.stat().st_mtime)
    old = mine[:max(0, len(mine) - (keep - 1))]
    for d in old:
        shutil.rmtree(d, ignore_errors=True)
    return old
