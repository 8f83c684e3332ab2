"""Fast tests of lab_src's pieces, in this process (no torchrun)."""
from __future__ import annotations

import json

import pytest
import torch

import lab_src
from lab_src import answers
from lab_src.views import bubble, text_grid
from lab_src.views.chrome_trace import to_chrome_trace
from lab_src.judge.compare import compare_run, explain_scale
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.model import build_model, build_piece
from lab_src.judge.problems import stamped
from lab_src.judge.realness import check_layers, check_messages
from lab_src.registry import CODED, EXERCISES
from lab_src.harness.case import Case, CaseOutcome
from lab_src.pipeline.trace import Event


# ---- the model ---------------------------------------------------------------------------------
def test_pieces_built_alone_equal_the_whole_model():
    cfg = LabConfig(num_layers=6, seed=3)
    whole = dict(build_model(cfg).named_parameters())
    block = build_piece(cfg, "blocks.4")
    for name, p in block.named_parameters():
        assert torch.equal(p, whole[f"blocks.4.{name}"])
    assert not torch.equal(build_piece(cfg, "blocks.3").qkv.weight, block.qkv.weight)
    assert torch.equal(build_piece(cfg.replace(dtype="float64"), "head").proj.weight.float(),
                       whole["head.proj.weight"])


def test_seed_changes_weights():
    a = build_piece(LabConfig(seed=0), "blocks.0").up.weight
    b = build_piece(LabConfig(seed=1), "blocks.0").up.weight
    assert not torch.equal(a, b)


# ---- answers and stubs -------------------------------------------------------------------------
def test_every_exercise_has_a_contract_and_notebook():
    from lab_src.exercises import API
    assert sorted(API) == [e.id for e in CODED]
    for ex in EXERCISES.values():
        assert ex.notebook.startswith(ex.id)
        assert ex.id in ex.answer_cell and ex.id in ex.hidden_cell


def test_stub_names_the_exercise_and_notebook(in_tmp):
    with pytest.raises(NotImplementedError) as e:
        lab_src.distribute_layers(8, 0, 4)
    msg = str(e.value)
    assert "q05" in msg and "q05_distribute_layers.ipynb" in msg and "%%answer q05" in msg


def test_missing_earlier_answer_names_the_caller(in_tmp):
    from lab_src.exercises import running_for
    with running_for("q08"), pytest.raises(NotImplementedError) as e:
        lab_src.pipeline_communicate("recv_forward", None)
    assert "q08 needs your answer to q07" in str(e.value)


def test_release_stub_body_is_reported(in_tmp):
    (in_tmp / "answers").mkdir()
    (in_tmp / "answers" / "q06_needs_dataloader.py").write_text(
        "def needs_dataloader(pp_rank, pp_size):\n    raise NotImplementedError()\n")
    with pytest.raises(NotImplementedError, match="still the stub from the release"):
        lab_src.needs_dataloader(0, 2)


def test_answer_file_is_used_and_reloaded(in_tmp):
    folder = in_tmp / "answers"
    folder.mkdir()
    path = folder / "q06_needs_dataloader.py"
    path.write_text("def needs_dataloader(pp_rank, pp_size):\n    return pp_rank == 0\n")
    assert lab_src.needs_dataloader(0, 4) is True
    import os
    import time
    path.write_text("def needs_dataloader(pp_rank, pp_size):\n    return 'changed'\n")
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert lab_src.needs_dataloader(0, 4) == "changed"


def test_wrong_signature_is_explained(in_tmp):
    (in_tmp / "answers").mkdir()
    (in_tmp / "answers" / "q05_distribute_layers.py").write_text("def distribute_layers(n, rank):\n    return []\n")
    with pytest.raises(answers.AnswerError, match=r"must take \(num_layers, pp_rank, pp_size\); yours takes \(n, rank\)"):
        lab_src.distribute_layers(8, 0, 4)


def test_misnamed_function_is_explained(in_tmp):
    (in_tmp / "answers").mkdir()
    (in_tmp / "answers" / "q05_distribute_layers.py").write_text("def split_layers(a, b, c):\n    return []\n")
    with pytest.raises(answers.AnswerError, match="must define a function named distribute_layers.*split_layers"):
        lab_src.distribute_layers(8, 0, 4)


