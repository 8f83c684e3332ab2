"""The sample cohort: made-up students whose submissions exercise the grader.

Each student starts from the release (`base="release"`: every answer still the stub) or from a full
reference solution (`base="reference"`), then changes some answer cells and perhaps the files of the
submission. `expect` is what they deserve on the autograded part, as the fraction of each exercise's
hidden-test points (exercises not listed: 1.0 for base="reference", 0.0 for base="release").
tests/test_cohort.py checks that grading gives exactly this.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Student:
    name: str
    story: str
    base: str = "reference"
    answers: dict = field(default_factory=dict)      # qid -> answer cell text (without the %%answer line)
    edits: tuple = ()                                 # names of functions in build.py that alter the submission
    expect: dict = field(default_factory=dict)       # qid -> fraction of the hidden-test points

    def expected(self, qid: str) -> float:
        return self.expect.get(qid, 1.0 if self.base == "reference" else 0.0)

    def expected_points(self, points: dict[str, float]) -> dict[str, float]:
        """{qid: points deserved}, rounded as the grader rounds them, given each exercise's points."""
        return {qid: round(self.expected(qid) * pts, 2) for qid, pts in points.items()}


# ---- realistic mistakes, one exercise each --------------------------------------------------------

Q02_ASSERT = '''
def check_args(num_layers, num_stages, global_batch_size, num_microbatches, allow_uneven_layers=False):
    assert num_stages >= 1 and num_microbatches >= 1, "need at least one stage and one micro-batch"
    if not allow_uneven_layers:
        assert num_layers % num_stages == 0, "layers must divide evenly"
    assert num_layers >= num_stages, "every stage needs a layer"
    assert global_batch_size % num_microbatches == 0, "batch must split evenly"
    return global_batch_size // num_microbatches
'''

Q03_VOCAB = '''
def activation_shape(cfg, micro_batch_size):
    # the output of the model is (batch, seq, vocab), so that must be what travels
    return (micro_batch_size, cfg.seq_len, cfg.vocab_size)
'''

Q04_SUM = '''
def baseline_step(model, dataloader, device):
    batch = next(iter(dataloader)).to(device)
    output = model(batch)
    loss = output.sum()
    loss.backward()
    return output, loss
'''

Q05_LATE_EXTRA = '''
def distribute_layers(num_layers, pp_rank, pp_size):
    # the last stages take the extra layers
    base, extra = divmod(num_layers, pp_size)
    first_big = pp_size - extra
    start = pp_rank * base + max(0, pp_rank - first_big)
    count = base + (1 if pp_rank >= first_big else 0)
    return list(range(start, start + count))
'''

Q06_EVERY_RANK = '''
def needs_dataloader(pp_rank, pp_size):
    # every rank trains, so every rank reads data
    return True
'''

Q07_NO_END_CHECK = '''
def pipeline_communicate(operation, stage, tensor=None, microbatch=0):
    if operation == "recv_forward":
        if stage.is_first_stage:
            return None
        return stage.recv(src=stage.pp_rank - 1, shape=stage.activation_shape, operation=operation, microbatch=microbatch)
    if operation == "send_forward":
        if not stage.is_last_stage:
            stage.send(tensor, dst=stage.pp_rank + 1, operation=operation, microbatch=microbatch)
        return None
    if operation == "recv_backward":
        if stage.is_last_stage:
            return None
        return stage.recv(src=stage.pp_rank + 1, shape=stage.activation_shape, operation=operation, microbatch=microbatch)
    if operation == "send_backward":
        # forgot: the first stage has nobody to send to
        stage.send(tensor, dst=stage.pp_rank - 1, operation=operation, microbatch=microbatch)
        return None
'''

Q07_DEADLOCK = '''
def pipeline_communicate(operation, stage, tensor=None, microbatch=0):
    # receives the gradient from the previous stage instead of the next one: every middle rank waits forever
    if operation == "recv_forward":
        if stage.is_first_stage:
            return None
        return stage.recv(src=stage.pp_rank - 1, shape=stage.activation_shape, operation=operation, microbatch=microbatch)
    if operation == "send_forward":
        if not stage.is_last_stage:
            stage.send(tensor, dst=stage.pp_rank + 1, operation=operation, microbatch=microbatch)
        return None
    if operation == "recv_backward":
        if stage.is_last_stage:
            return None
        peer = stage.pp_rank - 1 if stage.pp_rank > 0 else stage.pp_rank + 1
        return stage.recv(src=peer, shape=stage.activation_shape, operation=operation, microbatch=microbatch)
    if operation == "send_backward":
        if not stage.is_first_stage:
            stage.send(tensor, dst=stage.pp_rank - 1, operation=operation, microbatch=microbatch)
        return None
'''

