"""Parent side of q27 (save_sharded, load_sharded): judge what the ranks of a "checkpoint" case recorded (kind.py),
and the checkpoint's folder, measured here.

Four parts, read from behaviour, never from the answer's form:
    written    the folder's files (their sizes, read here by the judging process after the run, not reported by a
               rank) hold the state once: at least S = 3 N e bytes (the parameters and both moments, N elements of e
               bytes), at most S plus META_BYTES_PER_RANK per saving rank of metadata; a rank whose process wrote
               (wchar) the whole state or more is named
    read       each loading rank's process read (rchar) no more than its slices
               (3 (b - a) e for its shard [a, b) of torch.tensor_split over m) plus the folder's metadata and
               READ_SLACK_PER_FILE per file of the folder; reads of whole files, or of every file, are named
    state      what load_sharded returned equals the saved state's elements of the rank's new shard, bitwise (the
               load only moves bytes): 'params', 'exp_avg', 'exp_avg_sq' and the step; torch.chunk's pieces and
               offsets a few places off (old shards taken to be even: the metadata did not say where they begin) are
               named
    continues  the step after the load (q21's, on the m ranks) gives the loss and parameters of the same step taken
               from the state handed over in memory by the lab on the same m ranks, bitwise (same ranks, same ring,
               same inputs); and within q21's tolerance the uninterrupted run on the n ranks (another ring adds the
               replicas' gradients in another order: not bitwise)

A rank's wchar and rchar over its save and its load are read by the launching process from outside the rank, at the
fences around each call (`io_count`; the kind is `wire`); a rank of a watched case that skips them is named, and its
own record of them is taken only where no watch ran (a launch without fences) or its counters could not be read.
"""
from __future__ import annotations

from pathlib import Path

import torch

from lab_src.harness.settings import settings_of
from lab_src.judge.problems import Problem
from lab_src.topics.checkpoint.records import (
    FENCES,
    META_BYTES_PER_RANK,
    READ_SLACK_PER_FILE,
    TENSORS,
    chunk_bounds,
    overlaps,
    shard_bounds,
    slice_bytes,
    state_bytes,
    whole_files_bytes,
)

PARTS = ("written", "read", "state", "continues")
WHAT = {"written": "the bytes on disk: the state once, plus metadata",
        "read": "each loading rank's reads: its slices, plus metadata and buffering",
        "state": "the state load_sharded returned: the saved elements of the new shard, bitwise",
        "continues": "the next step: as from the state handed over in memory (bitwise), as the uninterrupted run"}
FOLDER_PREFIX = "checkpoint-c"          # kind.py's: the folder's name in the run folder
LR_SHARE = 0.01                         # q21's tolerance: rtol 1e-5, atol 1e-6 + 1% of lr per step


def measure_folder(outcome) -> tuple[dict[str, int], str]:
    """{relative path: size} of the checkpoint's files, and who measured them: this process when it can read the
    folder (it always can: the run folder is the launching process's), else rank 0's listing after the save."""
    o0 = outcome.obs.get(0) or {}
    folder = o0.get("folder")
    if folder:
        path = Path(folder)
        if path.name == f"{FOLDER_PREFIX}{outcome.case.index}" and path.is_dir():
            return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}, \
                "measured by the grader"
    return dict(o0.get("listing") or {}), "as rank 0 listed it"


def saved_whole(outcome, n: int) -> dict:
    """The saved state's three tensors whole (the saving ranks' shards, in order) and its step."""
    out = {}
    for name in TENSORS:
        pieces = [(outcome.obs.get(i) or {}).get("saved", {}).get(name) for i in range(n)]
        out[name] = torch.cat([p.reshape(-1) for p in pieces]) if all(isinstance(p, torch.Tensor) for p in pieces) \
            else None
    out["step"] = ((outcome.obs.get(0) or {}).get("saved") or {}).get("step")
    return out


def sizes(outcome) -> tuple[int, int]:
    o0 = outcome.obs.get(0) or {}
    return int(o0.get("elements") or 0), int(o0.get("element_size") or 4)


