"""Bytes on the wire, counted by the kernel and read from outside the ranks.

Every byte a rank sends to another rank (gloo's pairs, the launch's store) travels over a TCP connection on
loopback, and the kernel counts each connection's bytes (`struct tcp_info`: bytes_sent, bytes_received,
segments). A process the student's code does not share reads them: the launching process, with a sock_diag
netlink socket of the ranks' network namespace (the sandbox's: its fork server opens one before any answer is
loaded and hands it out, `zygote.py`; unsandboxed, the launching process's own), and maps each connection to
its rank through the rank's descriptors (`/proc/<pid>/fd`). What the rank's own record says it sent is then a
claim held against these counts (`lab_src/judge/wire.py`).

A connection closed between two readings takes its counts with it; the loopback interface's counters of the
namespace (`/proc/<pid>/net/dev`) count every packet whatever its connection, so the difference between the two
is what travelled on connections that closed in between (or on anything but TCP). Both are read at the same
moments: at every fence a rank asks for (harness/fence.py), where the rank waits until the launching process has read.

This module is the reading (netlink, /proc); it imports no torch.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_DONE, NLMSG_ERROR = 3, 2
INET_DIAG_INFO = 2
ALL_STATES = 0xFFFFFFFF & ~(1 << 10)        # every TCP state but TCP_NEW_SYN_RECV
# struct tcp_info (linux/tcp.h): the offsets of the fields read here (kernel 4.19 and later)
_OFF_BYTES_ACKED, _OFF_BYTES_RECEIVED, _OFF_SEGS_OUT, _OFF_BYTES_SENT, _OFF_BYTES_RETRANS = 120, 128, 136, 200, 208


@dataclass(frozen=True)
class Conn:
    """One TCP endpoint: its socket's inode, its own and its peer's address, what the kernel counted."""
    inode: int
    local: tuple            # (address, port)
    remote: tuple
    sent: int               # bytes_sent less bytes_retrans: each byte of data once
    received: int
    segs_out: int
    retrans: int = 0        # bytes sent again (a loaded machine's loopback drops some): the interface counts them


def open_diag() -> socket.socket:
    """A sock_diag netlink socket of this process's network namespace."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)


def _request(family: int, seq: int) -> bytes:
    # struct inet_diag_req_v2: family, protocol, ext, pad, states, then an all-zero inet_diag_sockid (48 bytes)
    req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, ALL_STATES) + bytes(48)
    return struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + req


def _address(family: int, raw: bytes) -> str:
    return socket.inet_ntop(family, raw[:4] if family == socket.AF_INET else raw[:16])


def dump(diag: socket.socket) -> list[Conn]:
    """Every TCP connection of the namespace with its counts (listening sockets included, with zero counts)."""
    conns: list[Conn] = []
    for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
        diag.send(_request(family, seq))
        done = False
        while not done:
            data = diag.recv(1 << 16)
            off = 0
            while off + 16 <= len(data):
                length, kind, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, off)
                if length < 16:
                    done = True
                    break
                if kind in (NLMSG_DONE, NLMSG_ERROR):
                    done = True
                    break
                conns.append(_parse(data[off + 16: off + length]))
                off += (length + 3) & ~3
    return [c for c in conns if c is not None]