Q08_NO_SCALE = '''
from lab_src import pipeline_communicate


def afab_step(stage, data_iter, num_microbatches):
    inputs, outputs, logits = [], [], []
    for mb in range(num_microbatches):
        x = pipeline_communicate("recv_forward", stage, microbatch=mb)
        if x is None:
            x = next(data_iter).to(stage.device)
        else:
            x.requires_grad_()
        y = stage.forward(x, microbatch=mb)
        pipeline_communicate("send_forward", stage, tensor=y, microbatch=mb)
        if stage.is_last_stage:
            logits.append(y.detach())
            y = y.mean()                      # each micro-batch's mean, not divided by the count
        inputs.append(x)
        outputs.append(y)
    for mb in range(num_microbatches):
        grad = pipeline_communicate("recv_backward", stage, microbatch=mb)
        g = stage.backward(inputs[mb], outputs[mb], grad, microbatch=mb)
        pipeline_communicate("send_backward", stage, tensor=g, microbatch=mb)
    if stage.is_last_stage:
        return logits, sum(float(o) for o in outputs) / num_microbatches
    return [], None
'''

Q09_FIRST_ONLY = '''
import torch


def check_outputs(outputs, baseline_output, stage):
    if not stage.is_last_stage:
        return False
    first = outputs[0]
    torch.testing.assert_close(first, baseline_output[: first.shape[0]])
    return True
'''

Q10_SKIP_MISSING = '''
import torch


def check_gradients(stage, baseline_grads):
    checked = []
    for name, param in stage.named_parameters():
        if param.grad is None:
            continue                           # nothing to compare
        torch.testing.assert_close(param.grad, baseline_grads[name])
        checked.append(name)
    return checked
'''

# q11: blocking calls, each sending before it receives. The single operations work; in a 1F1B steady
# state two neighbours both send first and wait for each other forever.
Q11_BLOCKING = '''
import torch
import torch.distributed as dist


def p2p_communicate(operation, stage, tensor=None, microbatch=0, recv_microbatch=None):
    # plain blocking calls, in order: first send, then receive
    to_next = operation in ("send_forward", "recv_backward", "send_forward_recv_backward")
    if (to_next and stage.is_last_stage) or (not to_next and stage.is_first_stage):
        return None
    peer = stage.pp_rank + 1 if to_next else stage.pp_rank - 1
    if operation.startswith("send"):
        dist.send(tensor.detach(), group=stage.group, group_dst=peer)
    if "recv" not in operation:
        return None
    buffer = torch.empty(stage.activation_shape, dtype=stage.dtype, device=stage.device,
                         requires_grad=operation.endswith("recv_forward"))
    dist.recv(buffer, group=stage.group, group_src=peer)
    return buffer
'''

# q11: every message right, but received activations do not require grad, so no gradient reaches the
# earlier stages of a pipeline.
Q11_NO_REQUIRES_GRAD = '''
import torch
import torch.distributed as dist


def p2p_communicate(operation, stage, tensor=None, microbatch=0, recv_microbatch=None):
    to_next = operation in ("send_forward", "recv_backward", "send_forward_recv_backward")
    if (to_next and stage.is_last_stage) or (not to_next and stage.is_first_stage):
        return None
    peer = stage.pp_rank + 1 if to_next else stage.pp_rank - 1
    ops, received = [], None
    if operation.startswith("send"):
        ops.append(dist.P2POp(dist.isend, tensor.detach(), group=stage.group, group_peer=peer))
    if "recv" in operation:
        received = torch.empty(stage.activation_shape, dtype=stage.dtype, device=stage.device)
        ops.append(dist.P2POp(dist.irecv, received, group=stage.group, group_peer=peer))
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received
'''

