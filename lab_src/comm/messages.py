"""Raw `torch.distributed` point-to-point calls, recorded like the stage's own messages (q11, q12).

Students of q11 call `dist.P2POp`, `dist.batch_isend_irecv`, `dist.isend`, `dist.irecv`, `dist.send`
and `dist.recv` themselves, not `stage.send` / `stage.recv`. Inside the processes of a check or of
the grader, `install()` replaces those entry points (in `torch.distributed` and in
`distributed_c10d`, so that `P2POp`'s own check of its `op` and `batch_isend_irecv`'s dispatch still
recognise them) by wrappers that record each message as an `Event` and journal it. The text grids,
the timeline, the judges and the deadlock report then see raw calls as they see the stage's.

What a message is follows from its direction: a send to the next rank carries activations
(send_forward), a receive from the next rank a gradient (recv_backward), and so on. Its micro-batch
is the one of the q11 call it belongs to: `p2p_call` runs around every call of q11's function (see
`exercises.AROUND`) and holds its `microbatch` (the tensor sent, or received by a single receive) and
`recv_microbatch` (the tensor a combined operation receives). A posted message begins when it is
posted and ends when its `wait()` returns; one still open when the q11 call returns ends then.

For the deadlock watch (harness/deadlock.py), each message is journalled on its own: a posted one (P)
when it is posted, the rank waiting for it (A) when its `wait()` begins, its end (E) when that returns;
under a check, a blocking `send` or `recv` is posted and waited for the same way (P, A, E). Waits then go
through `pipeline/waiting.py`, so the check can stop a rank that waits for a message nobody will take or
send. (Outside a check's cases, a blocking call is journalled as an operation the rank is in: B ... E.)

A kind may run its ranks over an emulated network (`NETWORK`, topics/data_parallel/network.py): every send is
then handed to the rank's emulated link, which posts it when its delay is up, and its request waits for that. q19's
ring kind runs them over links that hold each send against the size of the receive it matches
(topics/data_parallel/sizes.py), which each receive tells them as it is posted (`_receiving`).

Calls the stage makes inside its own traced span (`stage.send` / `stage.recv`) are not recorded twice,
and nothing is recorded outside a tracer (code run in a notebook's kernel is left alone).
"""
from __future__ import annotations

import contextlib
import threading
import time

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from lab_src.harness.records import Q11_CALL
from lab_src.pipeline import trace, waiting
from lab_src.pipeline.ops import COMBINED, Op
from lab_src.pipeline.trace import Event

_ORIGINAL: dict = {}
_thread = threading.local()    # per thread of the rank (a lane: pipeline/trace.py Tracer.lane): `calls`, the q11
                               # calls in progress (microbatch, recv_microbatch, records still open); `batch`, > 0
                               # while batch_isend_irecv posts its operations (recorded by the batch)


def _calls() -> list[dict]:
    if not hasattr(_thread, "calls"):
        _thread.calls = []
    return _thread.calls


def _in_batch(step: int = 0) -> int:
    _thread.batch = getattr(_thread, "batch", 0) + step
    return _thread.batch
RECORDED = [0]                 # messages recorded here so far (a check compares with all the messages it saw)
# An emulated network (topics/data_parallel/network.py `Links`), set by a kind that runs its ranks over one: every
# message sent then goes through it (`send(peer, tensor, args, kwargs)` returns its request), None: straight to gloo
NETWORK: list = [None]
# while a q19 case runs (its kind arms it with a list): per message sent, in the order posted, what it carried, as
# [the peer's global rank, elements, first element, last element, float64 sum of its elements] (see
# topics/data_parallel/records.py CARRIED_FIELDS), so that the judge can tell whether a ring's messages held the
# partial sums a ring must carry; read when the send is posted, the moment its contents leave
CARRIED: list | None = None
# sends and receives posted in this process so far (each record keeps its number: which of a call's messages it was)
POSTED = {"send": 0, "recv": 0}
# while a q19 case runs (its kind arms it with a list): each message whose request was let go of before its wait(),
# as ["send" or "recv", the peer's global rank, its number (POSTED)]. gloo drops a message whose request is gone
# before it completes, and its peer then waits for ever; the lab keeps such a request (UNWAITED_KEPT) until the
# case ends, so the run goes on and the judge names the message instead of a deadlock that ends at the deadline
UNWAITED: list | None = None
UNWAITED_KEPT: list = []


def carried(tensor, peer) -> list:
    flat = tensor.detach().reshape(-1)
    if not flat.numel():
        return [peer, 0, 0.0, 0.0, 0.0]
    return [peer, flat.numel(), float(flat[0]), float(flat[-1]), float(flat.double().sum())]


