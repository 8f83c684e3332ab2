"""The sandbox every grading launch runs in: bubblewrap (`bwrap`), limits, and an unprivileged user.

    cmd = sandbox.wrap(torchrun_command(...), writable=run_dir, env={...})

Inside, a process sees:
- the system (/usr and its links), the Python it runs on and the project's environment, read-only;
- the package `lab_src` alone, read-only, at /opt/pp-lab/lab_src (not the checkout: no solutions/,
  no grader/, no course folder, no reference cache);
- one writable folder, the launch's run folder, and a private /tmp; nothing else of the machine.
It has no network (a private network namespace with loopback only, enough for gloo), a private PID
namespace (killing the sandbox kills every process in it, however it was started), a clean
environment, limits on processes, memory, file size and CPU time, and, when the grader runs as root,
an unprivileged uid of the launch's own (setpriv; see `grading_uid`). The run folder is the only channel back: the launching process reads
the files it wants from it, with size limits; verdicts never pass through it.

Grading refuses to run without a sandbox (on macOS, say) unless the instructor says
`--unsafe-no-sandbox`, and then every report says so (`grader/autograde.py`).
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# As root, each launch runs as a uid of its own from this range (no account needed), so that the process
# limit (counted per uid) of one student's launch is not shared with another's running at the same time.
UIDS = range(200_000, 1_200_000)
INSIDE = Path("/opt/pp-lab")          # where lab_src is bound, and what PYTHONPATH names


@dataclass(frozen=True)
class Limits:
    processes: int = 512               # RLIMIT_NPROC counts the threads of the launch's uid: torch and gloo start many
    memory_bytes: int = 16 << 30       # address space per process
    file_bytes: int = 512 << 20        # the largest file a process may write
    cpu_s: int = 1800                  # CPU seconds per process
    open_files: int = 4096
    tmp_bytes: int = 256 << 20         # the private /tmp: a tmpfs of this size (bwrap --size), a hard cap
    disk_bytes: int = 1 << 30          # all files in the writable folder together (`disk_usage`): a case that
                                       # leaves more fails (harness/worker.py, `over_disk_limit`); the runner's
    disk_stop_factor: int = 2          # watch stops a launch still writing at this many times the limit


class SandboxUnavailable(RuntimeError):
    pass


def bwrap() -> str | None:
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """True when a trial sandbox starts and runs Python here (bwrap installed, namespaces allowed)."""
    if bwrap() is None or sys.platform != "linux":
        return False
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"pp-lab-sandbox-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        _own(probe)
        cmd = wrap([sys.executable, "-c", "import lab_src, sys; sys.exit(0)"], writable=probe)
        return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def describe_unavailable() -> str:
    if sys.platform != "linux":
        return f"bubblewrap sandboxes need Linux; this is {sys.platform}"
    if bwrap() is None:
        return ("bubblewrap (bwrap), the sandbox the grading runs students' code in, is not installed: install it "
                "once as root, `sudo apt-get install bubblewrap` (as root, make demo and make test install it)")
    return "bwrap is installed but could not start a sandbox here (user namespaces disabled?)"


def grading_uid(folder: Path) -> int:
    """The uid a launch in `folder` runs as (when the grader is root): one per run folder."""
    digest = hashlib.sha256(str(Path(folder).resolve()).encode()).digest()
    return UIDS.start + int.from_bytes(digest[:8], "big") % len(UIDS)


def _own(folder: Path) -> None:
    """As root, hand the writable folder itself to the sandbox's user. What is already in it (the
    spec, the inputs) stays root's: readable, not writable, from inside."""
    if os.geteuid() == 0:
        uid = grading_uid(folder)
        os.chown(folder, uid, uid, follow_symlinks=False)


def prepare(folder: Path) -> None:
    """Make `folder` the sandbox's writable folder (called before each launch)."""
    folder.mkdir(parents=True, exist_ok=True)
    _own(folder)


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    args += ["--perms", "0755", "--dir", "/etc"]
    # fonts: matplotlib asks fontconfig for system fonts the first time it draws, and without its config
    # "Fontconfig error: Cannot load default config file" lands under every timeline in the feedback
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf",
                 "localtime", "hosts", "fonts"):
        path = Path("/etc") / name
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    return args