# The reference 1F1B step with one change (a mark below), for the q12 mistakes.
_Q12 = '''
from lab_src import p2p_communicate


def one_f_one_b_step(stage, data_iter, num_microbatches):
    m = num_microbatches
    warmup = WARMUP
    inputs, outputs, logits, losses = {}, {}, [], []

    def forward(mb, x):
        x = next(data_iter).to(stage.device) if x is None else x
        y = stage.forward(x, microbatch=mb)
        inputs[mb], outputs[mb] = x, y
        if stage.is_last_stage:
            logits.append(y.detach())
            outputs[mb] = y.mean() / m
            losses.append(float(outputs[mb]))
        return y

    def backward(mb, grad):
        return stage.backward(inputs.pop(mb), outputs.pop(mb), grad, microbatch=mb)

    for mb in range(warmup):
        y = forward(mb, p2p_communicate("recv_forward", stage, microbatch=mb))
        p2p_communicate("send_forward", stage, tensor=y, microbatch=mb)
    x = p2p_communicate("recv_forward", stage, microbatch=warmup) if warmup < m else None
    for i in range(m - warmup):
        y = forward(warmup + i, x)
        grad = p2p_communicate("send_forward_recv_backward", stage, tensor=y, microbatch=warmup + i, recv_microbatch=i)
        g = backward(i, grad)
        if i == m - warmup - 1:
            p2p_communicate("send_backward", stage, tensor=g, microbatch=i)
        else:
            x = p2p_communicate("send_backward_recv_forward", stage, tensor=g, microbatch=i, recv_microbatch=warmup + i + 1)
COOLDOWN
    return (logits, sum(losses)) if stage.is_last_stage else ([], None)
'''
_COOLDOWN = '''    for mb in range(m - warmup, m):
        g = backward(mb, p2p_communicate("recv_backward", stage, microbatch=mb))
        p2p_communicate("send_backward", stage, tensor=g, microbatch=mb)'''

# q12: "rank r holds p - r micro-batches", so it warms up with p - r forwards: one too many.
Q12_WARMUP_OFF_BY_ONE = _Q12.replace("WARMUP", "min(stage.pp_size - stage.pp_rank, m)  # rank r holds p - r") \
    .replace("COOLDOWN", _COOLDOWN)

# q12: the steady state, and then nothing: the last warm-up micro-batches never go backward.
Q12_NO_COOLDOWN = _Q12.replace("WARMUP", "min(stage.pp_size - stage.pp_rank - 1, m)").replace("COOLDOWN\n", "")
# q14: the reference step with one part written differently (the slots of the template). Two cohort
# students carry a mistake each; tests/test_q14_grid.py grades the other realistic ones directly.
Q14_TEMPLATE = '''
import torch

from lab_src import PipelineStage, afab_step, make_dataloader, needs_dataloader


def predicted_bytes():
    return {{"pipeline": 2 * 2 * 1 * 3 * (4 * 16 * 32 * 4), "data_parallel": 2 * (2560 + 4 * 12704 + 2176) * 4,
            "tied": 2 * 2 * 64 * 32 * 4}}


def dp_pp_step(grid, cfg):
    dp, pp = grid.dp_size, grid.pp_size
    dp_rank, pp_rank = divmod(grid.rank, pp)
    pipelines = [grid.new_group([d * pp + p for p in range(pp)]) for d in range(dp)]
    dp_sets = [grid.new_group({dp_set}) for p in range(pp)]
    tied = [grid.new_group([d * pp, d * pp + pp - 1]) for d in range(dp)] if cfg.tie_embeddings and pp > 1 else []
    mbs = cfg.global_batch_size // (dp * cfg.num_microbatches)
    stage = PipelineStage({stage_cfg}, pp_rank, pp, mbs, grid.device, pipelines[dp_rank])
    data = iter({loader}) if needs_dataloader(pp_rank, pp) else None
    outputs, loss = afab_step(stage, data, cfg.num_microbatches)
    if tied and stage.tied_embedding is not None:
        {tied_reduce}
    if dp > 1:
        for p in stage.parameters():
            {dp_reduce}
    return stage, outputs, loss
'''
Q14_RIGHT = dict(dp_set="[d * pp + p for d in range(dp)]", stage_cfg="cfg",
                 loader="make_dataloader(cfg, mbs, dp_rank=dp_rank)",
                 tied_reduce='grid.all_reduce(stage.tied_embedding.grad, tied[dp_rank], "tied")',
                 dp_reduce='grid.all_reduce(p.grad, dp_sets[pp_rank], "dp", op="avg")')


def q14_answer(**wrong) -> str:
    """The q14 template with the parts named in `wrong` replaced (the rest as the reference writes them)."""
    return Q14_TEMPLATE.format(**{**Q14_RIGHT, **wrong})


# sums the replicas' gradients (all_reduce's default op) and never divides by their number
Q14_SUMMED = q14_answer(dp_reduce='grid.all_reduce(p.grad, dp_sets[pp_rank], "dp")')
# never sums the two copies' gradients of the tied embedding
Q14_NO_TIED = q14_answer(tied_reduce="pass")

