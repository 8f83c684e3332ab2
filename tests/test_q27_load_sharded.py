"""q27: a checkpoint of q21's sharded training state, saved on n ranks, loaded on m.

Fast, in this process: the shards and their overlaps against torch.tensor_split and torch.chunk; the prediction; what
the process's read counters count (the allowances of records.py rest on it); the reference answer and each realistic
mistake saved by n "ranks" and loaded by m one after another in this process, with the judge's written, read and state
parts (the next step needs real ranks); the figure. Multi-process: the reference passes the visible check, and the
hidden tests grade the reference, each mistake and valid answers written otherwise in one launch.
"""
from __future__ import annotations

import json
import os
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grader.cohort.answers import answer

pytestmark = pytest.mark.q27


def _module(text: str):
    module = types.ModuleType("q27_answer")
    exec(compile(text, "q27_answer", "exec"), module.__dict__)  # noqa: S102 - an answer of the cohort
    return module


def test_shards_overlaps_and_the_prediction():
    from lab_src.topics.checkpoint.records import (
        chunk_bounds,
        even_bounds,
        overlaps,
        prediction_wanted,
        shard_bounds,
        slice_bytes,
        whole_files_bytes,
    )
    for total in (10, 11, 105_913, 28_909):
        x = torch.arange(total)
        for n in (1, 2, 3, 4, 5):
            for i, piece in enumerate(torch.tensor_split(x, n)):
                a, b = shard_bounds(total, n, i)
                assert torch.equal(piece, x[a:b])
            for i, piece in enumerate(torch.chunk(x, n)):
                a, b = chunk_bounds(total, n, i)
                assert torch.equal(piece, x[a:b])
            assert sum(b - a for a, b in (even_bounds(total, n, i) for i in range(n))) == total
            for m in (1, 2, 3, 4):
                for j in range(m):
                    a, b = shard_bounds(total, m, j)
                    got = torch.cat([x[lo:hi] for _, lo, hi in overlaps(total, n, m, j)])
                    assert torch.equal(got, x[a:b])
    # N = 105,913 (the hidden tests'): torch.chunk's pieces differ from tensor_split's shards on 3 and 4 ranks only
    assert [chunk_bounds(105_913, 2, i) for i in range(2)] == [shard_bounds(105_913, 2, i) for i in range(2)]
    assert chunk_bounds(105_913, 3, 1) != shard_bounds(105_913, 3, 1)
    assert chunk_bounds(105_913, 4, 1) != shard_bounds(105_913, 4, 1)
    # new rank 1 of 3 of a million float32 elements saved on 4: [333,334, 666,667), from old ranks 1 and 2
    assert shard_bounds(1_000_000, 3, 1) == (333_334, 666_667)
    assert [i for i, _, _ in overlaps(1_000_000, 4, 3, 1)] == [1, 2]
    assert prediction_wanted() == {"bytes_rank1": 3_999_996, "files_rank1": 2, "whole_files_rank1": 6_000_000}
    assert slice_bytes(1_000_000, 3, 1, 4) == 3_999_996 and whole_files_bytes(1_000_000, 4, 3, 1, 4) == 6_000_000


def test_what_the_read_counters_count(tmp_path):
    """records.py's READ_SLACK_PER_FILE rests on these: rchar counts what read() returned, a buffered reader's small
    read costs a block, numpy's fromfile a little more than it keeps, and a memory map nothing."""
    import numpy as np

    from lab_src.topics.checkpoint.kind import io_counters
    from lab_src.topics.checkpoint.records import READ_SLACK_PER_FILE
    path = tmp_path / "a.bin"
    path.write_bytes(torch.randn(100_000).numpy().tobytes())

    def counted(fn) -> int:
        before = io_counters()["rchar"]
        fn()
        return io_counters()["rchar"] - before
    base = counted(lambda: None)                 # reading /proc/self/io itself

    def sliced():
        t = torch.empty(20_000)
        with open(path, "rb") as f:
            f.seek(4 * 12_345)
            f.readinto(t.view(torch.uint8).numpy())

    def small():
        with open(path, "rb") as f:
            f.seek(4 * 12_345)
            f.read(40)
    assert counted(sliced) - base == 80_000
    assert 40 <= counted(small) - base <= READ_SLACK_PER_FILE
    assert 80_000 <= counted(lambda: np.fromfile(path, dtype=np.float32, count=20_000, offset=4 * 12_345)) - base \
        <= 80_000 + READ_SLACK_PER_FILE
    assert counted(lambda: path.read_bytes()) - base >= 400_000
    mapped = counted(lambda: np.array(np.memmap(path, dtype=np.float32, mode="r", offset=4 * 12_345, shape=(20_000,))))
    assert mapped - base < 4096                  # a memory map: what the counters cannot see