def _dirs_for(path: Path) -> list[str]:
    """bwrap creates missing mount points mode 0700; make each parent of `path` traversable (0755)."""
    args = []
    for parent in reversed(path.parents):
        if str(parent) != "/":
            args += ["--perms", "0755", "--dir", str(parent)]
    return args


def _python_binds() -> list[str]:
    """The interpreter's installation and the environment (venv) it runs in, read-only, where they are."""
    roots = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    exe = Path(sys.executable)
    roots.add(exe.resolve().parent.parent)
    args = []
    for root in sorted(roots):
        if str(root).startswith("/usr"):
            continue
        args += _dirs_for(root) + ["--ro-bind", str(root), str(root)]
    if Path(sys.prefix) != Path(sys.prefix).resolve():       # a venv reached through a link
        args += _dirs_for(Path(sys.prefix)) + ["--symlink", str(Path(sys.prefix).resolve()), sys.prefix]
    return args


def disk_usage(folder: Path) -> int:
    """Bytes the files under `folder` take on disk (links not followed): what a sandbox wrote there."""
    total = 0
    for root, dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def remove_large_files(folder: Path, above: int) -> int:
    """Delete every file under `folder` larger than `above` bytes (nothing the lab writes is): what a
    student's code left. Returns the bytes freed."""
    freed = 0
    for root, dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
                if st.st_size > above or st.st_blocks * 512 > above:
                    os.unlink(path)
                    freed += st.st_blocks * 512
            except OSError:
                pass
    return freed


def disk_limit_message(qid: str | None, used: int, limit: int) -> str:
    who = f"the answer to {qid}" if qid else "an answer loading"
    return (f"disk limit: {who} wrote {describe_bytes(used)} into the grading folder; the limit is "
            f"{describe_bytes(limit)} for all of a submission's files together (what it wrote was deleted)")


def describe_bytes(n: int) -> str:
    return f"{n / (1 << 30):.1f} GB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MB"


def package_dir() -> Path:
    return Path(__file__).resolve().parents[1]


def wrap(cmd: list[str], *, writable: Path, env: dict | None = None, limits: Limits = Limits(),
         read_only: tuple = (), also_writable: tuple = ()) -> list[str]:
    """`cmd` run in a sandbox whose writable folder is `writable` (also its working directory). The
    nbgrader kernel (grader/kernel_sandbox.py) also needs its socket folder writable and the grader's
    timeline pictures readable: `also_writable` and `read_only` bind those at their own paths."""
    if bwrap() is None:
        raise SandboxUnavailable(describe_unavailable())
    writable = Path(writable).resolve()
    root = os.geteuid() == 0
    # As root: no user namespace, so that setpriv can drop to nobody for real. Otherwise an
    # unprivileged user namespace, in which the process keeps our uid and has no capabilities.
    spaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"] if root \
        else ["--unshare-all"]
    args = [bwrap(), *spaces, "--hostname", "localhost", "--die-with-parent", "--new-session", "--clearenv",
            *_system_binds(), "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(limits.tmp_bytes),
            "--tmpfs", "/tmp",
            # the sandbox's own /dev/shm: the elastic agent's queues to its ranks are POSIX semaphores
            "--perms", "1777", "--size", str(64 << 20), "--tmpfs", "/dev/shm",
            *_python_binds(),
            *_dirs_for(INSIDE / "lab_src"), "--ro-bind", str(package_dir()), str(INSIDE / "lab_src"),
            *_dirs_for(writable), "--bind", str(writable), str(writable)]
    for path in map(lambda p: Path(p).resolve(), read_only):
        args += [*_dirs_for(path), "--ro-bind", str(path), str(path)]
    for path in map(lambda p: Path(p).resolve(), also_writable):
        args += [*_dirs_for(path), "--bind", str(path), str(path)]
    args += ["--chdir", str(writable)]
    variables = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(INSIDE),
                 "HOME": str(writable), "TMPDIR": "/tmp", "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1",
                 "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8", **(env or {})}
    for key, value in variables.items():
        args += ["--setenv", key, str(value)]
    uid = grading_uid(writable)
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all"] if root else []
    prlimit = ["prlimit", f"--nproc={limits.processes}", f"--as={limits.memory_bytes}",
               f"--fsize={limits.file_bytes}", f"--cpu={limits.cpu_s}", f"--nofile={limits.open_files}"]
    return [*args, *drop, *prlimit, *cmd]