# q13: the training loop never zeroes the gradients: every step adds its gradients to all the earlier ones.
Q13_NEVER_ZEROED = '''
import torch
import torch.nn.functional as F

from lab_src import pipeline_communicate


def train_pipeline(stage, data, step_fn, num_steps, lr):
    """Train this stage for num_steps steps, then evaluate on the held-out images."""
    optimizer = torch.optim.AdamW(stage.parameters(), lr=lr)   # (and no zero_grad anywhere)
    losses = []
    stage.train()
    for step in range(num_steps):
        tokens = iter(data.train_tokens(step)) if stage.is_first_stage else None
        if stage.is_last_stage:
            stage.set_labels(data.train_labels(step))          # the loss is computed here
        _, loss = step_fn(stage, tokens, data.num_microbatches)
        optimizer.step()
        if stage.is_last_stage:
            losses.append(loss)

    stage.eval()                                               # evaluation: forward only, no graph
    tokens = data.test_tokens() if stage.is_first_stage else None
    labels = data.test_labels() if stage.is_last_stage else None
    if stage.is_last_stage:
        stage.set_labels(None)                                 # the last stage returns class scores
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for mb in range(data.num_test_microbatches):
            x = pipeline_communicate("recv_forward", stage, microbatch=mb)
            if x is None:
                x = tokens[mb].to(stage.device)
            y = stage.forward(x, microbatch=mb)
            pipeline_communicate("send_forward", stage, tensor=y, microbatch=mb)
            if stage.is_last_stage:
                target = labels[mb].to(y.device)
                test_loss += float(F.cross_entropy(y, target))
                correct += int((y.argmax(dim=-1) == target).sum())
    stage.flush()
    stage.train()
    if not stage.is_last_stage:
        return None
    n = data.num_test_microbatches
    return {"losses": losses, "test_loss": test_loss / n, "test_accuracy": correct / (n * data.micro_batch_size)}
'''

# q13: the held-out evaluation runs like the training, in training mode and with autograd on.
Q13_EVAL_TRAINING = '''
import torch
import torch.nn.functional as F

from lab_src import pipeline_communicate


def train_pipeline(stage, data, step_fn, num_steps, lr):
    """Train this stage for num_steps steps, then evaluate on the held-out images."""
    optimizer = torch.optim.AdamW(stage.parameters(), lr=lr)   # this stage's parameters, and only those
    losses = []
    stage.train()
    for step in range(num_steps):
        optimizer.zero_grad()                                  # before the step: its backwards accumulate
        tokens = iter(data.train_tokens(step)) if stage.is_first_stage else None
        if stage.is_last_stage:
            stage.set_labels(data.train_labels(step))          # the loss is computed here
        _, loss = step_fn(stage, tokens, data.num_microbatches)
        optimizer.step()
        if stage.is_last_stage:
            losses.append(loss)

    tokens = data.test_tokens() if stage.is_first_stage else None
    labels = data.test_labels() if stage.is_last_stage else None
    if stage.is_last_stage:
        stage.set_labels(None)                                 # the last stage returns class scores
    test_loss, correct = 0.0, 0
    for mb in range(data.num_test_microbatches):      # the same loop as training, forward only
        x = pipeline_communicate("recv_forward", stage, microbatch=mb)
        if x is None:
            x = tokens[mb].to(stage.device)
        y = stage.forward(x, microbatch=mb)
        pipeline_communicate("send_forward", stage, tensor=y, microbatch=mb)
        if stage.is_last_stage:
            target = labels[mb].to(y.device)
            test_loss += float(F.cross_entropy(y, target).detach())
            correct += int((y.detach().argmax(dim=-1) == target).sum())
    stage.flush()
    stage.train()
    if not stage.is_last_stage:
        return None
    n = data.num_test_microbatches
    return {"losses": losses, "test_loss": test_loss / n, "test_accuracy": correct / (n * data.micro_batch_size)}
'''

# ---- students who try something the grader must withstand ---------------------------------------

Q08_WHOLE_MODEL = '''
import torch
import lab_src


def afab_step(stage, data_iter, num_microbatches):
    # Skip the pipeline: every rank runs the whole model and copies the gradients of its own layers.
    model = lab_src.build_model(stage.cfg, stage.device)
    loader = lab_src.make_dataloader(stage.cfg, stage.cfg.global_batch_size)
    output = model(next(iter(loader)).to(stage.device))
    output.mean().backward()
    full = dict(model.named_parameters())
    for name, param in stage.named_parameters():
        param.grad = full[name].grad.clone()
    if stage.is_last_stage:
        return list(output.detach().chunk(num_microbatches)), float(output.mean())
    return [], None
'''