def judge_run(outcome) -> dict[str, list[Problem]]:
    s = settings_of(outcome.case)
    n, m = s.save, s.load
    files, who = measure_folder(outcome)
    found = {"written": written_problems(outcome, n, files, who), "read": read_problems(outcome, n, m, files),
             "state": [], "continues": []}
    whole = saved_whole(outcome, n)
    for j in range(m):
        found["state"] += state_problems(outcome, n, m, j, whole)
        found["continues"] += continue_problems(outcome, m, j)
    return found


def io_count(outcome, rank: int, what: str) -> tuple[int | None, Problem | None]:
    """The bytes rank `rank`'s process wrote during its save (`what` "save": wchar) or read during its load ("load":
    rchar): the launching process's count, read from outside the rank at the fences around the call (kind.py); the
    rank's own record only where no watch ran or the counters could not be read there. (None, a problem): a rank of
    a watched case that left no reading of the fences, whose record nothing vouches for."""
    key, own = {"save": ("wchar", "written"), "load": ("rchar", "reads")}[what]
    o = outcome.obs.get(rank) or {}
    count = (outcome.wire or {}).get(rank)
    if count is not None and not outcome.wire_failed:
        names = list(count.readings)
        begin, end = FENCES[what]
        if begin not in names or end not in names[names.index(begin) + 1:]:
            if o.get("error") or outcome.failure:
                return None, None           # the rank stopped (its error is the case's problem)
            return None, Problem(f"rank {rank} skipped the moments around its {what} where the grader counts the "
                                 f"bytes its process {'wrote' if what == 'save' else 'read'} (the fences '{begin}' "
                                 f"and '{end}'): nothing vouches for its record of them", rank=rank,
                                 gist=f"q27: the {what}'s bytes not counted")
        got = count.io_between(begin, end)
        if got and key in got:
            return got[key], None
    return (int(o[own]) if o.get(own) is not None else None), None


def written_problems(outcome, n: int, files: dict, who: str) -> list[Problem]:
    total, e = sizes(outcome)
    S = state_bytes(total, e)
    on_disk = sum(files.values())
    most = S + n * META_BYTES_PER_RANK
    head = (f"the checkpoint's folder holds {on_disk:,} B in {len(files)} files ({who}); the state is {S:,} B once "
            f"(the parameters and both moments: 3 x {total:,} elements of {e} B)")
    # what each saving rank's process wrote during its save (wchar): beyond its shard and its metadata, it wrote
    # another rank's elements (to a file of its own, or over a file another rank writes too)
    over, unvouched = {}, []
    for r in range(n):
        written, problem = io_count(outcome, r, "save")
        if problem is not None:
            unvouched.append(problem)
        written = written or 0
        a, b = shard_bounds(total, n, r)
        if written > 3 * (b - a) * e + META_BYTES_PER_RANK:
            over[r] = (written, 3 * (b - a) * e, 2 * (b - a) * e + total * e)
    if len(over) == n and all(w >= S for w, _, _ in over.values()):
        who_wrote = "every saving rank wrote the whole state or more"
    elif len(over) == n and all(w >= whole_params for w, _, whole_params in over.values()):
        who_wrote = ("every saving rank wrote the whole parameters (whole on every rank under q21) beside its "
                     "moments")
    elif over:
        who_wrote = f"rank{'s' if len(over) > 1 else ''} {', '.join(map(str, over))} wrote more than its shard"
    else:
        who_wrote = ""
    said = "; ".join(f"rank {r} wrote {w:,} B, its shard {mine:,} B" for r, (w, mine, _) in over.items())
    fix = "each rank writes only its shard of the parameters and of the moments"
    if on_disk > most:
        why = f": {who_wrote} ({said}): {fix}" if who_wrote else ": elements written more than once"
        return unvouched + [Problem(f"{head}, plus at most {n * META_BYTES_PER_RANK:,} B of metadata "
                                    f"({META_BYTES_PER_RANK:,} B a saving rank){why}",
                                    gist="q27: the state written more than once")]
    if on_disk < S:
        why = ""
        if on_disk >= 2 * S // 3 and on_disk < S - total * e // 2:
            why = ": the moments alone are 2/3 of it: the parameters' shard is not saved"
        return unvouched + [Problem(f"{head}: less than the state{why}",
                                    gist="q27: the checkpoint holds less than the state")]
    if over:
        return unvouched + [Problem(f"the folder holds the state once, but {who_wrote}: {said} (the process's bytes "
                                    f"passed to write(), beyond {META_BYTES_PER_RANK:,} B of metadata): {fix}",
                                    gist="q27: the state written more than once")]
    return unvouched