def in_process(text: str, n: int, m: int, total: int, dtype, root: Path):
    """The answer's save on n 'ranks', then its load on m, one after another in this process (no collective is
    needed by either), recorded as the kind records them; the judge's parts (the next step needs real ranks)."""
    from lab_src.harness.case import Case, CaseOutcome
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.checkpoint import judge
    from lab_src.topics.checkpoint.kind import FOLDER_PREFIX, io_counters
    from lab_src.topics.checkpoint.records import shard_bounds
    mod = _module(text)
    g = torch.Generator().manual_seed(0)
    flat = torch.randn(total, generator=g, dtype=dtype)
    params = list(flat.split([7, 13, total - 20]))
    case = Case(kind="checkpoint", qid="q27", config=LabConfig(num_stages=1), answers={}, label="in process",
                stages=max(n, m), index=0, settings={"save": n, "load": m})
    folder = root / f"{FOLDER_PREFIX}0"
    folder.mkdir()
    obs = {r: {"kind": "checkpoint", "rank": r, "stages": max(n, m), "error": None, "elements": total,
               "element_size": flat.element_size()} for r in range(max(n, m))}
    obs[0]["folder"] = str(folder)
    for r in range(n):
        a, b = shard_bounds(total, n, r)
        state = {"step": 2, "exp_avg": torch.randn(b - a, generator=g, dtype=dtype),
                 "exp_avg_sq": torch.rand(b - a, generator=g, dtype=dtype)}
        obs[r]["saved"] = {"step": 2, "params": flat[a:b].clone(), "exp_avg": state["exp_avg"].clone(),
                           "exp_avg_sq": state["exp_avg_sq"].clone()}
        before = io_counters()["wchar"]
        mod.save_sharded(params, state, SimpleNamespace(size=n, rank=r, ranks=list(range(n)), group=None), folder)
        obs[r]["written"] = io_counters()["wchar"] - before
    for j in range(m):
        before = io_counters()["rchar"]
        loaded = mod.load_sharded(folder, SimpleNamespace(size=m, rank=j, ranks=list(range(m)), group=None))
        obs[j]["reads"] = io_counters()["rchar"] - before
        obs[j]["loaded"] = {**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in loaded.items()},
                            "types": {k: type(v).__name__ for k, v in loaded.items()}}
    return judge.judge_run(CaseOutcome(case=case, obs=obs))


# the hidden tests' cases: (n, m, N, dtype)
RESHARDS = [(4, 2, 105_913, torch.float32), (4, 3, 105_913, torch.float32), (4, 4, 105_913, torch.float32),
            (2, 4, 105_913, torch.float32), (3, 4, 105_913, torch.float32), (4, 3, 28_909, torch.float64)]
# name: {part: the cases (indices of RESHARDS) where it fails, and what it says}
IN_PROCESS = {
    "q27_whole_params_every_rank": {"written": (range(6), "every saving rank wrote the whole parameters")},
    "q27_torch_chunk": {"state": ((1, 2, 3, 4, 5), "torch.chunk's piece 1")},
    "q27_whole_files": {"read": ((1, 3, 4, 5), "whole files: the shards of old rank")},
    "q27_offsets_guessed": {"state": (range(6), "the old shards' offsets were guessed")},
    "q27_step_not_saved": {"state": (range(6), "its step count is 0; the saved state's is 2")},
    "q27_no_params": {"written": (range(6), "the parameters' shard is not saved"),
                      "state": (range(6), "load_sharded returned no 'params'")},
}