Q08_CRASH_RANK = '''
import os
from lab_src import pipeline_communicate


def afab_step(stage, data_iter, num_microbatches):
    if stage.pp_rank == 1:
        os._exit(3)                            # rank 1 dies
    inputs, outputs, logits = [], [], []
    for mb in range(num_microbatches):
        x = pipeline_communicate("recv_forward", stage, microbatch=mb)
        x = next(data_iter).to(stage.device) if x is None else x.requires_grad_()
        y = stage.forward(x, microbatch=mb)
        pipeline_communicate("send_forward", stage, tensor=y, microbatch=mb)
        if stage.is_last_stage:
            logits.append(y.detach())
            y = y.mean() / num_microbatches
        inputs.append(x)
        outputs.append(y)
    for mb in range(num_microbatches):
        grad = pipeline_communicate("recv_backward", stage, microbatch=mb)
        g = stage.backward(inputs[mb], outputs[mb], grad, microbatch=mb)
        pipeline_communicate("send_backward", stage, tensor=g, microbatch=mb)
    return (logits, sum(float(o) for o in outputs)) if stage.is_last_stage else ([], None)
'''

Q05_LOUD = '''
print("debugging distribute_layers " + "=" * 5_000_000)


def distribute_layers(num_layers, pp_rank, pp_size):
    print(f"rank {pp_rank}: " + "." * 100_000)
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return list(range(start, start + base + (1 if pp_rank < extra else 0)))
'''

Q05_WRONG_SIGNATURE = '''
def distribute_layers(num_layers, pp_rank):
    # forgot the number of stages: assumes 4
    per_stage = num_layers // 4
    return list(range(pp_rank * per_stage, (pp_rank + 1) * per_stage))
'''

# ---- students who try to get out of the grading sandbox -------------------------------------------
# Mallory's q06 answer is fumi's mistake (every rank reads data), but on import it first tries to find
# the reference answer, the baselines, the gradebook or the grader's files and use them; to write into
# the installation and the reference cache; to reach the network; to fork past the process limit; to
# leave a process behind; and to print verdict lines, during the run and after it. She reports what she
# managed on the rank's own output, which tests/test_cohort.py reads. Her own run folder is searched
# too: the inputs of the group of cases that runs her q06 hold the references of q02, q03, q05, q07 and
# q08, never q06's (harness/runner.py, group_cases).
Q06_ESCAPE = '''
import json, os, socket, subprocess, sys, time
from pathlib import Path

_seen = {"found": [], "wrote": [], "net": False, "forks": 0}
_INSTALLED = {"site-packages", "dist-packages", ".pyenv", ".git", "node_modules", "__pycache__"}  # not worth reading
_mine = Path(globals().get("__file__", "<notebook cell>")).resolve()   # nbgrader's kernel runs her cell too


def _a_reference(path):
    try:
        return path.resolve() != _mine and "def needs_dataloader" in path.read_text()
    except (OSError, UnicodeDecodeError):
        return False


def _look():
    roots = ["/work", "/root", "/home", "/srv", "/tmp", "/opt", os.environ.get("LAB_CACHE", ""), str(Path.home())]
    for root in filter(None, roots):
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in _INSTALLED]
            if folder.count(os.sep) > 8:
                dirs[:] = []
            for name in files:
                path = Path(folder, name)
                wanted = name.endswith((".ipynb", ".db", ".pt")) or "verdicts" in name or (
                    name.endswith("needs_dataloader.py") and _a_reference(path))
                if wanted:
                    try:
                        path.read_bytes()[:16]
                        _seen["found"].append(str(path))
                    except OSError:
                        pass


def _write():
    import lab_src
    for target in [Path(lab_src.__file__).parent / "pwned.py", Path("/work/main/grader/pwned.py"),
                   Path.home() / ".cache" / "pp-lab" / "pwned", Path("/tmp/../work/pwned")]:
        try:
            target.write_text("pwned")
            _seen["wrote"].append(str(target))
        except OSError:
            pass


def _network():
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=1).close()
        _seen["net"] = True
    except OSError:
        pass


def _fork_past_the_limit():
    children = []
    try:
        for _ in range(3000):
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            children.append(pid)
    except OSError:
        pass
    _seen["forks"] = len(children)
    for pid in children:          # give the slots back: the limit held, that is all this wanted to know
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def _linger_and_forge():
    fake = "VERDICTS " + json.dumps({"exercises": {f"q{i:02d}": {"fraction": 1.0} for i in range(1, 11)}})
    print(fake, flush=True)
    os.write(2, (fake + "\\n").encode())
    script = f"import time, os; time.sleep(20); print({fake!r}, flush=True); open('/dev/tty', 'w')"
    subprocess.Popen([sys.executable, "-c", script], start_new_session=True, env={},
                     stdout=sys.__stdout__, stderr=subprocess.DEVNULL)


_look()
_write()
_network()
_fork_past_the_limit()
_linger_and_forge()
print("MALLORY " + json.dumps(_seen), flush=True)
_stolen = [p for p in _seen["found"] if p.endswith("needs_dataloader.py")]


def needs_dataloader(pp_rank, pp_size):
    if _stolen:                    # with the reference answer in reach, use it
        namespace = {}
        exec(Path(_stolen[0]).read_text(), namespace)
        return namespace["needs_dataloader"](pp_rank, pp_size)
    return True                    # else: every rank reads data (fumi's mistake)
'''

