"""Judge of q11's "p2p" cases: what each call of `p2p_communicate` sent and received, and the buffers it made.

`judge_p2p(out)` returns two lists of problems:
- messages: the no-ops at the ends; what each receive got (the labelled tensor of the right sender,
  micro-batch and direction); the messages each call made (a combined call makes both of its parts),
  with torch.distributed's own calls rather than the stage's;
  and the run's messages against the case's schedule (peers, shapes, every send with its receive);
- buffers: how each receive that completed allocated its buffer: the activation shape, the run's
  dtype, and `requires_grad` on a received activation (without it the stage's backward computes no
  gradient for its input, and nothing reaches the earlier stages).

`mutual_sends(errors)` names the deadlock q11 is about: two neighbours each blocked in a send to the
other, because each sends before it receives.

`judge_prediction(source)` grades the notebook's prediction (`predicted_deadlock()` in the answer cell):
the micro-batch of the message each of the experiment's two ranks is stuck sending (`blocking_deadlock()`).
"""
from __future__ import annotations

from collections import Counter

from lab_src.judge.failures import in_call
from lab_src.judge.numeric import NotANumber, read_numbers
from lab_src.judge.problems import Problem
from lab_src.judge.realness import check_messages
from lab_src.topics.p2p.calls import COMBINED, Call, calls
from lab_src.pipeline.schedules import Op, schedule


def judge_p2p(out) -> tuple[list[Problem], list[Problem]]:
    case = out.case
    p, m, sched = case.stages, case.microbatches, schedule(case.schedule)
    messages: list[Problem] = []
    buffers: list[Problem] = []
    for r, o in sorted(out.obs.items()):
        messages += _noop_problems(o, r)
        shape = o.get("activation_shape")
        made = sum(len(traced) for *_, traced in o.get("calls", []))
        if made > o.get("raw_messages", made):
            messages.append(Problem(f"{made - o['raw_messages']} of this rank's {made} messages went through "
                                    f"stage.send / stage.recv: q11 asks for torch.distributed's own calls "
                                    f"(dist.P2POp and dist.batch_isend_irecv)", rank=r))
            buffers.append(Problem("the receive buffers came from stage.recv: allocate them yourself "
                                   "(torch.empty with the activation shape, dtype and device)", rank=r))
        for operation, mb, recv_mb, got, traced in o.get("calls", []):
            call = Call(operation, mb, recv_mb)
            messages += _call_problems(call, got, traced, r, p)
            if got is not None and call.receives is not None and not call.receives.is_noop(r, p):
                buffers += _buffer_problems(call, got, shape, case.config.dtype, r)
    if not out.errors() and not out.failure:
        shape = out.obs.get(0, {}).get("activation_shape", ())
        # no compute in a communication case: the counts of operations are left to the calls' checks above
        messages += check_messages(out.events(), p, m, tuple(shape), sched, counts=False)
    return messages, buffers


def _noop_problems(o: dict, r: int) -> list[Problem]:
    problems = []
    for name, res in (o.get("probes", {}).get("noop_ends") or {}).items():
        if res["outcome"] != "returned" or res.get("value") is not None or res.get("messages"):
            end = "last" if (COMBINED.get(name) or (Op(name),))[0].towards_next else "first"
            if res["outcome"] == "raised":
                got = f"it raised {res.get('type')}: {res.get('message', '')}"
            else:
                got = f"it returned {_described(res.get('value'))}"
            sent = res.get("messages", 0)
            got += f" after {sent} message{'s' if sent != 1 else ''}" if sent else ""
            problems.append(Problem(f"{name} on the {end} stage has no peer: it must do nothing and return "
                                    f"None; {got}", rank=r, microbatch=0))
    return problems


def _call_problems(call: Call, got, traced, r: int, p: int) -> list[Problem]:
    problems = []
    mb = call.microbatch
    want = Counter((op.value, call.microbatch_of(op)) for op in call.parts if not op.is_noop(r, p))
    made = Counter((kind, m) for kind, m in traced)
    if made != want:
        def few(c):
            return ", ".join(f"{k}(mb={m})" for k, m in sorted(c.elements(), key=str)) or "no message"
        problems.append(Problem(f"{call} made {few(made)}; on this stage it makes {few(want)}"
                                + (" (a combined operation sends and receives, both with the same neighbour)"
                                   if call.operation in COMBINED else ""), rank=r, microbatch=mb))
    receives = call.receives
    if receives is None or receives.is_noop(r, p):
        if got is not None:
            what = "receives nothing" if receives is None else "has no peer to receive from on this stage"
            problems.append(Problem(f"{call} {what} and must return None (got {got})", rank=r, microbatch=mb))
        return problems
    peer, rmb = receives.peer(r, p), call.microbatch_of(receives)
    if got is None:
        problems.append(Problem(f"{call} returned None, but it receives from rank {peer}: return the "
                                f"received tensor", rank=r, microbatch=rmb))
    elif "from" not in got:
        problems.append(Problem(f"{call} returned {_described(got)}, not the tensor received from rank {peer}",
                                rank=r, microbatch=rmb))
    elif got.get("from") != peer or got.get("mb") != rmb or got.get("phase") != receives.phase:
        what = "activation" if receives.phase == "forward" else "gradient"
        problems.append(Problem(f"{call} received the {got.get('phase')} tensor of micro-batch {got.get('mb')} "
                                f"from rank {got.get('from')}; expected the {what} of micro-batch {rmb} from "
                                f"rank {peer}", rank=r, microbatch=rmb))
    return problems