@contextlib.contextmanager
def p2p_call(operation=None, stage=None, tensor=None, microbatch=0, recv_microbatch=None, *args, **kwargs):
    """Around one call of q11's function: the micro-batches its messages belong to."""
    call = {"microbatch": microbatch, "recv_microbatch": microbatch if recv_microbatch is None else recv_microbatch,
            "open": [], "stage": stage, "operation": operation}
    _calls().append(call)
    try:
        yield
    except BaseException as e:
        # the call the rank was in when it stopped, for the deadlock's lines (judge/failures.py): the
        # innermost q11 call, the one whose message it waited in
        with contextlib.suppress(AttributeError, TypeError):
            if not getattr(e, Q11_CALL, None):
                setattr(e, Q11_CALL, _call_text(call))
        raise
    finally:
        _calls().pop()
    unwaited = [record for record in call["open"] if record.posted_only]
    for record in list(call["open"]):      # posted and never waited for (an exception leaves them pending)
        record.end()
    if unwaited:
        raise NotWaited(unwaited_message(call, unwaited))


class NotWaited(RuntimeError):
    """A q11 call returned while messages it posted were still in flight (a request never waited for)."""


class WrongDirection(ValueError):
    """A q11 call messaged the neighbour on the other side than its operation's (read from its name)."""


def _call_text(call: dict) -> str:
    mbs = f"mb={call['microbatch']}" + (f", recv_mb={call['recv_microbatch']}"
                                        if call["recv_microbatch"] != call["microbatch"] else "")
    return f"{call.get('operation')}({mbs})"


def unwaited_message(call: dict, records: list) -> str:
    """The mistake: batch_isend_irecv (or isend / irecv) only posts a message; its request's wait() is what
    makes it complete. A receive buffer returned before then holds whatever was in memory."""
    what = ", ".join(f"{'a send to' if r.kind.startswith('send') else 'a receive from'} rank {r.peer}"
                     for r in records)
    recv = any(r.kind.startswith("recv") for r in records)
    return (f"q11 {_call_text(call)} returned before its messages completed: {what} was posted and never "
            f"waited for. batch_isend_irecv (like isend and irecv) only posts a message and returns a request; "
            f"call wait() on every request it returns before p2p_communicate returns"
            + ("; until then the receive buffer holds whatever was in memory, not the peer's tensor" if recv
               else "; until then the message has not left, and the tensor sent must not change"))


def check_direction(call: dict | None, kind: str, peer, rank) -> None:
    """A message of a q11 call goes the way its operation says: recv_forward receives the activation from
    the previous rank, recv_backward the gradient from the next, and so on. Reading the side from the word
    "forward" in the name sends half of them the wrong way: say so before posting."""
    operation = call.get("operation") if call else None
    parts = COMBINED.get(operation) or ((Op(operation),) if operation in Op._value2member_map_ else ())
    if not parts or rank is None or not isinstance(peer, int) or abs(peer - rank) != 1:
        return
    is_send = kind.startswith("send")
    part = next((op for op in parts if op.is_send == is_send), None)
    if part is None or part.value == kind:
        return
    side = "next" if peer > rank else "previous"
    right = "next" if part.towards_next else "previous"
    what = "an activation" if part.phase == "forward" else "a gradient"
    raise WrongDirection(f"q11 {_call_text(call)} on rank {rank}: {'a send to' if is_send else 'a receive from'} "
                     f"rank {peer}, the {side} rank; {part.value} {'sends' if is_send else 'receives'} {what}, "
                     f"{'to' if is_send else 'from'} the {right} rank (pp_rank {'+' if right == 'next' else '-'} "
                     f"1). The side follows from what travels (activations go forward, to the next rank; "
                     f"gradients go backward, to the previous one), not from the word \"forward\" or "
                     f"\"backward\" in the operation's name")


def _kind(is_send: bool, rank, peer) -> str:
    towards_next = rank is not None and peer is not None and peer > rank
    if is_send:
        return "send_forward" if towards_next else "send_backward"
    return "recv_backward" if towards_next else "recv_forward"


def _global_peer(group, peer, group_peer):
    """The global rank of a message's peer: `dst` / `src` are global ranks already; `group_dst` /
    `group_src` (a P2POp's `group_peer`) are ranks of `group`. The deadlock watch matches messages by global
    rank, so a ring over a grid's column (q19), whose positions are not global ranks, is matched right."""
    if peer is not None or group_peer is None or group is None:
        return peer if peer is not None else group_peer
    try:
        return dist.get_global_rank(group, group_peer)
    except Exception:  # noqa: BLE001 - not in the group: keep it as given, the judge reports it
        return group_peer