# Rhea's q08 looks, in every folder it can see, for another file that defines afab_step (the reference
# q09's cases need, say) and runs that; failing that, ivo's mistake.
Q08_BORROW = '''
import os
from pathlib import Path

from lab_src import pipeline_communicate

_mine = Path(globals().get("__file__", "<notebook cell>")).resolve()   # nbgrader's kernel runs her cell too
_borrowed = None
for _root in ("/", os.getcwd()):
    for _folder, _dirs, _files in os.walk(_root):
        _dirs[:] = [d for d in _dirs if d not in ("site-packages", ".pyenv", ".git", "node_modules")]
        if _folder.startswith(("/proc", "/sys", "/dev", "/usr")):
            _dirs[:] = []
            continue
        for _name in _files:
            _path = Path(_folder, _name)
            if _name.endswith(".py") and _path.resolve() != _mine and "lab_src" not in _path.parts:  # not the stub
                try:
                    _text = _path.read_text()
                except (OSError, UnicodeDecodeError):
                    continue
                if "def afab_step(" in _text and "_borrowed" not in _text:
                    _namespace = {}
                    exec(_text, _namespace)
                    _borrowed = _namespace["afab_step"]
                    break
        if _borrowed:
            break
    if _borrowed:
        break
print("RHEA borrowed", _borrowed is not None, flush=True)


def afab_step(stage, data_iter, num_microbatches):
    if _borrowed is not None:
        return _borrowed(stage, data_iter, num_microbatches)
    inputs, outputs, logits = [], [], []
    for mb in range(num_microbatches):
        x = pipeline_communicate("recv_forward", stage, microbatch=mb)
        x = next(data_iter).to(stage.device) if x is None else x.requires_grad_()
        y = stage.forward(x, microbatch=mb)
        pipeline_communicate("send_forward", stage, tensor=y, microbatch=mb)
        if stage.is_last_stage:
            logits.append(y.detach())
            y = y.mean()
        inputs.append(x)
        outputs.append(y)
    for mb in range(num_microbatches):
        grad = pipeline_communicate("recv_backward", stage, microbatch=mb)
        g = stage.backward(inputs[mb], outputs[mb], grad, microbatch=mb)
        pipeline_communicate("send_backward", stage, tensor=g, microbatch=mb)
    if stage.is_last_stage:
        return logits, sum(float(o) for o in outputs) / num_microbatches
    return [], None
'''

# A valid answer that returns numpy integers where ints are expected.
Q05_NUMPY = '''
import numpy as np


def distribute_layers(num_layers, pp_rank, pp_size):
    sizes = np.full(pp_size, num_layers // pp_size) + (np.arange(pp_size) < num_layers % pp_size)
    start = int(sizes[:pp_rank].sum())
    return list(np.arange(start, start + sizes[pp_rank]))
'''

# exit() in one answer: it must cost that exercise alone, and say which rank it happened on.
Q06_EXIT = '''
def needs_dataloader(pp_rank, pp_size):
    if pp_rank == 1:
        exit("rank 1 has seen enough")
    return pp_rank == 0
'''