def read_problems(outcome, n: int, m: int, files: dict) -> list[Problem]:
    total, e = sizes(outcome)
    S = state_bytes(total, e)
    on_disk = sum(files.values())
    meta = max(0, on_disk - S)
    slack = meta + READ_SLACK_PER_FILE * max(1, len(files))
    out = []
    for j in range(m):
        reads, problem = io_count(outcome, j, "load")
        if problem is not None:
            out.append(problem)
        if reads is None:
            continue
        need = slice_bytes(total, m, j, e)
        if reads > need + slack:
            whole = whole_files_bytes(total, n, m, j, e)
            opened = [i for i, _, _ in overlaps(total, n, m, j)]
            if reads >= S:
                why = f": every old rank's shards whole ({S:,} B) or more"
            elif reads >= whole:
                why = (f": whole files: the shards of old rank{'s' if len(opened) > 1 else ''} "
                       f"{', '.join(map(str, opened))} whole are {whole:,} B")
            else:
                why = ""
            out.append(Problem(f"rank {j} of {m} read {reads:,} B; its slices are {need:,} B (its shard of the three "
                               f"tensors), with the metadata and {READ_SLACK_PER_FILE:,} B a file of buffering at "
                               f"most {need + slack:,} B{why}: read only the slices of the old shards your new shard "
                               f"overlaps (seek to them)", rank=j, gist="q27: reads beyond the slices"))
        elif reads < need and not state_problems(outcome, n, m, j, saved_whole(outcome, n)):
            out.append(Problem(f"the lab counted {reads:,} B read by rank {j} of {m}, less than the {need:,} B of "
                               f"slices it returned: a memory map (np.memmap, torch.from_file, mmap) is not counted by "
                               f"the process's read counters; read with readinto, os.pread or np.fromfile, as the "
                               f"contract says", rank=j, gist="q27: reads the lab cannot count"))
    return out


def _differ(got: torch.Tensor, want: torch.Tensor) -> int:
    return int((got != want).sum())


def shifted_by(got: torch.Tensor, full: torch.Tensor, a: int, b: int, reach: int) -> int | None:
    """How many of got's elements (the new shard [a, b)) are not full's at their place but are full's within `reach`
    places: offsets a few elements off."""
    wrong = got != full[a:b]
    if not bool(wrong.any()):
        return None
    near = torch.zeros_like(wrong)
    index = torch.arange(a, b)
    for d in range(-reach, reach + 1):
        if d:
            at = (index + d).clamp(0, full.numel() - 1)
            near |= (got == full[at]) & (index + d >= 0) & (index + d < full.numel())
    return int((wrong & near).sum())