def test_answer_magic_writes_the_cell_and_flags_free_names(in_tmp, capsys):
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "lab_src")
    shell.run_cell("%%answer q06\ndef needs_dataloader(pp_rank, pp_size):\n    return helper(pp_rank)\n")
    written = (in_tmp / "answers" / "q06_needs_dataloader.py").read_text()
    assert "def needs_dataloader" in written and "%%answer q06" not in written
    assert "helper" in capsys.readouterr().out
    assert "needs_dataloader" in shell.user_ns


# ---- pictures and measures ---------------------------------------------------------------------
def afab_events(p=3, m=2, f=1.0, b=2.0, shape=(2, 16, 32)):
    """Ideal AFAB events with instant messages, built by hand for the tests."""
    ev, t_free = [], [0.0] * p
    fwd_done = {}
    for k in range(m):
        for r in range(p):
            start = max(t_free[r], fwd_done.get((r - 1, k), 0.0))
            if r > 0:
                ev.append(Event(r, "recv_forward", k, r - 1, shape, 4096, start, start))
            ev.append(Event(r, "forward", k, None, shape, 0, start, start + f))
            if r < p - 1:
                ev.append(Event(r, "send_forward", k, r + 1, shape, 4096, start + f, start + f))
            t_free[r] = fwd_done[(r, k)] = start + f
    bwd_done = {}
    for k in range(m):
        for r in reversed(range(p)):
            start = max(t_free[r], bwd_done.get((r + 1, k), 0.0))
            if r < p - 1:
                ev.append(Event(r, "recv_backward", k, r + 1, shape, 4096, start, start))
            ev.append(Event(r, "backward", k, None, shape, 0, start, start + b))
            if r > 0:
                ev.append(Event(r, "send_backward", k, r - 1, shape, 4096, start + b, start + b))
            t_free[r] = bwd_done[(r, k)] = start + b
    return ev


def test_measured_bubble_of_an_ideal_schedule_is_the_theory():
    for p, m in [(2, 1), (3, 2), (4, 4), (4, 8)]:
        measured = bubble.measured_bubble(afab_events(p, m), p)
        assert measured == pytest.approx(bubble.theoretical_bubble(p, m))


def test_grids_show_every_box():
    events = afab_events(3, 2)
    steps = text_grid.step_grid(events, 3)
    assert steps.splitlines()[0].startswith("rank 0 | F0  F1")
    assert "B1" in steps.splitlines()[2]
    timed = text_grid.time_grid(events, 3, width=40)
    assert timed.count("rank ") == 3 and "f forward" in timed


def test_chrome_trace_has_boxes_and_arrows():
    trace = to_chrome_trace(afab_events(3, 2))
    kinds = [e["ph"] for e in trace["traceEvents"]]
    assert kinds.count("X") == len(afab_events(3, 2))
    assert kinds.count("s") == kinds.count("f") == 2 * 2 * 2  # (p-1) links x m micro-batches x 2 directions
    json.dumps(trace)


def test_messages_check_reports_a_missing_receive_and_a_wrong_peer():
    events = [e for e in afab_events(3, 2) if not (e.kind == "recv_forward" and e.rank == 2 and e.microbatch == 1)]
    problems = check_messages(events, 3, 2, (2, 16, 32))
    text = "\n".join(map(str, problems))
    assert "send_forward to rank 2" in text and "no matching recv_forward" in text and "micro-batch 1" in text
    wrong = [Event(1, "send_forward", 0, 0, (2, 16, 32), 1, 0, 0)]
    assert any("next stage, rank 2" in str(p) for p in check_messages(wrong, 3, 1, (2, 16, 32)))


def test_layer_checks():
    assert not check_layers({0: [0, 1, 2], 1: [3, 4], 2: [5, 6]}, 7)
    text = " ".join(map(str, check_layers({0: [0, 1], 1: [1, 2]}, 4)))
    assert "more than one stage" in text and "no stage" in text


# ---- the stage's receives and backward ---------------------------------------------------------
class _FakeReceive:
    """Stands in for gloo's irecv work (one process): the n-th receive posted gets message n."""
    posted = 0

    def __init__(self, buffer):
        _FakeReceive.posted += 1
        self.buffer, self.n = buffer, _FakeReceive.posted

    def wait(self):
        self.buffer.fill_(self.n)