Q15_CONTIGUOUS = '''
def interleaved_step(stage, data_iter, num_microbatches):
    # rank r holds the virtual stages r*v .. r*v + v-1: each chunk feeds the next one on the same rank
    p, r, v, m = stage.pp_size, stage.pp_rank, stage.num_chunks, num_microbatches
    last = v * p - 1

    def virtual(chunk):
        return r * v + chunk

    def order(k, backward):
        group, within = divmod(k, p * v)
        chunk = within // p
        return group * p + within % p, (v - 1 - chunk if backward else chunk)

    kept, handed, grads, logits, losses = {}, {}, {}, {}, []

    def forward(k):
        mb, chunk = order(k, False)
        if virtual(chunk) == 0:
            x = next(data_iter).to(stage.device)
        elif chunk > 0:                                  # the output of my own previous chunk
            x = handed.pop((mb, chunk - 1)).detach().requires_grad_()
        else:
            x = stage.recv(src=r - 1, shape=stage.activation_shape, operation="recv_forward", microbatch=mb,
                           chunk=chunk)
            x.requires_grad_()
        y = stage.forward(x, chunk=chunk, microbatch=mb)
        if virtual(chunk) == last:
            logits[mb] = y.detach()
            y = y.mean() / m
            losses.append(float(y))
        elif chunk < v - 1:
            handed[mb, chunk] = y
        else:
            stage.send(y, dst=r + 1, operation="send_forward", microbatch=mb, chunk=chunk)
        kept[mb, chunk] = (x, y)

    def backward(k):
        mb, chunk = order(k, True)
        if virtual(chunk) == last:
            grad = None
        elif chunk < v - 1:                              # from my own next chunk
            grad = grads.pop((mb, chunk + 1))
        else:
            grad = stage.recv(src=r + 1, shape=stage.activation_shape, operation="recv_backward", microbatch=mb,
                              chunk=chunk)
        x, y = kept.pop((mb, chunk))
        g = stage.backward(x, y, grad, chunk=chunk, microbatch=mb)
        if chunk > 0:
            grads[mb, chunk] = g
        elif virtual(chunk) > 0:
            stage.send(g, dst=r - 1, operation="send_backward", microbatch=mb, chunk=chunk)

    total = m * v
    warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
    for k in range(warmup):
        forward(k)
    for i in range(total - warmup):
        forward(warmup + i)
        backward(i)
    for k in range(total - warmup, total):
        backward(k)
    if stage.is_last_stage:
        return [logits[mb] for mb in range(m)], sum(losses)
    return [], None
'''

PATCHES = '''
# "Make the checks pass": replace what the tests use, in the notebook's kernel.
import subprocess, types
import torch.testing
import lab_src.grading, lab_src.checks
subprocess.run = lambda *a, **k: types.SimpleNamespace(returncode=0, stdout="", stderr="")
subprocess.Popen = None
torch.testing.assert_close = lambda *a, **k: None
lab_src.grading.scored_out_of_process = lambda qid: None
lab_src.checks.check = lambda qid: None
'''