class MessageToItself(ValueError):
    """A send to, or a receive from, the rank itself: no peer will ever match it."""


class NotInGroup(ValueError):
    """A message's peer given as a global rank (dst=, src=, a P2POp's peer) that is not another member of the group
    it goes through: a position in the group taken for a global rank (q19's ring over a grid's column)."""


def check_global_peer(is_send: bool, group, peer, call: str) -> None:
    """Raise NotInGroup, in the lab's words, where torch would raise its own ValueError (naming the group by its
    address) or the message would go to the rank itself: `peer`, a global rank, is no other member of `group`."""
    if peer is None or group is None or group is dist.group.WORLD or not isinstance(peer, int) or not _recording():
        return
    ranks, me = dist.get_process_group_ranks(group), dist.get_rank()
    positions_are_ranks = ranks == list(range(len(ranks)))
    if (peer in ranks and peer != me) or (peer == me and positions_are_ranks):
        return          # a message to itself in a group whose positions are its ranks: MessageToItself says it
    name = "dst" if is_send else "src"
    what = "this rank itself" if peer == me else "not in the group"
    if positions_are_ranks:
        raise NotInGroup(f"{call} was given {name}={peer}: global rank {peer} is not in the group (its global ranks "
                         f"are {ranks}), so no rank of it can take this message")
    position = ranks.index(me) if me in ranks else None
    meant = (f"; position {peer} of the group is global rank {ranks[peer]}" if 0 <= peer < len(ranks) else "")
    raise NotInGroup(
        f"{call} was given {name}={peer}: {name}= (a P2POp's peer) is a global rank, and global rank {peer} is {what}. "
        f"Positions in a group are not global ranks: this rank is global rank {me}, position {position} of the group "
        f"of global ranks {ranks}{meant}. Pass a position as group_{name}= (a P2POp's group_peer=), or turn it into "
        f"a global rank with dist.get_global_rank(group, position)")


def _p2p_op_class():
    """dist.P2POp, checking a peer given as a global rank before torch does (check_global_peer): torch's own
    check names the group by its address. An instance is a P2POp, so torch and the recorder take it as one."""
    original = c10d.P2POp

    class P2POp(original):
        def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
            is_send = op is c10d.isend or op is _ORIGINAL.get("isend")
            check_global_peer(is_send, group, peer, f"dist.P2POp(dist.{'isend' if is_send else 'irecv'}, ...)")
            super().__init__(op, tensor, peer, group, tag, group_peer)

    P2POp.__module__, P2POp.__doc__ = original.__module__, original.__doc__
    return P2POp


def check_tensor(call: dict | None, kind: str, tensor, mb) -> None:
    """A message of q11 carries the pipeline's activations: a tensor of another shape or dtype than the
    peer's would make gloo abort the process, or the receive read garbage. Say so before posting."""
    stage = call.get("stage") if call else None
    shape, dtype = getattr(stage, "activation_shape", None), getattr(stage, "dtype", None)
    if shape is None or dtype is None:
        return
    what = f"q11 {call.get('operation')}: {kind}(mb={mb})"
    role = "the tensor to send" if kind.startswith("send") else "the receive buffer"
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{what}: {role} has shape {tuple(tensor.shape)}; every message of the pipeline has "
                         f"stage.activation_shape = {tuple(shape)}")
    if tensor.dtype != dtype:
        raise ValueError(f"{what}: {role} is {str(tensor.dtype).replace('torch.', '')}, but the pipeline runs in "
                         f"{str(dtype).replace('torch.', '')}: make it with dtype=stage.dtype (the two ends of a "
                         f"message must agree, byte for byte)")