def _parse(msg: bytes) -> Conn | None:
    # struct inet_diag_msg: family, state, timer, retrans; id (sport, dport big-endian, src[16], dst[16],
    # if, cookie[2]); expires, rqueue, wqueue, uid, inode; then attributes
    family = msg[0]
    sport, dport = struct.unpack_from("!HH", msg, 4)
    src, dst = msg[8:24], msg[24:40]
    inode = struct.unpack_from("=I", msg, 68)[0]
    sent = received = segs = retrans = 0
    off = 72
    while off + 4 <= len(msg):
        alen, atype = struct.unpack_from("=HH", msg, off)
        if alen < 4:
            break
        if atype == INET_DIAG_INFO:
            info = msg[off + 4: off + alen]
            if len(info) >= _OFF_BYTES_RETRANS + 8:     # what was sent, each byte once (a retransmission is not more)
                retrans = struct.unpack_from("=Q", info, _OFF_BYTES_RETRANS)[0]
                sent = struct.unpack_from("=Q", info, _OFF_BYTES_SENT)[0] - retrans
            elif len(info) >= _OFF_BYTES_ACKED + 8:
                sent = struct.unpack_from("=Q", info, _OFF_BYTES_ACKED)[0]
            if len(info) >= _OFF_BYTES_RECEIVED + 8:
                received = struct.unpack_from("=Q", info, _OFF_BYTES_RECEIVED)[0]
            if len(info) >= _OFF_SEGS_OUT + 4:
                segs = struct.unpack_from("=I", info, _OFF_SEGS_OUT)[0]
        off += (alen + 3) & ~3
    fam = socket.AF_INET if family == socket.AF_INET else socket.AF_INET6
    return Conn(inode, (_address(fam, src), sport), (_address(fam, dst), dport), sent, received, segs, retrans)


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process `pid` holds (empty when it is gone or cannot be read)."""
    found = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            found.add(int(link[8:-1]))
    return found


def loopback_bytes(pid: int) -> int | None:
    """The bytes the loopback interface of `pid`'s network namespace has sent (its packets' headers included)."""
    try:
        with open(f"/proc/{pid}/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    return int(rest.split()[8])
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class Reading:
    """One reading for one rank: when, and per connection (keyed by its peer's address) the counts."""
    at: float
    conns: dict = field(default_factory=dict)       # inode -> Conn
    loopback: int | None = None
    unread: bool = False        # the rank's connections could not be read (no socket, no such process)
    peers: dict = field(default_factory=dict)       # inode -> the inode of its other end then (None: not found)
    # in a sandbox, every TCP socket of its namespace (whoever holds it, or none: one closed with bytes still in
    # flight): (its address, its peer's) -> (bytes sent, retransmissions included; segments sent), for the
    # loopback's account (`unseen`)
    namespace: dict = field(default_factory=dict)
    # the rank's I/O counters then (/proc/<pid>/io, read here: rchar, wchar, syscr, syscw), {} where they could not be
    io: dict = field(default_factory=dict)


def process_io(pid: int | str) -> dict:
    """Process `pid`'s I/O counters (/proc/<pid>/io: bytes its read()s and write()s passed, and their calls; "self":
    this process's own); {} where they cannot be read."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return {k.strip(): int(v) for k, _, v in (line.partition(":") for line in f) if k.strip() in IO_KEYS}
    except (OSError, ValueError):
        return {}


IO_KEYS = ("rchar", "wchar", "syscr", "syscw")


def read_rank(diag: socket.socket, pid: int, netns_pid: int | None = None) -> Reading:
    inodes = socket_inodes(pid)
    conns = {c.inode: c for c in dump(diag) if c.inode in inodes}
    return Reading(time.monotonic(), conns, loopback_bytes(netns_pid or pid))


def _host(address: tuple) -> tuple:
    """An endpoint as one spelling: IPv4 either way (a v4-mapped IPv6 socket's '::ffff:127.0.0.1')."""
    host, port = address
    return (host[7:] if host.startswith("::ffff:") else host, port)


@dataclass
class WireCount:
    """What the kernel counted on one rank's connections over one case, read from outside the rank.

    `sent_to`: bytes per peer rank, from the case's start fence to its end fence; `after`: bytes sent to ranks
    from its end fence to the start of the rank's next case, counted or not (the lab's own: a few hundred bytes);
    `other_sent`: to processes that are no rank (the launch's store, where the lab's barriers poll); `readings`:
    the fences read (`start`, `end`); `unread`: readings that could not be made. What no connection
    accounts for is the case's, not a rank's: `WireWatch.unseen`.
    """
    sent_to: dict = field(default_factory=dict)
    after: int = 0
    other_sent: int = 0
    readings: tuple = ()
    unread: int = 0             # readings the launching process could not make (the rank's process not found)
    io: tuple = ()              # per reading of `readings`, the rank's I/O counters then (Reading.io; {}: unread)

    def io_between(self, first: str, second: str) -> dict | None:
        """What the rank's process read and wrote (rchar, wchar, syscr, syscw) between its fences `first` and
        `second` of this case, counted from outside it; None where either reading is missing."""
        names = list(self.readings)
        i = names.index(first) if first in names else None
        j = names.index(second, i + 1) if i is not None and second in names[i + 1:] else None
        if j is None or not self.io[i] or not self.io[j]:
            return None
        a, b = self.io[i], self.io[j]
        return {k: b[k] - a[k] for k in IO_KEYS if k in a and k in b}

    @property
    def sent(self) -> int:
        return sum(self.sent_to.values())


HEADER_BYTES = 52       # a loopback packet's IPv4 and TCP headers (with timestamps), counted by the interface


class WireWatch:
    """The launching process's side of the fences (harness/fence.py): a thread that answers each rank's
    request after reading the kernel's counts of its connections, and keeps the readings. `diag`: a sock_diag
    socket of the ranks' network namespace; `sandboxed`: the ranks' pids are a PID namespace's, found here by
    their namespace's pid (NSpid) and the network namespace of `diag`."""

    def __init__(self, run_dir: Path, *, sandboxed: bool, poll_s: float = 0.002):
        import threading
        self.folder = Path(run_dir) / "wire"
        self.folder.mkdir(exist_ok=True)
        for old in self.folder.iterdir():
            old.unlink(missing_ok=True)
        if sandboxed and os.geteuid() == 0:     # the ranks write their requests as the sandbox's user
            from lab_src.harness.sandbox import grading_uid
            uid = grading_uid(Path(run_dir))
            os.chown(self.folder, uid, uid)
        self.diag, self.sandboxed, self.poll_s = None, sandboxed, poll_s
        self.netns = None
        self.attached = False
        self.readings: dict[int, list[tuple[str, Reading]]] = {}
        self.owner: dict[tuple, int] = {}         # endpoint -> the inode of the rank's socket that last had it
        self.holders: dict[int, set] = {}         # socket inode -> the ranks whose descriptors held it at a reading
        self.pids: dict[int, int] = {}            # rank -> its pid here
        self.failed: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="wire-watch")
        self._thread.start()

    def attach(self, diag: socket.socket | None, why: str = "") -> None:
        """Start answering, reading through `diag` (None: it could not be had; the fences are answered unread)."""
        self.diag = diag
        if diag is None:
            self.failed = why or "no sock_diag socket of the ranks' network namespace"
        elif self.sandboxed:
            self.netns = _netns_inode(diag)
        self.attached = True

    # -- the thread
    def _run(self) -> None:
        while not self._done.is_set():
            if not self.attached:
                self._done.wait(self.poll_s)
                continue
            try:
                self._answer()
            except Exception as e:  # noqa: BLE001 - a watch that cannot read says so; the ranks go on
                self.failed = f"{type(e).__name__}: {e}"
            self._done.wait(self.poll_s)

    def _answer(self) -> None:
        pending = []
        for entry in os.scandir(self.folder):
            if entry.name.startswith(".") or entry.name.endswith(".ok"):
                continue
            try:
                rank, pid, number = (int(x) for x in entry.name.split("."))
            except ValueError:
                continue
            pending.append(((rank, pid, number), entry))
        snapshot: dict = {}         # one reading of the namespace for every request waiting now (its ranks are stopped)
        for (rank, _pid, _number), entry in sorted(pending, key=lambda p: p[0]):   # a rank's in the order asked
            try:
                request = json.loads(Path(entry.path).read_text())
                pid, what = int(request["pid"]), str(request["name"])[:40]
            except (ValueError, OSError, KeyError, TypeError):
                continue
            reading = self._read(rank, pid, snapshot)
            self.readings.setdefault(rank, []).append((what, reading))
            os.unlink(entry.path)
            Path(entry.path + ".ok").touch()

    def _read(self, rank: int, inner_pid: int, snapshot: dict | None = None) -> Reading:
        """The rank's reading. `snapshot`: the namespace's connections (and loopback) as one dump read them, shared by
        the requests answered together (filled here by the first of them)."""
        pid = self._pid(rank, inner_pid) if self.diag is not None else None
        if not pid:
            return Reading(time.monotonic(), unread=True)
        snapshot = {} if snapshot is None else snapshot
        if not snapshot:
            every = dump(self.diag)
            snapshot.update(
                at=time.monotonic(), everything={c.inode: c for c in every if c.inode},
                loopback=loopback_bytes(pid) if self.sandboxed else None,      # the namespace's: everyone's
                # each connection's other end as the sockets are now (ports are reused as connections close and
                # others open, so an endpoint names a socket only while it lives); whose it is, at count(): `holders`
                by_local={_host(c.local): c.inode for c in every if c.inode},
                namespace={(c.local, c.remote): (c.sent + c.retrans, c.segs_out) for c in every}
                if self.sandboxed else {})
        everything, by_local = snapshot["everything"], snapshot["by_local"]
        mine = socket_inodes(pid)
        reading = Reading(snapshot["at"], {i: c for i, c in everything.items() if i in mine}, snapshot["loopback"])
        for inode, conn in reading.conns.items():
            self.owner[_host(conn.local)] = inode
        for inode in mine:
            self.holders.setdefault(inode, set()).add(rank)
        reading.peers = {i: by_local.get(_host(c.remote)) for i, c in reading.conns.items()}
        reading.namespace = snapshot["namespace"]
        reading.io = process_io(pid)
        return reading

    def _peer(self, reading: Reading, inode: int, conn: Conn) -> int | None:
        """The rank at the other end of `conn`: the one rank whose descriptors held the other end's socket at one of
        its readings (a socket every rank holds, inherited from the agent that forked them, is the store's: no rank's);
        where the other end was never read, the rank whose socket last had that address."""
        other = reading.peers.get(inode) or self.owner.get(_host(conn.remote))
        holders = self.holders.get(other) if other else None
        return next(iter(holders)) if holders and len(holders) == 1 else None

    def _pid(self, rank: int, inner: int) -> int | None:
        if not self.sandboxed:
            self.pids[rank] = inner
            return inner
        known = self.pids.get(rank)
        if known and _inner_pid(known) == inner:
            return known
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _inner_pid(int(entry)) == inner and _netns_of(int(entry)) == self.netns:
                self.pids[rank] = int(entry)
                return int(entry)
        return None

    def stop(self) -> None:
        self.attached = True
        self._done.set()
        self._thread.join(timeout=5)
        try:
            self._answer()          # a request written as the watch stopped
        except Exception:  # noqa: BLE001
            pass

    # -- what the judges read
    def count(self, case: int, rank: int) -> WireCount | None:
        """The case's count for `rank`, or None where the rank left no reading of the case's start."""
        rows = self.readings.get(rank, [])
        names = [n for n, _ in rows]
        if f"start {case}" not in names:
            return None
        first = names.index(f"start {case}")
        last = names.index(f"end {case}") if f"end {case}" in names[first:] else None
        # the window after the end closes at the rank's next case, counted ("start") or not ("pass")
        nxt = next((i for i in range(first + 1, len(rows)) if names[i].startswith(("start ", "pass "))), len(rows))
        out = WireCount(readings=tuple(names[first:(last if last is not None else nxt - 1) + 1]))
        inside = rows[first:(last if last is not None else nxt - 1) + 1]
        out.io = tuple(r.io for _, r in inside)
        out.unread = sum(1 for _, r in inside if r.unread)
        for (_, a), (_, b) in zip(inside, inside[1:]):
            self._add(out, a, b, inside=True, rank=rank)
        if last is not None and nxt < len(rows):
            self._add(out, rows[last][1], rows[nxt][1], inside=False, rank=rank)
        return out

    @staticmethod
    def _delta(before: Conn | None, now: Conn) -> int:
        """What `now` sent since `before` (all it sent where it is new)."""
        return now.sent if before is None else max(0, now.sent - before.sent)

    def _add(self, out: WireCount, a: Reading, b: Reading, inside: bool, rank: int) -> None:
        for inode, conn in b.conns.items():
            sent = self._delta(a.conns.get(inode), conn)
            peer = self._peer(b, inode, conn)
            if peer == rank:
                continue                # gloo's connection of a rank to itself
            if peer is None:
                out.other_sent += sent if inside else 0
            elif inside:
                out.sent_to[peer] = out.sent_to.get(peer, 0) + sent
            else:
                out.after += sent

    def unseen(self, case: int, ranks) -> tuple[int, int] | None:
        """The bytes the sandbox's loopback carried from the first rank's start of `case` to the last one's end that
        no TCP socket of the namespace accounts for (their headers estimated): a connection opened and closed between
        two readings, or traffic that is not TCP; and all it carried. None outside a sandbox or without readings."""
        readings = []
        for rank in ranks:
            rows = self.readings.get(rank, [])
            names = [n for n, _ in rows]
            if f"start {case}" not in names or f"end {case}" not in names:
                return None
            readings += [r for _, r in rows[names.index(f"start {case}"):names.index(f"end {case}") + 1]]
        readings.sort(key=lambda r: r.at)
        if not readings or any(r.loopback is None for r in readings):
            return None
        carried = readings[-1].loopback - readings[0].loopback
        explained = 0
        for a, b in zip(readings, readings[1:]):
            for key, (sent, segs) in b.namespace.items():
                was = a.namespace.get(key, (0, 0))
                explained += max(0, sent - was[0]) + HEADER_BYTES * max(0, segs - was[1])
        return max(0, carried - explained), carried


def _inner_pid(pid: int) -> int | None:
    """A process's pid in its own PID namespace (the last of NSpid)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def _netns_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _netns_inode(diag: socket.socket) -> int | None:
    """The network namespace `diag` belongs to (SIOCGSKNS gives a descriptor of it)."""
    import fcntl
    try:
        fd = fcntl.ioctl(diag.fileno(), 0x894C)
    except OSError:
        return None
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)
