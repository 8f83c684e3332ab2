"""The exercises, declared once. Everything else derives from these declarations: the exercise API and
`lab_src.__all__`, each exercise's visible check and hidden-test module, the nbgrader notebook names, the
zip-collect pattern, the pytest markers, README's exercise table. Every file that belongs to exercise
qNN carries its module name `qNN_<function>`:

    solutions/<module>/qNN_<function>.ipynb (+ .py)      its source: prose, reference answer, test cells
    notebooks/<module>/qNN_<function>.ipynb              the student notebook (generated release)
    lab_src/exercises.py  @_exercise_api("qNN")          the stub and its contract (signature, docstring)
    lab_src/checks/qNN_<function>.py                     the visible check (`check("qNN")`)
    grader/hidden/qNN_<function>.py                      the hidden tests the grader runs out of process
    answers/qNN_<function>.py                            the student's answer, written by the %%answer cell

`python -m grader new qNN function_name --module M` writes the skeleton of a new exercise's files (with
`--module-title`, into a new module M). <module> is the course module (`MODULES` below) the exercise belongs to.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

ASSIGNMENT = "pipeline_lab"   # the core module: the default course's first assignment (its name kept for its files)
DEFAULT_STEP = "q08"     # the step that runs the pipeline cases of exercises that are not about a step
BASELINE_EXERCISE = "q04"  # the unsharded forward and backward every pipeline is compared with


@dataclass(frozen=True)
class Exercise:
    id: str                  # "q05"
    function: str            # the function the student writes ("" for q01: written answers only)
    title: str               # one line for headings and messages
    needs: tuple[str, ...]   # other exercises whose answers this one's checks run
    schedule: str = ""       # for a pipelined step (or what checks it): the schedule it is judged against
    step: str = ""           # the exercise whose step function this one's cases call ("": `step_exercise`)
    timeline: str = ""       # the hidden-test configuration whose run is drawn in the notebook's timeline cell
    # the share of a pipeline case's points a run keeps when it is a valid schedule, but not `schedule`
    other_schedule_credit: float = 0.0

    @property
    def assignment(self) -> str:
        """The course module (one nbgrader assignment, one folder solutions/<it>/, notebooks/<it>/) this
        exercise belongs to: MODULES says. (`module` below is older and names the exercise's files.)"""
        return module_of(self.id)

    @property
    def module(self) -> str:
        """'q05_distribute_layers': the name of every file of this exercise."""
        return f"{self.id}_{self.function or 'seeds'}"

    @property
    def notebook(self) -> str:
        return f"{self.module}.ipynb"

    @property
    def answer_file(self) -> str:
        return f"{self.id}_{self.function}.py"

    @property
    def answer_cell(self) -> str:
        """nbgrader grade_id of the solution cell holding the answer."""
        return f"{self.id}_answer"

    @property
    def hidden_cell(self) -> str:
        """nbgrader grade_id of the hidden-test cell that carries the autograded points."""
        return f"{self.id}_hidden"

    @property
    def judged_on_numbers(self) -> bool:
        """Whether a baseline (the unsharded model's outputs and gradients) is what this exercise's
        answer must reproduce: the baseline step itself and the pipelined steps. A launch that holds a
        baseline never runs such an exercise's student answer (harness/runner.py, `group_cases`)."""
        return self.id == BASELINE_EXERCISE or bool(self.schedule and not self.step)

    @property
    def step_exercise(self) -> str:
        """The exercise whose step function this one's cases call: the one place that decides it (a
        `Case` that names no step takes this one)."""
        return self.step or (self.id if self.schedule else DEFAULT_STEP)

    @property
    def schedule_of_step(self) -> str:
        """The schedule this exercise's pipeline and communication cases are judged against."""
        return self.schedule or EXERCISES[self.step_exercise].schedule


EXERCISES: dict[str, Exercise] = {e.id: e for e in [
    Exercise("q01", "", "Seeds across pipeline, data and tensor parallel ranks", ()),
    Exercise("q02", "check_args", "Argument checks: stages and micro-batches", ()),
    Exercise("q03", "activation_shape", "The tensors that travel between stages", ("q02",)),
    Exercise("q04", "baseline_step", "Baseline forward and backward of the whole model", ()),
    Exercise("q05", "distribute_layers", "Which layers each stage owns", ("q02", "q03")),
    Exercise("q06", "needs_dataloader", "Which ranks need the training dataloader", ("q02", "q03", "q05")),
    Exercise("q07", "pipeline_communicate", "The four point-to-point operations", ("q02", "q03", "q05"),
             schedule="afab", step="q08", timeline="more micro-batches than stages"),
    Exercise("q08", "afab_step", "All-Forward-All-Backward", ("q02", "q03", "q04", "q05", "q06", "q07"),
             schedule="afab", timeline="more micro-batches than stages", other_schedule_credit=0.5),
    Exercise("q09", "check_outputs", "Pipelined outputs equal the baseline",
             ("q02", "q03", "q04", "q05", "q06", "q07", "q08"), step="q08"),
    Exercise("q10", "check_gradients", "Each stage's gradients equal the baseline",
             ("q02", "q03", "q04", "q05", "q06", "q07", "q08"), step="q08"),
    Exercise("q11", "p2p_communicate", "Point-to-point messages with torch.distributed", ("q02", "q03", "q05"),
             schedule="1f1b", step="q12", timeline="more micro-batches than stages"),
    Exercise("q12", "one_f_one_b_step", "One-Forward-One-Backward", ("q02", "q03", "q04", "q05", "q06", "q11"),
             schedule="1f1b", timeline="more micro-batches than stages", other_schedule_credit=0.5),
    # q13 trains with the step of `step` (AFAB today): a step of another schedule with the same contract plugs in here
    Exercise("q13", "train_pipeline", "Train it: a real loss, an optimizer, one process's learning curve",
             ("q02", "q03", "q05", "q06", "q07", "q08"), step="q08"),
    # its own step (schedule set, no `step`): judged on the numbers, like q08; the pipeline inside it is q08's AFAB
    Exercise("q14", "dp_pp_step", "Data x pipeline parallel on a grid of ranks, tied embeddings",
             ("q02", "q03", "q04", "q05", "q06", "q07", "q08"), schedule="afab"),
    Exercise("q15", "interleaved_step", "Interleaved 1F1B with virtual stages", ("q02", "q03", "q04", "q05", "q06"),
             schedule="interleaved", timeline="4 ranks, 2 chunks, 8 micro-batches", other_schedule_credit=0.5),
    # its answer cell also defines the two halves of the split backward the stage calls (pipeline/split.py)
    Exercise("q16", "zero_bubble_step", "Zero bubble: split the backward, fill the bubble", ("q02", "q03", "q04", "q05", "q06"),
             schedule="zbh1", timeline="more micro-batches than stages", other_schedule_credit=0.5),
    Exercise("q17", "tp_layers", "Tensor parallel: column and row parallel layers, the MLP with one all-reduce", ()),
    Exercise("q18", "tp_block", "Tensor parallel: the whole block, dropout seeds, training to one process's curve", ("q17",)),
    Exercise("q19", "ring_all_reduce", "Data parallel from first principles: a ring all-reduce from point-to-point messages", ()),
    # its answer cell also defines the Reducer its step is handed (topics/data_parallel/kind_buckets.py)
    Exercise("q20", "bucketed_step", "Data parallel: gradient buckets reduced during the 1F1B backward",
             ("q02", "q03", "q05", "q11", "q19")),
    Exercise("q21", "sharded_adamw_step", "Sharding the training state: AdamW and the gradients over the data-parallel ranks (ZeRO-1/2)",
             ("q02", "q03", "q05", "q11", "q12")),
    Exercise("q22", "fsdp_layer", "Sharding the parameters too: FSDP inside a pipeline stage, layer by layer (ZeRO-3)",
             ("q02", "q03", "q05", "q11", "q12", "q19")),
    Exercise("q23", "recompute_block", "Long sequences: what a block keeps for its backward, and what recomputing it costs", ()),
    Exercise("q24", "ring_attention", "Long sequences: attention over a sequence split across ranks (ring attention, zigzag, Ulysses)", ()),
    # its answer cell also defines route, combine and sync_gradients, which the lab's MoE layer calls around it
    # (topics/experts/kind.py)
    Exercise("q25", "dispatch", "Mixture of experts: route, dispatch and combine with all-to-alls, the experts' gradients scaled", ()),
    Exercise("q26", "mixed_precision_layer", "Mixed precision in the sharded step: float32 master shards, bf16 gathers, fp16 loss scaling", ("q19",)),
    # its answer cell also defines save_sharded, which the lab calls on the ranks that save (topics/checkpoint/kind.py)
    Exercise("q27", "load_sharded", "A checkpoint of the sharded training state that loads on another number of ranks",
             ("q21",)),
]}

CODED = [e for e in EXERCISES.values() if e.function]

# The course modules, in course order: each is one nbgrader assignment (a course chooses which it hands out,
# course.toml: grader/plan.py). A module's exercises need only exercises of earlier modules or its own.
MODULES: dict[str, tuple[str, ...]] = {
    ASSIGNMENT: ("q01", "q02", "q03", "q04", "q05", "q06", "q07", "q08", "q09", "q10"),
    "pipeline_schedules": ("q11", "q12", "q15", "q16"),
    "pipeline_training": ("q13", "q14"),
    "tensor_parallel": ("q17", "q18"),
    "data_parallel": ("q19", "q20"),
    "sharding": ("q21", "q22", "q26", "q27"),
    "long_sequences": ("q23", "q24"),
    "experts": ("q25",),
}

# Each module's title: the heading of its assignment's README.md (grader/index.py). `grader new --module NEW
# --module-title "..."` adds a module to both tables.
MODULE_TITLES: dict[str, str] = {
    ASSIGNMENT: "Pipeline parallelism, the core: seeds, stages, communication, All-Forward-All-Backward, checks",
    "pipeline_schedules": "Schedules: point-to-point messages, 1F1B, interleaved 1F1B",
    "pipeline_training": "Training at scale: a real training loop, data x pipeline parallel",
    "tensor_parallel": "Tensor parallelism: layers, then the whole block split across ranks; dropout seeds; training",
    "data_parallel": "Data parallel from first principles: a ring all-reduce, then gradient buckets under the pipeline",
    "sharding": "Sharding the training state: the optimizer and the gradients over the data-parallel ranks (ZeRO)",
    "long_sequences": "Long sequences: activation memory, recomputation, sequence and context parallelism",
    "experts": "Mixture of experts: expert parallelism, all-to-all dispatch and combine, the experts' gradients",
}


def module_of(qid: str) -> str:
    for name, qids in MODULES.items():
        if qid in qids:
            return name
    raise KeyError(f"{qid} belongs to no module: add it to MODULES in lab_src/registry.py")


def module_exercises(name: str) -> list[Exercise]:
    try:
        return [EXERCISES[q] for q in MODULES[name]]
    except KeyError:
        raise KeyError(f"no module {name!r}; the modules are {', '.join(MODULES)}") from None


def module_order_problems() -> list[str]:
    """What breaks the rule that a module's exercises need only exercises of earlier modules or its own."""
    order = list(MODULES)
    out = []
    for name, qids in MODULES.items():
        for q in qids:
            for need in EXERCISES[q].needs:
                if order.index(module_of(need)) > order.index(name):
                    out.append(f"{q} ({name}) needs {need} of the later module {module_of(need)}")
    return out


def exercise(qid: str) -> Exercise:
    try:
        return EXERCISES[qid.lower()]
    except KeyError:
        raise KeyError(f"no exercise {qid!r}; the exercises are {', '.join(EXERCISES)}") from None


def notebook_pattern() -> str:
    """A regular expression matching exactly the notebook names of the exercises (for nbgrader zip_collect)."""
    return "(?:" + "|".join(re.escape(e.notebook) for e in EXERCISES.values()) + ")"
