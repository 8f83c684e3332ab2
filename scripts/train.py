"""`make train`: a longer training run of the digits classifier, outside grading (exercise q13).

    .venv/bin/python scripts/train.py                      # the reference answers, 1,200 steps
    .venv/bin/python scripts/train.py --answers answers/   # a student's answers folder instead
    .venv/bin/python scripts/train.py --steps 300 --out out/train-short

The 4-stage pipeline (torchrun, gloo on the CPU) trains with `train_pipeline` (q13) around the
registry's step (q08's AFAB), with a progress bar fed from the last rank's journal; then the whole
model trains in this process on the same seed and batches. Writes, under --out (default out/train/):
    curves.png     both learning curves overlaid, and their relative difference per step
    metrics.json   the settings, both runs' losses, held-out loss and accuracy, wall times
About 5 minutes on 2 CPU cores for 1,200 steps (27 epochs); held-out accuracy about 90 %. Over so many
steps the two curves agree step by step only at first (about 60 steps): float32 rounding differences
grow through training until each run follows its own path, at the same level.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tqdm import tqdm  # noqa: E402

from lab_src.harness import runfolder  # noqa: E402
from lab_src.harness.case import Case  # noqa: E402
from lab_src.harness.launcher import launch  # noqa: E402
from lab_src.harness.runner import _load_obs, stage_inputs, worker_env  # noqa: E402
from lab_src.topics.training.digits import DIGITS, Digits  # noqa: E402
from lab_src.registry import EXERCISES, exercise  # noqa: E402


def answers_from(folder: Path | None) -> dict[str, str]:
    """The answer files: a student's folder (answers/qNN_<function>.py), or the reference answers."""
    if folder is None:
        from grader.reference import reference_sources
        return reference_sources()
    found = {e.id: str(folder / e.answer_file) for e in EXERCISES.values() if e.function
             and (folder / e.answer_file).exists()}
    missing = [q for q in (*exercise("q13").needs, "q13") if q not in found]
    if missing:
        raise SystemExit(f"{folder} has no answer for {', '.join(missing)}")
    return found


class JournalProgress:
    """A watchdog for `launch`: reads the last rank's journal as it grows and moves the progress bar one
    step per `num_microbatches` finished backwards."""

    def __init__(self, run_dir: Path, rank: int, microbatches: int, bar: tqdm):
        self.path = runfolder.journal_path(run_dir, rank)
        self.m, self.bar, self.offset, self.backwards = microbatches, bar, 0, 0

    def __call__(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return None
        chunk = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(chunk)
        self.backwards += chunk.count(b' E ["0", "backward"')
        self.bar.update(self.backwards // self.m - self.bar.n)
        return None


def run_pipeline(cfg, answers: dict, steps: int, lr: float, run_dir: Path) -> tuple[dict, float]:
    ex = exercise("q13")
    case = Case(kind="train", qid="q13", config=cfg, answers=answers, label="make train", index=0,
                schedule=ex.schedule_of_step, step=ex.step_exercise,
                settings={"steps": steps, "lr": lr, "test_microbatches": None})
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = runfolder.spec_path(run_dir, 0)
    spec.write_text(json.dumps({"run_dir": str(run_dir), "timeout_s": 120, "log_limit": 200_000,
                                "cases": stage_inputs([case], run_dir)}))
    for r in range(cfg.num_stages):
        runfolder.journal_path(run_dir, r).unlink(missing_ok=True)
    with tqdm(total=steps, desc="pipeline, 4 ranks", unit="step", file=sys.stderr) as bar:
        watch = JournalProgress(run_dir, cfg.num_stages - 1, cfg.num_microbatches, bar)
        result = launch(cfg.num_stages, "lab_src.harness.worker", [str(spec)], run_dir=run_dir,
                        deadline_s=3600, watchdog=watch, env=worker_env())
        watch()
    obs = {r: _load_obs(runfolder.obs_path(run_dir, 0, r)) for r in range(cfg.num_stages)}
    errors = {r: o["error"] for r, o in obs.items() if o and o.get("error")}
    if not result.ok or errors or any(o is None for o in obs.values()):
        detail = "\n".join(f"rank {r}: {e['type']}: {e['message']}" for r, e in errors.items())
        raise SystemExit(f"the pipeline run failed ({result.stopped or result.returncode}):\n{detail}\n"
                         f"{result.launcher_log[-2000:]}\nlogs: {run_dir}")
    returned = obs[cfg.num_stages - 1].get("returned")
    if not isinstance(returned, dict) or not isinstance(returned.get("losses"), list):
        raise SystemExit(f"train_pipeline returned {returned!r:.300} on the last stage")
    return returned, result.wall_s


def run_single(cfg, steps: int, lr: float) -> tuple[dict, float]:
    from lab_src.topics.training.single_process import train_single_process
    started = time.monotonic()
    with tqdm(total=steps, desc="single process", unit="step", file=sys.stderr) as bar:
        result = train_single_process(cfg, Digits(cfg), steps, lr, progress=lambda k: bar.update(1))
    return result, time.monotonic() - started


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--answers", type=Path, help="a folder of answer files (default: the reference answers)")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "train")
    args = ap.parse_args(argv)
    cfg = DIGITS
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = Digits(cfg)
    print(f"{data}\nmodel: {cfg.describe()}, hidden size {cfg.hidden_size}; AdamW lr {args.lr}, {args.steps} steps "
          f"({args.steps / data.steps_per_epoch:.1f} epochs)", flush=True)
    pipe, pipe_s = run_pipeline(cfg, answers_from(args.answers), args.steps, args.lr, out / "run")
    single, single_s = run_single(cfg, args.steps, args.lr)
    diffs = [abs(a - b) / abs(b) for a, b in zip(pipe["losses"], single["losses"])]
    metrics = {
        "config": cfg.to_dict(), "steps": args.steps, "lr": args.lr, "optimizer": "AdamW (PyTorch defaults otherwise)",
        "held_out_images": data.num_test_microbatches * data.micro_batch_size,
        "pipeline": {"test_accuracy": pipe.get("test_accuracy"), "test_loss": pipe.get("test_loss"),
                     "final_loss": pipe["losses"][-1], "wall_s": round(pipe_s, 1), "losses": pipe["losses"]},
        "single_process": {"test_accuracy": single["test_accuracy"], "test_loss": single["test_loss"],
                           "final_loss": single["losses"][-1], "wall_s": round(single_s, 1),
                           "losses": single["losses"]},
        "largest_relative_difference": max(diffs),
        "first_step_above_1e-5": next((k for k, d in enumerate(diffs) if d > 1e-5), None),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    from lab_src.topics.training.curves import curves_figure
    held = {"pipeline": (pipe.get("test_accuracy") or 0.0, pipe.get("test_loss") or 0.0),
            "single process": (single["test_accuracy"], single["test_loss"])}
    fig = curves_figure(pipe["losses"], single["losses"], tolerance=1e-5, held_out=held, smooth=25,
                        title=f"the digits: 4-stage pipeline vs one process, {args.steps} steps")
    fig.savefig(out / "curves.png", dpi=110)
    print(f"held-out accuracy: pipeline {metrics['pipeline']['test_accuracy']:.1%}, single process "
          f"{single['test_accuracy']:.1%} ({metrics['held_out_images']} images)\n"
          f"largest relative loss difference over {args.steps} steps: {max(diffs):.1e}\n"
          f"wall time: pipeline {pipe_s:.0f} s, single process {single_s:.0f} s\n"
          f"wrote {out / 'curves.png'} and {out / 'metrics.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