def state_problems(outcome, n: int, m: int, j: int, whole: dict) -> list[Problem]:
    o = outcome.obs.get(j) or {}
    loaded = o.get("loaded")
    if loaded is None:
        return []
    if "returned" in loaded:
        return [Problem(f"load_sharded returned {loaded['returned']}, not the state (a dict)", rank=j,
                        gist="q27: load_sharded returns a dict")]
    total, e = sizes(outcome)
    a, b = shard_bounds(total, m, j)
    out = []
    for name in TENSORS:
        full = whole.get(name)
        got = loaded.get(name)
        if full is None:
            continue
        if got is None:
            said = (" (this rank's shard of the flat parameters: without it the model keeps its freshly built "
                    "parameters)" if name == "params" else "")
            out.append(Problem(f"load_sharded returned no {name!r}{said}", rank=j, gist=f"q27: no {name!r}"))
            continue
        if not isinstance(got, torch.Tensor):
            out.append(Problem(f"its {name!r} is {loaded.get('types', {}).get(name, type(got).__name__)}, not a "
                               f"tensor", rank=j, gist=f"q27: {name!r} not a tensor"))
            continue
        got = got.reshape(-1)
        if got.dtype != full.dtype:
            out.append(Problem(f"its {name!r} is {got.dtype}; the saved state's is {full.dtype}", rank=j,
                               gist="q27: another dtype"))
            continue
        if got.numel() == b - a and torch.equal(got, full[a:b]):
            continue
        c0, c1 = chunk_bounds(total, m, j)
        if got.numel() != b - a:
            if (c0, c1) != (a, b) and got.numel() == c1 - c0 and torch.equal(got, full[c0:c1]):
                why = (f": torch.chunk's piece {j} [{c0:,}, {c1:,}), not torch.tensor_split's shard {j} [{a:,}, "
                       f"{b:,}): the load assumes even shards (torch.tensor_split's first N % m shards are one "
                       f"element longer)")
                gist = "q27: torch.chunk's pieces"
            else:
                why = f", not the {b - a:,} of shard {j} [{a:,}, {b:,}) of torch.tensor_split over {m} ranks"
                gist = "q27: another length"
            out.append(Problem(f"its {name!r} has {got.numel():,} elements{why}", rank=j, gist=gist))
            continue
        bad = _differ(got, full[a:b])
        near = shifted_by(got, full, a, b, max(n, m) + 1)
        if near and near >= bad // 2:
            why = (f"; {near:,} of them are saved elements a few places away: the old shards' offsets were guessed "
                   f"(as if the {n} old shards were even); read each old shard's offset and length from its "
                   f"metadata")
            gist = "q27: offsets guessed"
        else:
            why, gist = "", f"q27: {name!r} differs"
        out.append(Problem(f"{bad:,} of the {b - a:,} elements of its {name!r} differ from the saved state's elements "
                           f"[{a:,}, {b:,}){why}", rank=j, gist=gist))
    step, want = loaded.get("step"), whole.get("step")
    try:
        same = step is not None and int(step) == int(want)
    except (TypeError, ValueError, RuntimeError):
        same = False
    if want is not None and not same:
        out.append(Problem(f"its step count is {step!r}; the saved state's is {want}: AdamW's bias correction "
                           f"would start again (save the step count, and load it)", rank=j,
                           gist="q27: the step count not restored"))
    return out


def continue_problems(outcome, m: int, j: int) -> list[Problem]:
    o = outcome.obs.get(j) or {}
    c, h = o.get("continued"), o.get("handed")
    if c is None or h is None:
        return []
    if c.get("skipped") or c.get("raised"):
        why = c.get("skipped") or c.get("raised")
        verb = "cannot take" if c.get("skipped") else "raised on"
        # a rank whose own state was fine but another's was not: that rank's problem, said after it
        return [Problem(f"q21's step {verb} the state load_sharded returned: {why}", rank=j,
                        gist="q27: q21's step cannot go on", consequence=c.get("skipped", "").startswith("another"))]
    out = []
    if c.get("params_from") != "load":
        what = ("its freshly built parameters: load_sharded returned no 'params'" if c.get("params_from") == "fresh"
                else c.get("params_from"))
        out.append(Problem(f"after the load the model has {what}", rank=j, gist="q27: parameters not restored"))
    if c.get("loss") != h.get("loss") or not torch.equal(c["params"], h["params"]):
        bad = _differ(c["params"], h["params"]) if c["params"].shape == h["params"].shape else c["params"].numel()
        out.append(Problem(f"the step after the load differs from the same step taken from the saved state handed "
                           f"over in memory on the same {m} ranks: loss {c.get('loss')!r} against {h.get('loss')!r}, "
                           f"{bad:,} of {h['params'].numel():,} parameters differ", rank=j,
                           gist="q27: the next step differs"))
    if not out:
        u = (outcome.obs.get(0) or {}).get("uninterrupted") or {}
        lr = settings_of(outcome.case).lr
        want = u.get("params")
        if isinstance(want, torch.Tensor) and not torch.allclose(c["params"].double(), want.double(), rtol=1e-5,
                                                                 atol=1e-6 + LR_SHARE * lr):
            out.append(Problem(f"the step after the load, on {m} ranks, differs from the uninterrupted run's on "
                               f"{settings_of(outcome.case).save} (beyond q21's tolerance), though the state handed "
                               f"over gives the same: q21's step on {m} ranks (the answer to q21 used here)", rank=j,
                               gist="q27: q21's step on m ranks"))
    return out
