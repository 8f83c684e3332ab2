"""The sample cohort: made-up students whose submissions exercise the grader.

Each student starts from the release (`base="release"`: every answer still the stub) or from a full
reference solution (`base="reference"`), then changes some answer cells and perhaps the files of the
submission. Each changed answer is `answer(name)` of answers/: most are the reference with one mistake in it,
declared as that edit in mistakes.py (`q07_deadlock`); the others are whole files of answers/. `expect` is what they deserve on the autograded part, as the fraction of each exercise's
hidden-test points (exercises not listed: 1.0 for base="reference", 0.0 for base="release").

A student returns the assignments (course modules, lab_src/registry.py MODULES) their story is about: those
holding an exercise of `answers` or `expect`, or every one when the story names no exercise (ada, untouched,
pia, rui); `returns` says otherwise. A second correct copy of an assignment proves nothing ada's does not,
and grading it would cost make test minutes (issue 25).
tests/test_cohort.py checks that grading gives exactly this, and that the feedback's texts stay as recorded
in tests/golden/cohort.json (golden.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lab_src.registry import EXERCISES, MODULES

from .answers import answer


@dataclass(frozen=True)
class Student:
    name: str
    story: str
    base: str = "reference"
    answers: dict = field(default_factory=dict)      # qid -> answer cell text (without the %%answer line)
    edits: tuple = ()                                 # names of functions in build.py that alter the submission
    expect: dict = field(default_factory=dict)       # qid -> fraction of the hidden-test points
    returns: tuple = ()                               # the assignments returned; () : as the module says
    # exercises whose answer ends the process running it, in the grader's ranks and in nbgrader's kernel alike:
    # how many of the notebook's next cells run before its kernel ends is a race, so the golden record
    # (golden.py) keeps the verdict alone of their notebooks
    ends_its_kernel: tuple = ()

    def assignments(self) -> tuple[str, ...]:
        """The assignments this student returns, in the course's order."""
        if self.returns:
            return tuple(m for m in MODULES if m in self.returns)
        told = {EXERCISES[q].assignment for q in (*self.answers, *self.expect)}
        return tuple(m for m in MODULES if m in told) or tuple(MODULES)

    def returned(self, qid: str) -> bool:
        return EXERCISES[qid].assignment in self.assignments()

    def expected(self, qid: str) -> float | None:
        """The fraction of `qid`'s points deserved; None for an exercise of an assignment not returned."""
        if not self.returned(qid):
            return None
        return self.expect.get(qid, 1.0 if self.base == "reference" else 0.0)

    def expected_points(self, points: dict[str, float]) -> dict[str, float | None]:
        """{qid: points deserved}, rounded as the grader rounds them, given each exercise's points (None:
        not returned, no points and no row in the gradebook)."""
        fractions = {qid: self.expected(qid) for qid in points}
        return {qid: None if f is None else round(f * points[qid], 2) for qid, f in fractions.items()}