def test_posted_receives_are_waited_and_recorded_in_the_order_they_were_posted(reference, monkeypatch):
    from lab_src.answers import use_answers
    from lab_src.pipeline import stage as stage_module, trace
    from lab_src.pipeline.stage import PipelineStage
    monkeypatch.setattr(stage_module.dist, "irecv", lambda buffer, group=None, group_src=None: _FakeReceive(buffer))
    journal = []
    tracer = trace.Tracer(2, lambda tag, pending: journal.append((tag, pending[2])), None, "0")
    with use_answers(reference), trace.tracing(tracer):
        stage = PipelineStage(LabConfig(num_stages=4), pp_rank=2, pp_size=4, micro_batch_size=2, group=object())
        first = stage.post_recv(1, stage.activation_shape, "recv_forward", microbatch=0)
        second = stage.post_recv(1, stage.activation_shape, "recv_forward", microbatch=1)
        got = second.wait()                 # waits for the first one first: its message came first
        assert float(first.wait()[0, 0, 0]) + 1 == float(got[0, 0, 0])
        assert journal == [("P", 0), ("P", 1), ("A", 0), ("E", 0), ("A", 1), ("E", 1)]
        assert [e.microbatch for e in tracer.events] == [0, 1] and tracer.events[0].bytes == got.numel() * 4
        stage.post_recv(3, stage.activation_shape, "recv_backward", microbatch=5)
        with pytest.raises(RuntimeError, match=r"never waited for: recv_backward\(mb=5\) from rank 3"):
            stage.flush()


def test_backward_from_is_autograd_backward_bit_for_bit():
    from lab_src.pipeline.stage import backward_from
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    x, g = torch.randn(3, 5, 16, requires_grad=True), torch.randn(3, 5, 16)

    def grads(run):
        net.zero_grad()
        x.grad = None
        run(net(x))
        return [q.grad.clone() for q in net.parameters()] + [x.grad.clone()]

    ours, torchs = grads(lambda y: backward_from(y, g)), grads(lambda y: torch.autograd.backward(y, g))
    assert all(torch.equal(a, b) for a, b in zip(ours, torchs))
    with pytest.raises(ValueError, match=r"has shape \(3, 5, 16\)"):
        backward_from(net(x), g[:1])


# ---- the comparison with the baseline ----------------------------------------------------------
def _fake_outcome(p, m, grads_scale, outputs=None):
    cfg = LabConfig(num_stages=p, num_microbatches=m, num_layers=p)
    base_out = torch.randn(cfg.global_batch_size, 4, 5)
    base = {"output": base_out, "loss": float(base_out.mean()),
            "grads": {f"w{r}": torch.randn(3, 3) for r in range(p)}}
    obs = {r: {"grads": {f"w{r}": base["grads"][f"w{r}"] * grads_scale}} for r in range(p)}
    obs[p - 1]["outputs"] = outputs if outputs is not None else list(base_out.chunk(m))
    obs[p - 1]["loss"] = base["loss"]
    return CaseOutcome(Case(kind="pipeline", qid="q08", config=cfg), obs), base


def test_gradients_scaled_by_the_microbatch_count_are_named():
    outcome, base = _fake_outcome(2, 4, 4.0)
    text = "\n".join(map(str, stamped(compare_run(outcome, base), "q08")))
    assert "[q08] rank 0" in text and "number of micro-batches" in text


def test_outputs_in_the_wrong_order_are_named():
    outcome, base = _fake_outcome(2, 2, 1.0)
    chunks = list(base["output"].chunk(2))
    outcome.obs[1]["outputs"] = [chunks[1], chunks[0]]
    text = "\n".join(map(str, compare_run(outcome, base)))
    assert "micro-batch 0" in text and "out of order" in text


def test_correct_run_has_no_problems():
    outcome, base = _fake_outcome(3, 2, 1.0)
    assert compare_run(outcome, base) == []
    assert "twice" in explain_scale(2.0, 4)


def test_saved_events_load_back(tmp_path):
    from lab_src.pipeline.trace import load_events, save_events
    events = afab_events(3, 2)
    save_events(events, tmp_path / "events.json")
    assert load_events(tmp_path / "events.json") == events