class _Record:
    """One message, from its posting to the end of its wait."""

    def __init__(self, is_send: bool, tensor, group, peer=None, group_peer=None, posted: bool = True):
        self.tracer = trace.active()
        call = _calls()[-1] if _calls() else None
        self.peer = _global_peer(group, peer, group_peer)
        me = dist.get_rank()
        self.kind = _kind(is_send, me, self.peer)
        self.mb = None if call is None else call["microbatch" if is_send else "recv_microbatch"]
        if self.peer == me:
            raise MessageToItself(
                f"{'a send to' if is_send else 'a receive from'} rank {me}, this rank itself: no message ever "
                f"matches it. With a group, group_dst= / group_src= (a P2POp's group_peer=) is a position in the "
                f"group, dist.get_rank(group); dst= / src= is a global rank, dist.get_rank()")
        check_direction(call, self.kind, self.peer, me)
        self.posted_only = posted          # a posted message: its request's wait() ends it
        self.number = POSTED["send" if is_send else "recv"]
        POSTED["send" if is_send else "recv"] += 1
        self.shape = tuple(tensor.shape)
        self.nbytes = tensor.numel() * tensor.element_size()
        self.done = False
        self.pending = self.tracer.begin(self.kind, self.mb, self.peer, posted=posted)
        self.call = call
        self.waiting()
        check_tensor(call, self.kind, tensor, self.mb)
        if is_send and CARRIED is not None:
            CARRIED.append(carried(tensor, self.peer))
        self.tracer.pending = None
        self.t_start = time.perf_counter()
        if call is not None:
            call["open"].append(self)

    def waiting(self) -> None:
        """An error from here on names this message."""
        self.tracer.pending = self.pending

    def blocked(self) -> None:
        """The rank now waits for this posted message (journalled: the deadlock watch counts it waiting)."""
        self.tracer.awaits(self.pending)

    def end(self) -> None:
        if self.done:
            return
        self.done = True
        self.posted_only = False
        if self.tracer.sync is not None:
            self.tracer.sync()
        if self.tracer.pending is self.pending:
            self.tracer.pending = self.tracer.pending_since = None
        self.tracer.record(Event(self.tracer.rank, self.kind, self.mb, self.peer, self.shape, self.nbytes,
                                 self.t_start, time.perf_counter()), self.pending)
        RECORDED[0] += 1
        if self.call is not None and self in self.call["open"]:
            self.call["open"].remove(self)


def _recording() -> bool:
    """Record raw calls under a tracer, outside the stage's own traced spans and inside no batch."""
    t = trace.active()
    return t is not None and t.pending is None and not _in_batch()


class RecordedWork:
    """A `Work` whose `wait()` ends its messages' records; everything else is the original's."""

    def __init__(self, work, records: list[_Record]):
        self._work, self._records = work, records

    def wait(self, *args, **kwargs):
        for record in self._records:
            if not record.done:
                record.blocked()
                break
        if self._work is None:
            result = True
        elif args or kwargs:            # a timeout of the student's own: their wait, as they asked for it
            result = self._work.wait(*args, **kwargs)
        else:
            result = waiting.wait(self._work)
        for record in self._records:
            record.end()
        return result

    def __getattr__(self, name):
        return getattr(self._work, name)

    def __del__(self):
        """A request let go of before its wait() (see UNWAITED): noted, its message ended where it was let go,
        and the request kept while a q19 case runs, so that gloo still delivers it."""
        try:
            if UNWAITED is None or "_records" not in self.__dict__:
                return
            left = [r for r in self._records if r.posted_only and not r.done]
            if not left:
                return
            if self._work is not None and not self._work.is_completed():
                UNWAITED_KEPT.append(self._work)
            for record in left:
                UNWAITED.append(["send" if record.kind.startswith("send") else "recv", record.peer, record.number])
                record.end()
        except Exception:  # noqa: BLE001 - a finalizer must not raise (the interpreter may be going down)
            pass


def _send(peer, tensor, args, kwargs):
    """Post a send: through the emulated network when one is set, else to gloo at once."""
    if NETWORK[0] is None:
        return _ORIGINAL["isend"](tensor, *args, **kwargs)
    return NETWORK[0].send(peer, tensor, args, kwargs)


def _receiving(peer, tensor) -> None:
    """A receive from `peer` into `tensor` is about to be posted: told to the links that want to know
    (topics/data_parallel/sizes.py holds each send against the size of the receive it matches)."""
    hook = getattr(NETWORK[0], "receiving", None)
    if hook is not None:
        hook(peer, tensor)


def _arguments(args, kwargs, peer_name: str, group_key: str):
    bound = dict(zip([peer_name, "group", "tag"], args), **kwargs)
    return bound.get("group"), bound.get(peer_name), bound.get(group_key)