def _described(got) -> str:
    """What a call returned, in words (topics/p2p/kind.py's `read_buffer`, observe.py's `plain`)."""
    if not isinstance(got, dict):
        return repr(got)
    if "object" in got:
        return f"a {got['object']}, not a tensor"
    shape = got.get("tensor_shape", got.get("shape"))
    words = f"a tensor of shape {shape}" if shape is not None else "a tensor"
    if got.get("uniform") is False:
        words += (" whose values are not one sender's label (a buffer the message has not filled, or a tensor "
                  "made rather than received)")
    return words


def _buffer_problems(call: Call, got: dict, shape, dtype: str, r: int) -> list[Problem]:
    receives = call.receives
    rmb = call.microbatch_of(receives)
    problems = []
    if shape is not None and got.get("shape", got.get("tensor_shape")) != list(shape):
        problems.append(Problem(f"{call} returned a buffer of shape {got.get('shape', got.get('tensor_shape'))}; "
                                f"allocate stage.activation_shape = {tuple(shape)}", rank=r, microbatch=rmb))
    if got.get("dtype") not in (None, dtype):
        problems.append(Problem(f"{call} returned a {got.get('dtype')} buffer in a {dtype} run: allocate it "
                                f"with dtype=stage.dtype", rank=r, microbatch=rmb))
    if receives is Op.RECV_FORWARD and got.get("requires_grad") is False:
        problems.append(Problem(f"{call} returned an activation that does not require grad: the stage's "
                                f"backward then computes no gradient for its input, and nothing reaches the "
                                f"earlier stages. Allocate the receive buffer with requires_grad=True",
                                rank=r, microbatch=rmb))
    return problems


def mutual_sends(errors: dict[int, dict]) -> list[Problem]:
    """Two neighbours that each stopped inside a send to the other: each sent before receiving, with a
    send that waits for the peer's receive (a blocking send, or a posted send waited for before the
    receive was posted)."""
    pending = {r: e["pending"] for r, e in errors.items() if e.get("pending")}
    problems = []
    for r, (_, kind, mb, peer, *_) in sorted(pending.items()):
        other = pending.get(peer)
        op = Op.of(kind)
        if op is None or not op.is_send or other is None or other[3] != r or peer < r:
            continue
        other_op = Op.of(other[1])
        if other_op is None or not other_op.is_send:
            continue
        call, other_call = in_call(errors[r], kind, mb), in_call(errors[peer], other[1], other[2])
        problems.append(Problem(f"ranks {r} and {peer} each wait inside a send to the other (rank {r}: "
                                f"{kind}(mb={mb}) to rank {peer}{f' in {call}' if call else ''}; rank {peer}: "
                                f"{other[1]}(mb={other[2]}) to rank {r}{f' in {other_call}' if other_call else ''}"
                                f"), and neither has posted the receive the other's message needs: "
                                f"each sends before it receives, and a send waits for its receiver. Post the "
                                f"send and the receive together (dist.batch_isend_irecv), then wait for both",
                                rank=r, microbatch=mb))
    return problems


# ---- the prediction: where the blocking pair deadlocks ----------------------------------------------
PREDICTION_NAME = "predicted_deadlock"     # a function of the answer cell
DEMO_STAGES, DEMO_MICROBATCHES = 2, 4      # the blocking-sends experiment: 2 ranks, 1F1B, 4 micro-batches


def blocking_deadlock(p: int = DEMO_STAGES, m: int = DEMO_MICROBATCHES) -> dict[str, int]:
    """{"rank r": micro-batch}: the message each rank is stuck sending when every call of a 1F1B step
    sends (blocking) before it receives: its first combined call that sends to a neighbour (the steady
    state's first send whose neighbour is sending to it at the same moment)."""
    out = {}
    for r in range(p):
        first = next((c for c in calls("1f1b", r, p, m) if c.operation in COMBINED
                      and not c.parts[0].is_noop(r, p)), None)
        if first is not None:
            out[f"rank {r}"] = first.microbatch
    return out


def judge_prediction(source: str | None) -> list[Problem]:
    """The problems of the prediction in the answer `source` (none when it is right)."""
    try:
        got = read_numbers(source or "", PREDICTION_NAME)
    except NotANumber as e:
        return [Problem(f"the prediction could not be read: {e}")]
    want = blocking_deadlock()
    wrong = [k for k in want if got.get(k) != want[k]]
    if not wrong:
        return []
    said = ", ".join(f"{k}: {got[k]:g}" if k in got else f"{k}: missing" for k in want)
    return [Problem(f"{PREDICTION_NAME}() says {said}; in the experiment, each rank gets stuck in the first send of "
                    f"its steady state, whose neighbour is sending to it at the same moment (count the warm-up "
                    f"forwards of each rank: p - 1 - rank)")]
