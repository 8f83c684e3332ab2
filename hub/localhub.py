"""The lab's local course hub: JupyterHub, configurable-http-proxy, PAM with real Unix accounts, one
Unix user per JupyterLab server, and nbgrader's exchange for one course.

    make hub                                   # = sudo .venv/bin/python hub/localhub.py
    .venv/bin/python hub/localhub.py --port 8000 --cpus 0

As root: builds the single-user environment (hub/setup.sh, cached), creates the test accounts (one
instructor, two students, with the passwords printed), the exchange, the instructor's course folder
and copy of this repository, releases the assignment through the exchange, starts the hub, prints the
URL and the accounts, and stops everything on Ctrl-C. tests/test_hub.py drives the same class.
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
HUB = ROOT / "hub"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from grader.course import COURSE_ID, IGNORE  # noqa: E402


@dataclass(frozen=True)
class Account:
    name: str
    password: str
    role: str          # "instructor" or "student"

    @property
    def home(self) -> Path:
        return Path(pwd.getpwnam(self.name).pw_dir)

    @property
    def uid(self) -> int:
        return pwd.getpwnam(self.name).pw_uid

    @property
    def gid(self) -> int:
        return pwd.getpwnam(self.name).pw_gid


DEFAULT_ACCOUNTS = (
    Account("pplab-teacher", "teach-pp-lab", "instructor"),
    Account("pplab-ana", "ana-pp-lab", "student"),
    Account("pplab-ben", "ben-pp-lab", "student"),
)

# What a student's nbgrader does (the Assignments panel) and the instructor's nbgrader commands inherit.
NBGRADER_CONFIG = '''\
# Written by hub/localhub.py for the course hub: every user's nbgrader reads it (JUPYTER_CONFIG_PATH).
c = get_config()
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {exchange!r}
# answers/ and runs/ (what the %%answer cells and the checks write beside the notebooks) are not submitted:
# the grader reads the answer cells of the notebooks themselves
c.CourseDirectory.ignore = {ignore!r}
# A submission that lacks a notebook, or made while a check runs, is refused: hub/lab_submit.py follows.
c.ExchangeSubmit.strict = True
'''


def nbgrader_config(exchange: Path | str) -> str:
    """The nbgrader_config.py every user of the hub reads: course, exchange, and hub/lab_submit.py."""
    return (NBGRADER_CONFIG.format(course_id=COURSE_ID, exchange=str(exchange), ignore=IGNORE)
            + "\n# ---- hub/lab_submit.py\n" + (HUB / "lab_submit.py").read_text()
            + "\n\nc.ExchangeFactory.submit = LabSubmit\n")


# nbgrader's instructor pages are of no use to students: hidden from them, shown to the instructor
INSTRUCTOR_EXTENSIONS = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                         "@jupyter/nbgrader:course-list"]


def free_port(count: int = 1) -> int:
    """A port p with p..p+count-1 free on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + count >= 65535:
            continue
        ok = True
        for p in range(port, port + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError("no free ports")


def build_environment() -> Path:
    """hub/setup.sh: the single-user environment and the proxy (cached); returns HUB_HOME."""
    proc = subprocess.run([str(HUB / "setup.sh")], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"hub/setup.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


class LocalHub:
    def __init__(self, state: Path, home: Path, accounts=DEFAULT_ACCOUNTS, port: int | None = None,
                 cpus: str | None = None, spawner_env: dict | None = None):
        self.state = Path(state)
        self.home = Path(home)
        self.venv = self.home / "venv"
        self.accounts = tuple(accounts)
        self.port = port or free_port(3)
        self.cpus = cpus
        self.spawner_env = spawner_env or {}
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    # ---- accounts ------------------------------------------------------------------------------
    @property
    def instructor(self) -> Account:
        return next(a for a in self.accounts if a.role == "instructor")

    @property
    def students(self) -> list[Account]:
        return [a for a in self.accounts if a.role == "student"]

    def create_accounts(self) -> None:
        """Real Unix accounts (idempotent): home folders of mode 700, the passwords PAM checks."""
        for a in self.accounts:
            try:
                pwd.getpwnam(a.name)
            except KeyError:
                run(["useradd", "--create-home", "--shell", "/bin/bash", a.name])
            run(["chpasswd"], input=f"{a.name}:{a.password}\n")
            os.chmod(a.home, 0o700)

    def remove_accounts(self) -> None:
        for a in self.accounts:
            try:
                pwd.getpwnam(a.name)
            except KeyError:
                continue
            self.kill_user_processes(a)
            subprocess.run(["userdel", "--remove", a.name], capture_output=True)

    # ---- the course ------------------------------------------------------------------------------
    @property
    def exchange(self) -> Path:
        return self.state / "exchange"

    @property
    def config_dir(self) -> Path:
        return self.state / "etc" / "jupyter"

    @property
    def checkout(self) -> Path:
        """The instructor's own copy of this repository (solutions/ and grader/ stay out of students' reach)."""
        return self.instructor.home / "pp-lab"

    @property
    def course(self) -> Path:
        return self.instructor.home / "course"

    def prepare(self) -> None:
        """State folder, nbgrader's config and exchange, the instructor's checkout and course folder."""
        self.state.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state, 0o755)
        self.config_dir.mkdir(parents=True, exist_ok=True)
        (self.config_dir / "nbgrader_config.py").write_text(nbgrader_config(self.exchange))
        labconfig = self.config_dir / "labconfig"
        labconfig.mkdir(exist_ok=True)
        (labconfig / "page_config.json").write_text(json.dumps(
            {"disabledExtensions": {name: True for name in INSTRUCTOR_EXTENSIONS}}, indent=1))
        for d in (self.state / "etc", self.config_dir, labconfig):
            os.chmod(d, 0o755)
        # nbgrader's documented exchange: one folder every user can write (`chmod ugo+rw`);
        # nbgrader itself gives each course's inbound/outbound/feedback folders their modes
        self.exchange.mkdir(exist_ok=True)
        os.chmod(self.exchange, 0o777)
        self._instructor_files()

    def _instructor_files(self) -> None:
        inst = self.instructor
        if self.checkout.exists():
            shutil.rmtree(self.checkout)
        files = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT).stdout.split("\0")
        for rel in filter(None, files):
            src = ROOT / rel
            if src.is_file():
                dest = self.checkout / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
        self.course.mkdir(exist_ok=True)
        # the instructor re-enables nbgrader's instructor pages for themself
        labconfig = inst.home / ".jupyter" / "labconfig"
        labconfig.mkdir(parents=True, exist_ok=True)
        (labconfig / "page_config.json").write_text(json.dumps(
            {"disabledExtensions": {name: False for name in INSTRUCTOR_EXTENSIONS}}, indent=1))
        run(["chown", "-R", f"{inst.uid}:{inst.gid}", str(self.checkout), str(self.course),
             str(inst.home / ".jupyter")])

    # ---- running things as a user -------------------------------------------------------------
    def user_env(self, account: Account) -> dict:
        return {"HOME": str(account.home), "USER": account.name, "LOGNAME": account.name, "SHELL": "/bin/bash",
                "PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                "JUPYTER_CONFIG_PATH": str(self.config_dir)}

    def as_user(self, account: Account, cmd: list[str], cwd: Path | None = None, timeout: float = 900,
                env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """Run cmd as the account (setpriv: its uid, gid and groups), with a clean environment."""
        full = ["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}", "--init-groups", "--reset-env", "--",
                "env", *[f"{k}={v}" for k, v in {**self.user_env(account), **(env or {})}.items()], *cmd]
        proc = subprocess.run(full, cwd=cwd or account.home, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} as {account.name} failed ({proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
        return proc

    def grader(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        """`python -m grader --course ~/course ARGS` as the instructor, from their checkout. The reference
        answers go to the instructor's own cache (~/.cache/pp-lab, mode 0700); students' code runs in
        bubblewrap sandboxes in unprivileged user namespaces (hub/README.md)."""
        return self.as_user(self.instructor, [str(self.venv / "bin" / "python"), "-m", "grader", "--course",
                                              str(self.course), *args], cwd=self.checkout, timeout=timeout, check=check)

    def assignments(self) -> list[str]:
        """The assignments the instructor's course hands out (its course.toml, else every module)."""
        from grader.plan import load
        return list(load(self.course).modules)

    def release(self) -> str:
        """The instructor releases every assignment of the course into the exchange (generate_assignment,
        release_assignment, once per assignment)."""
        return self.grader("release", "--exchange").stdout

    # ---- the hub -------------------------------------------------------------------------------
    def start(self, timeout_s: float = 120) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PP_LAB_", "JUPYTER", "VIRTUAL_ENV"))}
        env.update({"PP_LAB_HUB_HOME": str(self.home), "PP_LAB_HUB_STATE": str(self.state),
                    "PP_LAB_HUB_PORT": str(self.port),
                    "PP_LAB_HUB_USERS": " ".join(a.name for a in self.accounts),
                    "PP_LAB_HUB_ADMINS": self.instructor.name,
                    "PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"})
        if self.cpus:
            env["PP_LAB_HUB_CPUS"] = self.cpus
        if self.spawner_env:
            env["PP_LAB_HUB_SPAWNER_ENV"] = " ".join(f"{k}={v}" for k, v in self.spawner_env.items())
        log = open(self.state / "jupyterhub.log", "ab")
        self.proc = subprocess.Popen([str(self.venv / "bin" / "jupyterhub"), "-f", str(HUB / "jupyterhub_config.py")],
                                     cwd=self.state, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterHub exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/hub/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"JupyterHub did not answer within {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        path = self.state / "jupyterhub.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def processes(self) -> list[psutil.Process]:
        """Everything this hub runs: the hub's process group, the proxy, and every process of its accounts."""
        uids = {a.uid for a in self.accounts if _exists(a.name)}
        found = []
        for p in psutil.process_iter(["uids", "cmdline", "pid"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                if p.info["uids"].real in uids or (str(self.state) in cmd and p.pid != os.getpid()):
                    found.append(p)
                elif self.proc and os.getpgid(p.pid) == self.proc.pid:
                    found.append(p)
            except (psutil.Error, OSError, TypeError):
                continue
        return found

    def kill_user_processes(self, account: Account) -> None:
        procs = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == account.uid]
        _terminate(procs)

    def stop(self) -> None:
        """SIGTERM to the hub (it stops the users' servers and the proxy), then end whatever is left."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        _terminate(self.processes())


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _terminate(procs: list[psutil.Process], grace_s: float = 5) -> None:
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="hub/localhub.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8000, help="the hub's URL port on 127.0.0.1 (and the next two)")
    ap.add_argument("--state", type=Path, help="runtime folder (default: HUB_HOME/state)")
    ap.add_argument("--cpus", help="pin every user's server to these cores (taskset list, e.g. 0 or 0-1)")
    ap.add_argument("--no-release", action="store_true", help="do not release the assignment into the exchange")
    ap.add_argument("--remove-accounts", action="store_true", help="delete the test accounts and their homes, then exit")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("the local hub creates Unix accounts and starts servers as them: run it as root (sudo make hub)")
    home = build_environment()
    hub = LocalHub(args.state or home / "state", home, port=args.port, cpus=args.cpus)
    if args.remove_accounts:
        hub.remove_accounts()
        print("removed " + ", ".join(a.name for a in hub.accounts))
        return 0
    hub.create_accounts()
    hub.prepare()
    if not args.no_release:
        print(f"releasing {', '.join(hub.assignments())} into the exchange as the instructor ...", flush=True)
        hub.release()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        hub.start()
        print(f"\nThe course hub runs at {hub.url}/  (course {COURSE_ID}, assignments {', '.join(hub.assignments())}: "
              f"students fetch each in the Assignments panel; {hub.course}/course.toml chooses them)")
        for a in hub.accounts:
            print(f"  {a.role:<10}  user {a.name:<14}  password {a.password}")
        py = hub.venv / "bin" / "python"
        print(f"exchange: {hub.exchange}\ninstructor's course folder: {hub.course}\n"
              f"grade as the instructor (in their JupyterLab's terminal, or after `su - {hub.instructor.name}`):\n"
              f"  export JUPYTER_CONFIG_PATH={hub.config_dir}   # already set in the hub's terminals\n"
              f"  cd {hub.checkout}\n"
              f"  {py} -m grader --course {hub.course} collect --exchange\n"
              f"  {py} -m grader --course {hub.course} autograde --jobs 2\n"
              f"  {py} -m grader --course {hub.course} feedback --release\n"
              f"log: {hub.state / 'jupyterhub.log'}\nCtrl-C stops the hub and every server.", flush=True)
        while not stop and hub.proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping the hub ...", flush=True)
        hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