def test_the_reference_and_each_mistake_saved_and_loaded_in_process(reference, tmp_path):
    right = Path(reference["q27"]).read_text()
    texts = {"reference": right, **{name: answer(name) for name in IN_PROCESS}}
    wrong = []
    for name, text in texts.items():
        fails = IN_PROCESS.get(name, {})
        for i, (n, m, total, dtype) in enumerate(RESHARDS):
            root = tmp_path / f"{name}-{i}"
            root.mkdir()
            found = in_process(text, n, m, total, dtype, root)
            for part in ("written", "read", "state"):
                cases, says = fails.get(part, ((), ""))
                said = " ".join(p.message for p in found[part])
                if (i in cases) != bool(found[part]) or (found[part] and says not in said):
                    wrong.append((name, (n, m, str(dtype)), part, said[:300]))
    assert not wrong, wrong


def test_the_figure():
    from lab_src.checks.q27_load_sharded import reads_figure
    from lab_src.topics.checkpoint.figure import reshard_figure
    assert len(reshard_figure(total=1_000_000, old=4, new=3).axes) == 1
    fig = reshard_figure(total=1000, old=2, new=3, reads={0: 1200, 1: 1300, 2: 1200}, element=4)
    assert any("read 1,300 B" in t.get_text() for t in fig.axes[0].texts)
    assert reads_figure(SimpleNamespace(skipped=True)) is None


