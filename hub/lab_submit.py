# nbgrader's submit for the lab's course hub (appended to the hub's nbgrader_config.py by localhub.py, so
# every user's server has it without installing anything; `c.ExchangeFactory.submit = LabSubmit` follows).
# With ExchangeSubmit.strict it refuses, with a plain message and touching nothing, a submission that
#  - lacks a notebook of the release (renamed, moved or deleted): it would replace a complete earlier one;
#  - is made while one of the student's checks is still running in the assignment folder: the submission
#    would hold the notebooks as last saved, not what the check is testing.
import os as _os
import time as _time

from nbgrader.exchange.default.submit import ExchangeSubmit as _ExchangeSubmit
from nbgrader.utils import find_all_notebooks as _notebooks

_NOTHING_CHANGED = "Nothing was changed: your files and your earlier submissions stay as they were."


def check_process(cmd, cwd):
    """Whether a process is one of a running check's: a torchrun launch, or the elastic agent and ranks
    that the kernel's warm launcher forks (they carry its command line, lab_src.harness.warm, and work in
    the check's run folder, runs/qNN-...; the warm launcher itself, always there, works elsewhere)."""
    return "torch.distributed.run" in cmd or (
        "lab_src.harness.warm" in cmd and _os.path.basename(_os.path.dirname(cwd)) == "runs")


def running_checks(folder):
    """[(exercise, seconds running)] of this user's checks working under folder, one per run folder."""
    import psutil
    folder = _os.path.realpath(folder) + _os.sep
    found = {}
    for p in psutil.process_iter(["uids", "cmdline", "cwd", "create_time"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            cwd = _os.path.realpath(p.info["cwd"] or "/")
            if p.info["uids"].real == _os.getuid() and check_process(cmd, cwd) and cwd.startswith(folder):
                since = _time.time() - p.info["create_time"]
                found[cwd] = (_os.path.basename(cwd).split("-")[0], max(since, found.get(cwd, ("", 0))[1]))
        except Exception:  # noqa: BLE001 - a process that ended or cannot be read is not a running check
            continue
    return list(found.values())


class LabSubmit(_ExchangeSubmit):
    def check_filename_diff(self):
        if self.strict:
            running = running_checks(self.src_path)
            if running:
                self.fail(
                    "NOT SUBMITTED.\nA check is still running ({}).\nA submission holds your notebooks as last "
                    "saved, not what the check is testing:\nwait for it to finish, save your notebooks "
                    "(File > Save All) and submit again.\n{}".format(
                        ", ".join("{} for {:.0f} s".format(q, s) for q, s in running), _NOTHING_CHANGED))
            released, mine = set(_notebooks(self.release_path)), set(_notebooks(self.src_path))
            missing = sorted(released - mine)
            extra = sorted(n for n in mine - released if ".ipynb_checkpoints" not in n)
            if missing:
                self.fail(
                    "NOT SUBMITTED.\nThese notebooks of {a} are not in your {a} folder: {m}.\n{e}Rename or move "
                    "them back (a fresh copy of every notebook is in {r})\nand submit again.\n{n}".format(
                        a=self.coursedir.assignment_id, m=", ".join(missing), r=self.release_path, n=_NOTHING_CHANGED,
                        e=("Notebooks that are not part of the assignment (renamed?): " + ", ".join(extra) + ".\n"
                           if extra else "")))
        super().check_filename_diff()