def _posted(is_send: bool):
    name = "isend" if is_send else "irecv"
    original = _ORIGINAL[name]
    peer_name, group_key = ("dst", "group_dst") if is_send else ("src", "group_src")

    def wrapper(tensor, *args, **kwargs):
        if not _recording():
            return original(tensor, *args, **kwargs)
        group, peer, group_peer = _arguments(args, kwargs, peer_name, group_key)
        check_global_peer(is_send, group, peer, f"dist.{name}")
        record = _Record(is_send, tensor, group, peer, group_peer)
        record.waiting()                  # a failure to post names the operation too
        if not is_send:
            _receiving(record.peer, tensor)
        work = _send(record.peer, tensor, args, kwargs) if is_send else original(tensor, *args, **kwargs)
        record.tracer.pending = None
        return RecordedWork(work, [record])
    return _named(wrapper, original)


def _blocking(is_send: bool):
    name = "send" if is_send else "recv"
    original = _ORIGINAL[name]
    peer_name, group_key = ("dst", "group_dst") if is_send else ("src", "group_src")

    def wrapper(tensor, *args, **kwargs):
        if not _recording():
            return original(tensor, *args, **kwargs)
        group, peer, group_peer = _arguments(args, kwargs, peer_name, group_key)
        check_global_peer(is_send, group, peer, f"dist.{name}")
        if waiting.stoppable() and (peer is not None or group_peer is not None):
            # under a check: posted, then waited for in a wait the check can stop (an exception leaves
            # it pending, for the report); a receive returns its sender's global rank, as dist.recv does
            record = _Record(is_send, tensor, group, peer, group_peer)
            record.waiting()
            if not is_send:
                _receiving(record.peer, tensor)
            posted = _send(record.peer, tensor, args, kwargs) if is_send else \
                _ORIGINAL["irecv"](tensor, *args, **kwargs)
            record.blocked()
            waiting.wait(posted)
            result = None if is_send else (peer if peer is not None else
                                           dist.get_global_rank(group or dist.group.WORLD, group_peer))
        else:
            record = _Record(is_send, tensor, group, peer, group_peer, posted=False)
            record.waiting()
            if is_send and NETWORK[0] is not None:
                _send(record.peer, tensor, args, kwargs).wait()
                result = None                                  # as dist.send returns
            else:
                if not is_send:
                    _receiving(record.peer, tensor)
                result = original(tensor, *args, **kwargs)    # an exception leaves it pending, for the report
        record.end()
        return result
    return _named(wrapper, original)


def _batch():
    original = _ORIGINAL["batch_isend_irecv"]

    def wrapper(p2p_op_list):
        if not _recording() or not isinstance(p2p_op_list, list) or \
                not all(isinstance(op, c10d.P2POp) for op in p2p_op_list):
            return original(p2p_op_list)          # the original reports a malformed list
        records = [_Record(op.op is c10d.isend, op.tensor, op.group, None, op.group_peer) for op in p2p_op_list]
        if records:
            records[0].waiting()
        _in_batch(+1)
        try:
            if NETWORK[0] is not None:     # each message through the emulated network, posted as it says
                works = [_send(r.peer, op.tensor, (), {"group": op.group, "tag": op.tag, "group_dst": op.group_peer})
                         if r.kind.startswith("send") else
                         _receiving(r.peer, op.tensor) or
                         _ORIGINAL["irecv"](op.tensor, group=op.group, tag=op.tag, group_src=op.group_peer)
                         for r, op in zip(records, p2p_op_list)]
            else:
                works = original(p2p_op_list)
        finally:
            _in_batch(-1)
        if records:
            records[0].tracer.pending = None
        if len(works) == len(records):
            return [RecordedWork(w, [r]) for w, r in zip(works, records)]
        return [RecordedWork(w, records) for w in works]     # coalesced (NCCL): any wait ends them all
    return _named(wrapper, original)


def _named(wrapper, original):
    wrapper.__name__, wrapper.__qualname__ = original.__name__, original.__qualname__
    wrapper.__doc__, wrapper.__wrapped__ = original.__doc__, original
    return wrapper


NAMES = ("isend", "irecv", "send", "recv", "batch_isend_irecv")


def install() -> None:
    """Record raw point-to-point calls in this process from now on (idempotent)."""
    if _ORIGINAL:
        return
    for name in NAMES:
        _ORIGINAL[name] = getattr(c10d, name)
    wrappers = {"isend": _posted(True), "irecv": _posted(False), "send": _blocking(True), "recv": _blocking(False),
                "batch_isend_irecv": _batch()}
    for name, fn in wrappers.items():
        setattr(c10d, name, fn)
        setattr(dist, name, fn)
    dist.P2POp = _p2p_op_class()         # torch.distributed's name only: c10d's class is what torch checks against
    from lab_src import exercises
    exercises.AROUND["q11"] = p2p_call


def installed() -> bool:
    return bool(_ORIGINAL)
