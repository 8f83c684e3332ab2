"""A fork server for the kernels nbgrader starts to execute one student's notebooks in the grading sandbox.

    python -m lab_src.harness.kernel_zygote SOCKET     # inside the sandbox; grader/kernel_sandbox.py starts it

Starting a kernel costs about two seconds of CPU, most of it importing torch, matplotlib and ipykernel;
autograding runs one kernel per notebook, fifteen per student. This process imports them once, says
READY on its standard output, then listens on the Unix socket SOCKET. Each connection asks for one
kernel with a line of JSON ({"connection_file", "env", "cwd"}); the server forks it (a session of its
own, the environment it asked for, in its notebook's folder `cwd` (one of the sandbox's writable folder's,
default that folder), output to the server's standard error) and writes `EXIT <code>` when
it ends. On the connection, a line `TERM`, `INT` or `KILL` signals the kernel; a connection that
closes before its kernel ended (the process at its other end was killed) kills it. Whenever a kernel
ends, every other process left in the sandbox but the live kernels is killed, as a sandbox of its own
per kernel would have been. The server ends when its standard input closes (the grader's side ended).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import traceback

from lab_src.harness.zygote import clear_namespace, non_dumpable

SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "KILL": signal.SIGKILL}


def _kernel(request: dict, base_env: dict) -> int:
    """In the forked child: run an ipykernel on the request's connection file until it shuts down."""
    os.setsid()                         # the server keeps Python's own signal handlers: nothing to restore
    os.environ.clear()
    os.environ.update({**base_env, **request.get("env", {})})
    if request.get("cwd"):
        os.chdir(request["cwd"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    from ipykernel import kernelapp
    try:
        kernelapp.launch_new_instance(argv=["-f", request["connection_file"]])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    return 0


def _fork_kernel(request: dict, base_env: dict, inherited: list) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for s in inherited:
            s.close()
        code = _kernel(request, base_env)
    except BaseException:  # noqa: BLE001 - whatever happened, this process ends here
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _preload() -> None:
    """What most notebooks import, imported once (pyplot is not: the kernel picks its own backend)."""
    import IPython  # noqa: F401
    import ipykernel.kernelapp  # noqa: F401
    import matplotlib  # noqa: F401
    import matplotlib.figure  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401

    import lab_src.checks  # noqa: F401
    import lab_src.views  # noqa: F401


def serve(path: str) -> int:
    non_dumpable()
    _preload()
    base_env = dict(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    kernels: dict[int, socket.socket | None] = {}   # pid -> its connection (None once that closed)
    clients: dict[socket.socket, int | None] = {}   # connection -> its kernel, once asked for
    buffers: dict[socket.socket, bytes] = {}
    keep = {1, os.getpid()}
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    while True:
        for key, _ in sel.select(timeout=0.1):
            if key.data == "stdin":
                if not os.read(sys.stdin.fileno(), 4096):
                    clear_namespace(keep)
                    return 0
            elif key.data == "accept":
                conn, _ = listener.accept()
                clients[conn], buffers[conn] = None, b""
                sel.register(conn, selectors.EVENT_READ, "client")
            else:
                conn = key.fileobj
                chunk = conn.recv(4096)
                pid = clients[conn]
                if not chunk:                           # the other end is gone: so is its kernel
                    sel.unregister(conn)
                    conn.close()
                    del clients[conn], buffers[conn]
                    if pid is not None and pid in kernels:
                        _signal(pid, signal.SIGKILL)
                        kernels[pid] = None
                    continue
                buffers[conn] += chunk
                while b"\n" in buffers[conn]:
                    line, buffers[conn] = buffers[conn].split(b"\n", 1)
                    if clients[conn] is None:
                        pid = _fork_kernel(json.loads(line), base_env, [listener, *clients])
                        clients[conn], kernels[pid] = pid, conn
                    elif line.decode().strip() in SIGNALS:
                        _signal(clients[conn], SIGNALS[line.decode().strip()])
        _reap(kernels, keep)


def _signal(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(kernels: dict, keep: set[int]) -> None:
    ended = False
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if pid not in kernels:
            continue                                    # a process a kernel left behind, reparented here
        conn, ended = kernels.pop(pid), True
        if conn is not None:                            # None: its connection closed first
            try:
                conn.sendall(f"EXIT {os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
    if ended:
        live = set(kernels)
        clear_namespace(keep, spare=lambda pid: _session(pid) in live)
        for pid in [p for p in kernels if _session(p) is None]:    # reaped by clear_namespace as it ended
            conn = kernels.pop(pid)
            if conn is not None:
                try:
                    conn.sendall(b"EXIT -9\n")
                except OSError:
                    pass


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


if __name__ == "__main__":
    code = serve(sys.argv[1])
    os._exit(code)