COHORT = [
    Student("ada", "a complete, correct submission: the reference answers", "reference"),
    Student("untouched", "the release, returned without a single answer", "release"),
    # ---- realistic mistakes, one exercise each
    Student("basil", "q02 checks with assert, which `python -O` removes", answers={"q02": answer("q02_assert")},
            # the 3 pipelines work; 7 of the 16 direct calls (the valid ones) are right: (1 + 7/16) / 2
            expect={"q02": 0.7188}),
    Student("cleo", "q03 sends logits-shaped buffers (batch, seq, vocab)",
            answers={"q03": answer("q03_vocab_shape")}, expect={"q03": 0.0}),
    Student("dario", "q04 uses the sum of the output as the loss", answers={"q04": answer("q04_sum_loss")},
            expect={"q04": 0.0}),
    Student("elif", "q05 gives the extra layers to the last stages", answers={"q05": answer("q05_late_extra")},
            # right whenever the layers divide evenly: 29 of 57 splits, 2 of 3 pipelines
            expect={"q05": 0.5877}),
    Student("fumi", "q06 gives every rank a dataloader", answers={"q06": answer("q06_every_rank")},
            # right only for a 1-stage pipeline (1 of 8); every pipeline has a rank with a useless dataloader
            expect={"q06": 0.0625}),
    Student("gus", "q07 forgets that the first stage sends no gradient back",
            answers={"q07": answer("q07_no_end_check")}, expect={"q07": 0.0}),
    Student("hana", "q07 receives gradients from the wrong neighbour: the pipeline deadlocks",
            # right for 1 and 2 stages (2 of 4 message tests), deadlocks with 3 or more (0 of 2 pipelines)
            answers={"q07": answer("q07_deadlock")}, expect={"q07": 0.25}),
    Student("ivo", "q08 forgets to divide each micro-batch's loss by their number",
            answers={"q08": answer("q08_no_scale")},
            expect={"q08": 0.1667}),  # right only with one micro-batch (1 of 6 pipelines)
    Student("jun", "q09 compares only the first micro-batch", answers={"q09": answer("q09_first_only")},
            expect={"q09": 0.0}),
    Student("kai", "q10 skips parameters without a gradient", answers={"q10": answer("q10_skip_missing")},
            expect={"q10": 0.0}),
    # ---- students who try something the grader must withstand
    Student("lena", "runs the whole model on every rank instead of pipelining (the numbers match)",
            answers={"q08": answer("q08_whole_model")}, expect={"q08": 0.0}),
    Student("mo", "rank 1 of q08 crashes", answers={"q08": answer("q08_crash_rank")},
            # the 1-stage pipeline has no rank 1 and passes; two crashes later, q08's other cases are not run
            expect={"q08": 0.1667}),
    Student("nils", "prints megabytes from q05", answers={"q05": answer("q05_loud")}),
    Student("oona", "q05 takes the wrong arguments", answers={"q05": answer("q05_wrong_signature")},
            expect={"q05": 0.0}),
    Student("pia", "no answers, but patches subprocess, assert_close and the checks in an earlier cell",
            "release", edits=("patch_in_earlier_cell",)),          # the cell: answers/kernel_patches.py
    Student("quinn", "deletes q05's hidden-test cell and rewrites q06's to pass, answering neither",
            answers={"q05": None, "q06": None}, edits=("delete_and_edit_tests",), expect={"q05": 0.0, "q06": 0.0}),
    # Rui answers nothing: his fake lab_src's scored_out_of_process lets every hidden-test cell pass, so any import of
    # it by the grading would show as points (with the reference answers, as he had them before, it could not show)
    Student("rui", "no answers, but ships a fake torch.py and a fake lab_src/ (whose scored_out_of_process passes "
                   "every hidden-test cell) in the submission folder", "release", edits=("fake_packages",)),
    Student("sam", "q03's notebook is not valid JSON", edits=("corrupt_q03",), expect={"q03": 0.0}),
    Student("tess", "did not return q04's notebook", edits=("drop_q04",), expect={"q04": 0.0}),
    # ---- students who try to get out of the grading sandbox
    # Mallory's q06 answer is fumi's mistake (every rank reads data), but on import it first tries to find
    # the reference answer, the baselines, the gradebook or the grader's files and use them; to write into
    # the installation and the reference cache; to reach the network; to fork past the process limit; to
    # leave a process behind; and to print verdict lines, during the run and after it. She reports what she
    # managed on the rank's own output, which tests/test_cohort.py reads. Her own run folder is searched
    # too: the inputs of the group of cases that runs her q06 hold the references of q02, q03, q05, q07 and
    # q08, never q06's (harness/runner.py, group_cases).
    Student("mallory", "q06 first tries to read the reference and the grader's files, write into the installation, "
                       "reach the network, fork past the limit, leave a process and print fake verdicts; then "
                       "falls back to fumi's mistake", answers={"q06": answer("q06_escape")}, expect={"q06": 0.0625}),
    # Rhea's q08 looks, in every folder it can see, for another file that defines afab_step (the reference
    # q09's cases need, say) and runs that; failing that, ivo's mistake.
    Student("rhea", "q08 looks for the reference afab_step in every folder it can see and runs it; failing that, "
                    "ivo's mistake", answers={"q08": answer("q08_borrow")}, expect={"q08": 0.1667}),
    Student("nico", "q05 is right, with numpy integers where ints are expected; q17 puts a barrier between the two "
                    "layers of its MLP; q18 sums proj's partial sums with its own all-reduce over the default group "
                    "(the job's world, not the tensor-parallel group); q19 takes its place in the ring from the "
                    "global rank; q20 divides each bucket by dp.size when it launches it, and again in finish; q21 "
                    "keeps AdamW's moments for the whole stage on every rank; q22 takes the reduce-scattered sum as "
                    "the shard's gradient, undivided",
            answers={"q05": answer("q05_numpy_ints"), "q17": answer("q17_barrier_between"),
                     "q18": answer("q18_world_group"), "q19": answer("q19_global_rank"),
                     "q20": answer("q20_average_twice"), "q21": answer("q21_full_state"),
                     "q22": answer("q22_summed")},
            # q17 (four parts: communication functions, layers, MLP numbers, MLP communication): the barrier is a
            # round too many in the MLP's forward, on 2 and 4 ranks; everything else right: (1 + 1 + 1 + 0) / 4.
            # q18 (five parts: block, dropout, replicated, training, prediction): every case on 2 ranks of the
            # 4-rank job refuses the world's all-reduce (both trainings among them); t = 4 passes:
            # (1/2 + 1/2 + 2/4 + 0 + 1) / 5. q19 (sums, ring, prediction): right on every ring of the whole job; on
            # the columns of a 2 x 2 grid, ranks 1 and 2 send to themselves: (5/6 + 5/6 + 4/4) / 3
            # q20 (values, plan, rings, placement, prediction): the gradients are 1/dp of one process's on the three
            # grids with more than one replica; right on the 1 x 4 grid: (1/4 + 7/7 + 4/4 + 4/4 + 3/3) / 5
            # q21 (values, memory, messages, prediction): right values and messages, the whole state held: 3/4
            # q22 (values, memory, counts, prediction): the gradients n x one process's in the three SGD cases and
            # the 2 x 2 training's curve off one process's (AdamW divides most of the scale away): (1/5 + 1 + 1 + 1) / 4
            expect={"q17": 0.75, "q18": 0.5, "q19": 0.8889, "q20": 0.85, "q21": 0.75, "q22": 0.8}),
    # exit() in one answer must cost that exercise alone, and say which rank it happened on
    Student("xena", "q06 calls exit() on rank 1", answers={"q06": answer("q06_exit")}, expect={"q06": 0.0}),
    Student("wren", "q11 sends before it receives, with blocking calls: the 1F1B steady state deadlocks; q12 warms "
                    "up with p - r forwards, one too many; q18 shares one dropout mask inside the sharded region; "
                    "q19's ring sends, then receives, with blocking calls: every rank sends first; q20's hooks only "
                    "count the full buckets, and finish launches them all once the backward is over; q21 "
                    "all-reduces the gradient with the whole ring and slices its shard out of it; q22 saves each "
                    "layer's gathered weights for the backward",
            answers={"q11": answer("q11_blocking"), "q12": answer("q12_warmup_off_by_one"),
                     "q18": answer("q18_mask_shared_inside"), "q19": answer("q19_blocking"),
                     "q20": answer("q20_launch_in_finish"), "q21": answer("q21_allreduce_slice"),
                     "q22": answer("q22_saved_full")},
            # q11: 3 of 6 message cases (those without two neighbours sending at once), 2 of 5 buffer cases (those
            # that ran to their end), no pipeline, the prediction right: (3/6 + 2/5 + 0 + 1) / 4. q12: right numbers
            # everywhere; 1 of 7 cases is still 1F1B (one micro-batch), 3 are a valid AFAB (half credit), among them
            # the corner of 4 stages and 2 micro-batches; the warm-up prediction (an 8th item) is p - r, wrong:
            # (1 + 3 * 0.5 + 0) / 8
            # q18 draws every rank's attention mask from the shared stream: the dropout part fails on 2 and 4
            # ranks, the t = 2 training leaves one process's curve; the ranks agree: (1 + 0 + 1 + 1/2 + 1) / 5.
            # q19: its first two cases deadlock and the others are not run; the prediction is right: (0 + 0 + 1) / 3
            # q20 (graded with the reference's q11, q12 and q19): right values, plans and rings, but no ring overlaps
            # the last stage's backward on any grid: (1 + 1 + 1 + 0 + 1) / 5
            # q21 (graded with the reference's q11 and q12): 3(n - 1)/n of the parameters' bytes sent in every case,
            # the rest right: (1 + 1 + 0 + 1) / 4
            # q22: half the gathers everywhere; more than two layers' copies held at once except in the 4-rank
            # training of two blocks, one micro-batch at a time: (1 + 1/5 + 0 + 1) / 4
            expect={"q11": 0.475, "q12": 0.3125, "q18": 0.7, "q19": 0.3333, "q20": 0.8, "q21": 0.75, "q22": 0.55}),
    Student("yuki", "q11 receives activations into buffers that do not require grad; q12 has no cool-down; q13 never "
                    "zeroes the gradients; q17's MLP gathers the whole weights through torch's unwrapped all_gather "
                    "(unrecorded) and all-reduces zeros to look like one round each way; q18 seeds the replicated "
                    "region (the LayerNorms' side) per rank",
            answers={"q11": answer("q11_no_requires_grad"), "q12": answer("q12_no_cooldown"),
                     "q13": answer("q13_never_zeroed"), "q17": answer("q17_gather_unrecorded"),
                     "q18": answer("q18_norm_seeded_per_rank")},
            # q11: every message right (6 of 6), no buffer right (0 of 5), no pipeline, the prediction right: 2/4. q12: only the
            # single stage, which needs no cool-down, passes (1 of 7); the others wait for the missing backwards;
            # the warm-up prediction is right (2 of 8 items)
            # q13 (its step is q08's, so q11 and q12 do not matter there): the curves leave the single process's
            # at step 2 and the loss falls too little; the pipeline and the evaluation are right: 2 of 4 parts
            # q18: the dropout part fails on 2 and 4 ranks and its LayerNorms differ between ranks after a step,
            # the t = 2 training leaves one process's curve: (1 + 0 + 2/4 + 1/2 + 1) / 5
            # q17: the MLP's numbers are right, but neither its output nor its input's gradient is what its one
            # recorded all-reduce gave back (zeros): the MLP communication part fails: (1 + 1 + 1 + 0) / 4
            expect={"q11": 0.5, "q12": 0.25, "q13": 0.5, "q17": 0.75, "q18": 0.6}),
    # q14: three parts of a third each: data parallel (5 grids), tied embeddings (4 tied grids), the prediction
    Student("uma", "q13 evaluates in training mode with autograd on; q14 sums the replicas' gradients instead of "
                   "averaging them; q17's column-parallel layer all-gathers its output and the row-parallel layer "
                   "slices it again; q18 keeps dropping in evaluation mode",
            answers={"q13": answer("q13_eval_training"), "q14": answer("q14_summed"), "q17": answer("q17_gather"),
                     "q18": answer("q18_drops_in_eval")},
            # q13: the evaluation part fails, the other three pass. q14: right only on the 1 x 4 grid (one
            # replica): (1/5 + 4/4 + 3/3) / 3. q17 (four parts: communication functions, layers, MLP numbers, MLP
            # communication): the MLP's numbers are right, its forward has an all-gather, both layers fail
            # alone: (1 + 0 + 1 + 0) / 4. q18: right in training mode everywhere; the dropout part's output in
            # evaluation mode is dropped on 2 and 4 ranks (its training forward, gradients and trainings are right):
            # (1 + 0 + 1 + 1 + 1) / 5
            expect={"q13": 0.75, "q14": 0.7333, "q17": 0.5, "q18": 0.8}),
    Student("vito", "q14 never all-reduces the tied embedding's gradient: the copies drift apart; q17 all-reduces "
                    "after the column-parallel layer too; q19 passes the whole tensor round the ring (the tutorial's); "
                    "q20 arms its reducer on the stage's last forward (torchrec #4758)",
            # the tied part holds only on the 4 x 1 grid (one stage, one parameter): (5/5 + 1/4 + 3/3) / 3. q17: the
            # column layer and the MLP, numbers and rounds, fail; the row layer passes: (1 + 3/6 + 0 + 0) / 4
            # q19: the sums are right, but bit for bit the same on the ranks only for n = 2 (a + b = b + a): 2 of 6;
            # every message is the whole tensor: 0 of 6; the prediction is a ring's: (2/6 + 0 + 4/4) / 3
            # q20: buckets leave before the last backward on every stage with a warm-up, so the values and the placement
            # fail on the three grids with more than one stage; the 4 x 1 grid passes: (1/4 + 1 + 1 + 1/4 + 1) / 5
            answers={"q14": answer("q14_no_tied"), "q17": answer("q17_allreduce_both"), "q19": answer("q19_whole_tensor"),
                     "q20": answer("q20_armed_last_forward")},
            expect={"q14": 0.75, "q17": 0.375, "q19": 0.4444, "q20": 0.7}),
    Student("vera", "q15 deals each rank's chunks out contiguously (rank r holding virtual stages r*v..r*v+v-1) "
                    "and hands activations from one chunk to the next on the same rank; q16 runs each W right after "
                    "its own I, on every rank (1F1B with the backward split: no W delayed, no bubble filled); q17 "
                    "adds the row-parallel layer's bias on every rank before the all-reduce",
            answers={"q15": answer("q15_contiguous"), "q16": answer("q16_w_at_once"),
                     "q17": answer("q17_bias_every_rank")},
            # q15 runs to the end everywhere, but the layers run in the wrong order: 0 of 5. q16: the split is right
            # (6 of 6); of the 6 pipelines, the single stage and the single micro-batch are valid ZB-H1 (W right after
            # its I is ZB-H1's order there), the other 4 a valid other schedule, half each: (1 + (2 + 4/2)/6) / 2.
            # q17 adds the row-parallel bias on every rank before the all-reduce: the row layer's and the MLP's
            # outputs are wrong, the MLP's rounds right: (1 + 3/6 + 0 + 1) / 4
            expect={"q15": 0.0, "q16": 0.8333, "q17": 0.625}),
    Student("zeno", "q16 sends each input gradient to the previous stage only after the W it runs next; q17's copy "
                    "into the tensor-parallel region is the identity in the backward too; q18 seeds each shard's "
                    "stream from the global rank (dist.get_rank()), not the tensor-parallel one",
            answers={"q16": answer("q16_send_after_w"), "q17": answer("q17_no_backward_mirror"),
                     "q18": answer("q18_global_rank_seed")},
            # the split is right (6 of 6); of the 6 pipelines only the single stage and the single micro-batch,
            # where nothing is sent after a W, keep ZB-H1's rules: (1 + 2/6) / 2. q17: the copy, the column layer,
            # the MLP's input gradient and its backward round fail: (3/6 + 3/6 + 0 + 0) / 4. q18: right wherever the
            # global rank is the tensor-parallel one; on two groups side by side (ranks [0, 2], [1, 3]) the dropout
            # part's masks are other shards' (its LayerNorms agree within each group): (1 + 1/2 + 1 + 1 + 1) / 5
            expect={"q16": 0.6667, "q17": 0.25, "q18": 0.9}),
    # ---- the grader's last holes (issue 26): one bad answer each, every other exercise the reference
    Student("dora", "q05 'caches' its plan in three files of 500 MB each: over the sandbox's disk limit",
            # the first call writes 1.5 GB: every case of q05 ends over the 1 GB limit and fails, named, on the
            # rank that wrote the files (harness/worker.py, `over_disk_limit`), never another exercise's case
            answers={"q05": answer("q05_fill_disk")}, expect={"q05": 0.0}),
    Student("kim", "q02 kills the process that started it (the elastic agent every rank comes from) as it loads",
            # every q02 case fails, named, whichever rank loaded it first (harness/lineage.py); the other exercises
            # are graded in a sandbox of their own and keep their points
            answers={"q02": answer("q02_kill_fork_server")}, expect={"q02": 0.0}, ends_its_kernel=("q02",)),
    Student("seth", "q08's last stage ignores what it receives, rebuilds the earlier stages from the seed and puts "
                    "the model's records back", answers={"q08": answer("q08_rebuilt_from_seed")},
            # only the single stage passes: in every other case rank 0's weights were changed once built
            expect={"q08": 0.1667}),
    Student("fern", "q12 runs All-Forward-All-Backward, then rewrites its events into 1F1B's order; q17 reads column "
                    "and row parallel as the weight's columns and rows; q18's block is right, but it writes one "
                    "process's loss curve, which it computes in the rank, over the losses the lab records",
            answers={"q12": answer("q12_forged_events"), "q17": answer("q17_wrong_dim"),
                     "q18": answer("q18_forged_curve")},
            # 1 of 7 cases: only the one-micro-batch case, where AFAB and 1F1B run one order and the rewrite changes
            # nothing; every other case's events contradict what the grader read from its journal as it ran; the
            # warm-up prediction is right: 2 of 8 items. q17 cuts each layer along the other's dimension: both
            # layers and the MLP raise, the communication functions are right: (1 + 0 + 0 + 0) / 4. q18: every
            # hidden training changes stage 0's embedding once built, so the curve computed from the configuration
            # is not the run's: both trainings fail, the rest passes: (1 + 1 + 1 + 0 + 1) / 5
            expect={"q12": 0.25, "q17": 0.25, "q18": 0.8}),
    Student("ines", "q23 recomputes the block with torch.utils.checkpoint alone, trusting its preserve_rng_state "
                    "with the block's dropout (which draws from the block's own generators, so the recomputation "
                    "draws new masks), and predicts the paper's figures (34 sbh + 5 a s^2 b) for the lab's block; "
                    "her sequence-parallel block leaves the LayerNorms' and the row layers' bias gradients as each "
                    "rank's shard made them (not summed over the group), and its column-parallel layers keep the "
                    "gathered input for the backward; "
                    "q24's ring keeps the keys' gradients where they were computed (dK and dV never travel home), "
                    "her Ulysses forgets the reverse all-to-all, and she predicts Ulysses' bytes as four whole shards",
            answers={"q23": answer("q23_ines"), "q24": answer("q24_ines")},
            # gradients: 'none' right in the four cases, 'selective' and 'full' wrong in all four: 4 of 12; memory
            # and FLOPs right; the prediction's 'none' and 'selective' 15 % and 6 % off, 'full' and both sequence-
            # parallel figures right: 3 of 5; sp_block: values and traffic right, the replicated gradients wrong in
            # all 4 items, the memory (the gathered inputs kept) in all 3, the training off one process's curve (the
            # replicas drift apart).
            # (4/12 + 1 + 1 + 3/5 + 1 + 0 + 0 + 1 + 0) / 9
            # q24: values and messages right only in the two Ulysses runs that must refuse (2 of 18 each: dk, dv
            # and the backward's bytes wrong in all 12 ring runs, the 4 other Ulysses runs wrong); work right (12
            # of 12); the prediction's 'ulysses' wrong (3 of 4): (2/18 + 2/18 + 1 + 3/4) / 4
            expect={"q23": 0.5481, "q24": 0.4931}),
    Student("otto", "q25 averages each expert's gradient over its data-parallel group as the dense layers are "
                    "averaged, forgetting that the all-to-all's backward already summed the terms of the ep ranks "
                    "whose tokens the expert saw (the experts' gradients come out ep times too large), and predicts "
                    "the all-to-alls' bytes counting the rows a rank sends itself",
            answers={"q25": answer("q25_not_divided_local_rows")},
            # forward, traffic and routing right in the five cases; gradients and the three-step curve wrong in all
            # five (the experts' gradients 2x or 4x one process's); the prediction's two byte counts 4/3 too large,
            # the factor right: (1 + 0 + 0 + 1 + 1 + 1/3) / 6
            expect={"q25": 0.5556}),
    Student("lior", "q26 gathers each block's float32 shard and casts the gathered weights to the compute dtype "
                    "after the gather (the values are right, the gathers carry twice the bytes), and lets each rank's "
                    "loss scaler decide alone whether its gradients hold an inf: the rank that holds the lab's inf "
                    "skips the step, the others take it, and the replicas' weights part",
            answers={"q26": answer("q26_lior")},
            # gradients and dtypes right in the four cases; bytes wrong in all four (4 bytes an element gathered);
            # training and scaling wrong in the two fp16 cases (the lab's inf skipped on one rank only), right in the
            # bf16 ones (no scaler there); the prediction right: (1 + 2/4 + 0 + 1 + 0/2 + 1) / 6
            expect={"q26": 0.5833}),
    Student("lotte", "q27 cuts the new shard of each loading rank as torch.chunk does (ceil(N / m) elements each), "
                     "which is torch.tensor_split's shard only where N % m is 0 or m - 1, and predicts the bytes of "
                     "the old files rank 1 opens counting every file of the checkpoint",
            answers={"q27": answer("q27_chunk_every_file")},
            # written and read right in the six cases; the loaded state and the next step right only for 4 -> 2
            # (torch.chunk's two pieces are tensor_split's shards there), wrong in the other five (1 of 6 each); the
            # prediction's whole files wrong (2 of 3): (1 + 1 + 1/6 + 1/6 + 2/3) / 5
            expect={"q27": 0.6}),
]

BY_NAME = {s.name: s for s in COHORT}
