"""The process nbgrader knows as its kernel when the kernel comes from the sandbox's fork server.

    python -I -S grader/kernel_shim.py SOCKET REQUEST_JSON

It asks the fork server (lab_src/harness/kernel_zygote.py) listening on SOCKET for a kernel, then lives
exactly as long as that kernel: it exits with the kernel's exit code, passes SIGTERM, SIGINT and SIGHUP
on, and if it is killed outright its connection closes and the server kills the kernel. So nbgrader's
kernel manager polls, signals and kills it as it would the kernel itself. Standard library only: it
starts in a few milliseconds.
"""
import signal
import socket
import sys

NAMES = {signal.SIGTERM: "TERM", signal.SIGINT: "INT", signal.SIGHUP: "KILL"}


def main(path: str, request: str) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    for sig, name in NAMES.items():
        signal.signal(sig, lambda signum, frame, name=name: conn.sendall(f"{name}\n".encode()))
    conn.sendall(request.encode() + b"\n")
    for line in conn.makefile("r"):
        if line.startswith("EXIT "):
            return int(line.split()[1]) % 256
    return 1                                # the server is gone, and its kernels with it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