def test_reference_passes_the_visible_check(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q27")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join(capsys.readouterr().out.split())
    assert report.ok and "q27: all checks passed" in out, out
    assert "the next step: as from the state handed over in memory (bitwise), as the uninterrupted run: right" in out
    assert "bytes_rank1 3,999,996 right" in out and "whole_files_rank1 6,000,000 right" in out, out
    from lab_src.checks.q27_load_sharded import reads_figure
    assert reads_figure(report) is not None


# name: (the answer, its fraction of the points, what its feedback must say); parts: written, read, state, continues
# (6 cases each), prediction (3 figures), a fifth each
MISTAKES = {
    "reference": (None, 1.0, "27 of 27 hidden checks passed"),
    # the disk holds the parameters n + 2 times over ... in every case
    "q27_whole_params_every_rank": (answer("q27_whole_params_every_rank"), 0.8,
                                    "every saving rank wrote the whole parameters"),
    # wrong where torch.chunk's pieces are not tensor_split's shards: every case but 4 -> 2 (state, continues)
    "q27_torch_chunk": (answer("q27_torch_chunk"), 0.6667, "the load assumes even shards"),
    # whole files read where a new shard is smaller than the old files it overlaps: 4 -> 3 (twice), 2 -> 4, 3 -> 4
    "q27_whole_files": (answer("q27_whole_files"), 0.8667, "whole files: the shards of old rank"),
    "q27_offsets_guessed": (answer("q27_offsets_guessed"), 0.6, "the old shards' offsets were guessed"),
    "q27_step_not_saved": (answer("q27_step_not_saved"), 0.6, "its step count is 0; the saved state's is 2"),
    # written, state and the next step wrong in every case
    "q27_no_params": (answer("q27_no_params"), 0.4, "the model has its freshly built parameters"),
}

# written otherwise, valid: every point (only behaviour is judged)
VALID = {
    # os.pread on a descriptor, no file object
    "pread": [("import json\n", "import json\nimport os\n"),
              ("""        with open(folder / meta["file"], "rb") as f:
            for k, name in enumerate(meta["tensors"]):
                f.seek((k * meta["length"] + lo - meta["offset"]) * size)
                f.readinto(out[name][lo - start:hi - start].view(torch.uint8).numpy())""",
               """        fd = os.open(folder / meta["file"], os.O_RDONLY)
        try:
            for k, name in enumerate(meta["tensors"]):
                at = (k * meta["length"] + lo - meta["offset"]) * size
                data = bytearray(os.pread(fd, (hi - lo) * size, at))
                out[name][lo - start:hi - start] = torch.frombuffer(data, dtype=dtype)
        finally:
            os.close(fd)""")],
    # numpy's fromfile with an offset and a count
    "fromfile": [("import json\n", "import json\n\nimport numpy as np\n"),
                 ("""        with open(folder / meta["file"], "rb") as f:
            for k, name in enumerate(meta["tensors"]):
                f.seek((k * meta["length"] + lo - meta["offset"]) * size)
                f.readinto(out[name][lo - start:hi - start].view(torch.uint8).numpy())""",
                  """        for k, name in enumerate(meta["tensors"]):
            at = (k * meta["length"] + lo - meta["offset"]) * size
            raw = np.fromfile(folder / meta["file"], dtype=np.uint8, count=(hi - lo) * size, offset=at)
            out[name][lo - start:hi - start] = torch.from_numpy(raw).view(dtype)""")],
}


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q27"]).read_text()
    texts = {name: text if text is not None else right for name, (text, _, _) in MISTAKES.items()}
    for name, edits in VALID.items():
        texts[name] = right
        for old, new in edits:
            assert texts[name].count(old) == 1, (name, old)
            texts[name] = texts[name].replace(old, new)
    graded = grade_answers("q27", texts, reference, tmp_path)
    wrong = []
    for name, (_, fraction, says) in MISTAKES.items():
        got, lines = graded[name]
        if got != pytest.approx(fraction, abs=1e-4) or says not in " ".join("\n".join(lines).split()):
            wrong.append((name, got, lines))
    wrong += [(name, graded[name][0], graded[name][1]) for name in VALID if graded[name][0] != 1.0]
    assert not wrong, wrong


@pytest.mark.slow
def test_reads_and_writes_are_counted_in_the_grading_sandbox(tmp_path, no_leftovers):
    """In the sandbox a rank runs under a uid it changed to, which left /proc/self/io unreadable (the first grading
    of the cohort counted 0 B read by every rank: kind.io_counters now makes the process dumpable again): whole files
    read and the whole parameters written by every rank are named there too."""
    from grader.cohort.build import build_student
    from grader.cohort.students import Student
    from grader.trusted import grade_submission
    from lab_src.harness import sandbox
    if not sandbox.available():
        pytest.skip(sandbox.describe_unavailable())
    for name, (_, fraction, says) in MISTAKES.items():
        if name not in ("q27_whole_files", "q27_whole_params_every_rank"):
            continue
        folder = build_student(Student(name, name, answers={"q27": answer(name)}), tmp_path / "sub" / name)
        got = grade_submission(Path(folder), tmp_path / "work" / name, only=["q27"])["exercises"]["q27"]
        assert got["fraction"] == pytest.approx(fraction, abs=1e-4), got
        assert says in " ".join(" ".join(got["messages"]).split()), got
    # and there too, the reads are counted from outside the rank: a rewritten record keeps whole files' points
    forged = answer("q27_whole_files")
    for old, new in FORGED_READS:
        forged = forged.replace(old, new)
    folder = build_student(Student("forged", "forged", answers={"q27": forged}), tmp_path / "sub" / "forged")
    got = grade_submission(Path(folder), tmp_path / "work" / "forged", only=["q27"])["exercises"]["q27"]
    assert got["fraction"] == pytest.approx(0.8667, abs=1e-4), got
    assert "whole files: the shards of old rank" in " ".join(" ".join(got["messages"]).split()), got


def test_a_load_that_raises_on_some_ranks_stops_the_case_and_says_so(reference, tmp_path, no_leftovers):
    """The last rank raises in the load while the others go on to the next step's collectives: nothing hangs, the
    error is named first with its rank and line, the waiting ranks under it as its consequence, and the parts the
    save alone decides (what was written) keep their points."""
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q27"]).read_text()
    old = "    folder = Path(folder)\n    metas = sorted("
    assert right.count(old) == 1
    text = right.replace(old, "    folder = Path(folder)\n    if dp.rank == dp.size - 1:\n"
                              "        raise KeyError('offset')\n    metas = sorted(")
    got, lines = grade_answers("q27", {"raises_on_the_last_rank": text}, reference, tmp_path)["raises_on_the_last_rank"]
    said = "\n".join(lines)
    assert got == pytest.approx(0.2, abs=1e-4), said
    assert "KeyError: 'offset'" in said and "in load_sharded" in said, said
    assert said.index("KeyError") < said.index("What that caused"), said
    assert "stopped with the error above" in said and "site-packages" not in said, said


def test_a_save_left_as_released_ends_each_case_at_once(reference, tmp_path, no_leftovers):
    """save_sharded as the release hands it out. In a case that saves on fewer ranks than it loads on, the ranks that
    save nothing went on from the barrier after the save to the lab's handover, an all-gather of every rank that the
    raising ranks never joined and the deadlock watch does not see: they waited there for the case's deadline (45 s a
    case, and the stub's feedback depended on which of two clocks ran out first: the cohort's golden record of
    `untouched` differed in CI). The barrier now tells them who left the case: each case names the stub, none is
    stopped."""
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q27"]).read_text()
    start, end = right.index("def save_sharded("), right.index("def load_sharded(")
    text = right[:start] + "def save_sharded(params, state, dp, folder):\n    raise NotImplementedError()\n\n\n" \
        + right[end:]
    got, lines = grade_answers("q27", {"save_as_released": text}, reference, tmp_path)["save_as_released"]
    said = " ".join("\n".join(lines).split())
    assert "q27 save_sharded() is still the stub from the release" in said, said
    assert "(saved on 2, loaded on 4)" in said and "(saved on 3, loaded on 4)" in said, said
    assert "deadline" not in said and "stopped" not in said and "not run" not in said, said


# q27_whole_files, whose load then rewrites the lab's record of its reads: the kind's second reading of the process's
# counters is made to say that the load read exactly its slices
FORGED_READS = [
    ("    folder = Path(folder)\n    metas = sorted(",
     "    import lab_src.topics.checkpoint.kind as kind\n"
     "    at_start = getattr(kind, \"_real_io\", kind.io_counters)()        # the counters as the load begins\n"
     "    folder = Path(folder)\n    metas = sorted("),
    ("    return {\"step\": metas[0][\"step\"], **out}\n",
     "    need = sum(t.numel() * t.element_size() for t in out.values())\n"
     "    kind._real_io = real = getattr(kind, \"_real_io\", kind.io_counters)\n"
     "    def forged():                                 # once: the kind's reading after the load\n"
     "        kind.io_counters = real\n"
     "        return {**at_start, \"rchar\": at_start[\"rchar\"] + need}       # its slices, exactly\n"
     "    kind.io_counters = forged\n"
     "    return {\"step\": metas[0][\"step\"], **out}\n")]


def test_a_load_that_rewrites_its_record_of_the_reads_is_judged_by_the_count_from_outside(tmp_path, no_leftovers):
    """The launching process reads each rank's I/O counters at the fences around its load (kind `wire`): the
    rank's own record, rewritten to show its slices alone, is not what the read part is judged on, so whole files
    read are named as they are without the forgery."""
    from hidden_grading import grade_answers

    from grader.reference import reference_sources
    reference = {k: str(v) for k, v in reference_sources().items()}
    whole_files = answer("q27_whole_files")
    forged = whole_files
    for old, new in FORGED_READS:
        assert forged.count(old) == 1
        forged = forged.replace(old, new)
    graded = grade_answers("q27", {"forged": forged}, reference, tmp_path)
    got, lines = graded["forged"]
    said = " ".join("\n".join(lines).split())
    assert got == pytest.approx(0.8667, abs=1e-4), said
    assert "whole files: the shards of old rank" in said, said


def test_a_load_that_skips_the_fences_is_named_and_its_reads_not_taken_from_its_record(tmp_path, no_leftovers):
    """q27_whole_files whose load first makes the lab's fences answer themselves: the launching process then has no
    reading around the load, and the rank's own record (whole files) is not what vouches: the skip is named, and
    the read part fails in every case."""
    from hidden_grading import grade_answers

    from grader.reference import reference_sources
    reference = {k: str(v) for k, v in reference_sources().items()}
    old = "    folder = Path(folder)\n    metas = sorted("
    text = answer("q27_whole_files")
    assert text.count(old) == 1
    text = text.replace(old, "    import lab_src.harness.fence as fence\n"
                             "    fence.here = lambda name, force=False: True\n" + old)
    got, lines = grade_answers("q27", {"skips": text}, reference, tmp_path)["skips"]
    said = " ".join("\n".join(lines).split())
    assert got == pytest.approx(0.8, abs=1e-4), said
    assert "skipped the moments around its load" in said and "nothing vouches for its record" in said, said