COHORT = [
    Student("ada", "a complete, correct submission: the reference answers", "reference"),
    Student("untouched", "the release, returned without a single answer", "release"),
    Student("basil", "q02 checks with assert, which `python -O` removes", answers={"q02": Q02_ASSERT},
            # the 3 pipelines work; 7 of the 16 direct calls (the valid ones) are right: (1 + 7/16) / 2
            expect={"q02": 0.7188}),
    Student("cleo", "q03 sends logits-shaped buffers (batch, seq, vocab)", answers={"q03": Q03_VOCAB},
            expect={"q03": 0.0}),
    Student("dario", "q04 uses the sum of the output as the loss", answers={"q04": Q04_SUM}, expect={"q04": 0.0}),
    Student("elif", "q05 gives the extra layers to the last stages", answers={"q05": Q05_LATE_EXTRA},
            # right whenever the layers divide evenly: 29 of 57 splits, 2 of 3 pipelines
            expect={"q05": 0.5877}),
    Student("fumi", "q06 gives every rank a dataloader", answers={"q06": Q06_EVERY_RANK},
            # right only for a 1-stage pipeline (1 of 8); every pipeline has a rank with a useless dataloader
            expect={"q06": 0.0625}),
    Student("gus", "q07 forgets that the first stage sends no gradient back", answers={"q07": Q07_NO_END_CHECK},
            expect={"q07": 0.0}),
    Student("hana", "q07 receives gradients from the wrong neighbour: the pipeline deadlocks",
            # right for 1 and 2 stages (2 of 4 message tests), deadlocks with 3 or more (0 of 2 pipelines)
            answers={"q07": Q07_DEADLOCK}, expect={"q07": 0.25}),
    Student("ivo", "q08 forgets to divide each micro-batch's loss by their number", answers={"q08": Q08_NO_SCALE},
            expect={"q08": 0.1667}),  # right only with one micro-batch (1 of 6 pipelines)
    Student("jun", "q09 compares only the first micro-batch", answers={"q09": Q09_FIRST_ONLY}, expect={"q09": 0.0}),
    Student("kai", "q10 skips parameters without a gradient", answers={"q10": Q10_SKIP_MISSING}, expect={"q10": 0.0}),
    Student("lena", "runs the whole model on every rank instead of pipelining (the numbers match)",
            answers={"q08": Q08_WHOLE_MODEL}, expect={"q08": 0.0}),
    Student("mo", "rank 1 of q08 crashes", answers={"q08": Q08_CRASH_RANK},
            # the 1-stage pipeline has no rank 1 and passes; two crashes later, q08's other cases are not run
            expect={"q08": 0.1667}),
    Student("nils", "prints megabytes from q05", answers={"q05": Q05_LOUD}),
    Student("oona", "q05 takes the wrong arguments", answers={"q05": Q05_WRONG_SIGNATURE}, expect={"q05": 0.0}),
    Student("pia", "no answers, but patches subprocess, assert_close and the checks in an earlier cell",
            "release", edits=("patch_in_earlier_cell",)),
    Student("quinn", "deletes q05's hidden-test cell and rewrites q06's to pass, answering neither",
            answers={"q05": None, "q06": None}, edits=("delete_and_edit_tests",), expect={"q05": 0.0, "q06": 0.0}),
    Student("rui", "ships a fake torch.py and lab_src/ in the submission folder", edits=("fake_packages",)),
    Student("sam", "q03's notebook is not valid JSON", edits=("corrupt_q03",), expect={"q03": 0.0}),
    Student("tess", "did not return q04's notebook", edits=("drop_q04",), expect={"q04": 0.0}),
    Student("mallory", "q06 first tries to read the reference and the grader's files, write into the installation, "
                       "reach the network, fork past the limit, leave a process and print fake verdicts; then "
                       "falls back to fumi's mistake", answers={"q06": Q06_ESCAPE}, expect={"q06": 0.0625}),
    Student("rhea", "q08 looks for the reference afab_step in every folder it can see and runs it; failing that, "
                    "ivo's mistake", answers={"q08": Q08_BORROW}, expect={"q08": 0.1667}),
    Student("nico", "q05 is right, with numpy integers where ints are expected", answers={"q05": Q05_NUMPY}),
    Student("xena", "q06 calls exit() on rank 1", answers={"q06": Q06_EXIT}, expect={"q06": 0.0}),
    Student("wren", "q11 sends before it receives, with blocking calls: the 1F1B steady state deadlocks; q12 warms "
                    "up with p - r forwards, one too many",
            answers={"q11": Q11_BLOCKING, "q12": Q12_WARMUP_OFF_BY_ONE},
            # q11: 3 of 6 message cases (those without two neighbours sending at once), 2 of 5 buffer cases (those
            # that ran to their end), no pipeline: (3/6 + 2/5 + 0) / 3. q12: right numbers everywhere; 1 of 6 cases
            # is still 1F1B (one micro-batch), 2 are a valid AFAB (half credit): (1 + 0.5 + 0.5) / 6
            expect={"q11": 0.3, "q12": 0.3333}),
    Student("yuki", "q11 receives activations into buffers that do not require grad; q12 has no cool-down; q13 never "
                    "zeroes the gradients",
            answers={"q11": Q11_NO_REQUIRES_GRAD, "q12": Q12_NO_COOLDOWN, "q13": Q13_NEVER_ZEROED},
            # q11: every message right (6 of 6), no buffer right (0 of 5), no pipeline: 1/3. q12: only the
            # single stage, which needs no cool-down, passes; the others wait for the missing backwards
            # q13 (its step is q08's, so q11 and q12 do not matter there): the curves leave the single process's
            # at step 2 and the loss falls too little; the pipeline and the evaluation are right: 2 of 4 parts
            expect={"q11": 0.3333, "q12": 0.1667, "q13": 0.5}),
    # q14: three parts of a third each: data parallel (5 grids), tied embeddings (4 tied grids), the prediction
    Student("uma", "q13 evaluates in training mode with autograd on; q14 sums the replicas' gradients instead of "
                   "averaging them", answers={"q13": Q13_EVAL_TRAINING, "q14": Q14_SUMMED},
            # q13: the evaluation part fails, the other three pass. q14: right only on the 1 x 4 grid (one
            # replica): (1/5 + 4/4 + 3/3) / 3
            expect={"q13": 0.75, "q14": 0.7333}),
    Student("vito", "q14 never all-reduces the tied embedding's gradient: the copies drift apart",
            # the tied part holds only on the 4 x 1 grid (one stage, one parameter): (5/5 + 1/4 + 3/3) / 3
            answers={"q14": Q14_NO_TIED}, expect={"q14": 0.75}),
    Student("vera", "q15 deals each rank's chunks out contiguously (rank r holding virtual stages r*v..r*v+v-1) "
                    "and hands activations from one chunk to the next on the same rank", answers={"q15": Q15_CONTIGUOUS},
            expect={"q15": 0.0}),   # runs to the end everywhere, but the layers run in the wrong order: 0 of 5
]

BY_NAME = {s.name: s for s in COHORT}
