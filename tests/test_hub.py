"""The whole course round trip on a real JupyterHub, two students at once, in headless Chromium.

hub/localhub.py starts the course hub as `make hub` does: JupyterHub 6.1.1 with configurable-http-proxy
5.3.0, PAM with Unix accounts this test creates (one instructor, two students), the local process
spawner (each JupyterLab runs as its own user, on 127.0.0.1), the single-user environment of
hub/setup.sh, and nbgrader's exchange for the course. Then:

1. the instructor releases the assignment into the exchange (`python -m grader release --exchange`);
2. both students log in and fetch it in JupyterLab's Assignments panel;
3. both open Q5 and Q8, write answers (Ana: Q5 right, Q8 wrong; Ben: Q5 wrong, Q8 right) and run the
   checks at the same time: real torchrun processes, each under its student's Unix user, overlapping;
   Ben's Q8 check passes and he sees the timeline; Ana's Q8 check fails with its message;
4. Ana first tries to submit with Q9 renamed and Q10 moved out of the folder: refused, with the list of
   what is missing, nothing lost; she puts them back and submits after Q5, and again after Q8 (the later
   counts, the earlier stays in the exchange); Ben tries to submit while his Q8 check is still running:
   refused with the reason (his check goes on), and he submits once it is done;
5. the instructor collects, autogrades and releases feedback (`grader collect --exchange`, `autograde`,
   `feedback --release`), and each student's points are what their answers deserve;
6. both students fetch their feedback in the panel and open it in the browser: each sees their own only;
7. both log out: their servers, kernels and checks stop, and nothing of theirs is left running.

Processes, file owners and modes are checked along the way. Screenshots go to out/screenshots/hub/,
the wall time of each step to out/screenshots/hub/timings.json. Needs root (useradd, setuid spawner),
/usr/bin/chromium and npm; skips without them. Marked slow: `make test` runs it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import psutil
import pytest
from conftest import children_left

# its steps have deadlines of their own; the whole took 6 min on 2 cores at load 6 and 13 min at load 20-50
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "hub"))
SHOTS = ROOT / "out" / "screenshots" / "hub"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 240_000          # two cores shared by two JupyterLabs, their checks and Chromium: be patient


# ------------------------------------------------------------------------------------- the people
def flat(text: str) -> str:
    """Whitespace collapsed: nbgrader's log and the panel's dialog break and indent messages differently."""
    return " ".join(text.split())


def plans():
    """Ana and Ben: each carries one mistake of the sample cohort (grader/cohort/students.py), and what
    that mistake deserves is taken from the cohort's expectations, which tests/test_cohort.py checks."""
    from grader.cohort.students import COHORT, Student
    from grader.reference import reference_sources
    refs = {q: Path(p).read_text() for q, p in reference_sources().items()}
    cohort = {s.name: s for s in COHORT}
    late_extra, no_scale = cohort["elif"], cohort["ivo"]        # q05 extra layers last; q08 loss not divided
    done_before = {q: 1.0 for q in ("q02", "q03", "q04", "q06", "q07")}     # earlier weeks' work
    ana = Student("pphub-ana", "Q5 right, Q8 forgets to divide the loss by the number of micro-batches",
                  base="release", answers={"q05": refs["q05"], "q08": no_scale.answers["q08"]},
                  expect={**done_before, "q05": 1.0, "q08": no_scale.expected("q08")})
    ben = Student("pphub-ben", "Q5 gives the extra layers to the last stages, Q8 right",
                  base="release", answers={"q05": late_extra.answers["q05"], "q08": refs["q08"]},
                  expect={**done_before, "q05": late_extra.expected("q05"), "q08": 1.0})
    return refs, [ana, ben]


# ------------------------------------------------------------------------------------- timing, shots
class Steps:
    def __init__(self):
        self.t0 = time.monotonic()
        self.times: dict[str, float] = {}
        self._last = self.t0

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.times[name] = round(now - self._last, 1)
        self._last = now
        print(f"  {now - self.t0:6.1f} s  (+{self.times[name]:5.1f} s)  {name}", flush=True)


SETTLE = """async () => {
  await document.fonts.ready;
  await Promise.all([...document.images].map(img => img.decode().catch(() => null)));
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
}"""


def shot(page, name: str, saved: list[Path], full_page: bool = False) -> None:
    try:
        page.evaluate(SETTLE)
    except Exception:  # noqa: BLE001 - a page without fonts API (a plain HTML file) still gets its picture
        pass
    path = SHOTS / name
    page.screenshot(path=str(path), full_page=full_page)
    saved.append(path)


# ------------------------------------------------------------------------------------- processes
LAB = ("lab_src.harness.worker", "torch.distributed.run")


def check_process(cmd: str, cwd: str) -> bool:
    """A process of a running check: torchrun's, or the agent and ranks of a kernel's warm launcher
    (hub/lab_submit.py's test, which the submit refusal uses)."""
    return any(m in cmd for m in LAB) or ("lab_src.harness.warm" in cmd and os.path.basename(os.path.dirname(cwd)) == "runs")


class Sampler(threading.Thread):
    """Samples the process table: which users' torchrun processes run at once, who owns them."""

    def __init__(self, homes: dict[int, str]):
        super().__init__(daemon=True)
        self.homes = homes               # uid -> home of the students
        self.stop = threading.Event()
        self.overlap = False             # both students' checks seen running at one moment
        self.owners: dict[int, int] = {}  # uid -> count of their lab processes seen
        self.intruders: list[str] = []   # a lab process working in a student's home under another uid

    def run(self):
        while not self.stop.is_set():
            running = set()
            for p in psutil.process_iter(["uids", "cmdline", "cwd"]):
                try:
                    cmd = " ".join(p.info["cmdline"] or [])
                    uid, cwd = p.info["uids"].real, p.info["cwd"] or ""
                    if not check_process(cmd, cwd):
                        continue
                except (psutil.Error, TypeError):
                    continue
                for owner, home in self.homes.items():
                    if cwd.startswith(home + "/"):
                        if uid == owner:
                            running.add(uid)
                            self.owners[uid] = self.owners.get(uid, 0) + 1
                        else:
                            self.intruders.append(f"uid {uid} runs {cmd[:100]} in {cwd}")
            if len(running) >= 2:
                self.overlap = True
            time.sleep(0.1)


class SandboxWatch(threading.Thread):
    """Samples the grading sandboxes while the instructor autogrades: the fork server of each launch of
    the hidden tests (lab_src/harness/zygote.py) and the kernels nbgrader starts to execute the
    notebooks (grader/kernel_sandbox.py: forked by lab_src/harness/kernel_zygote.py): who owns them and whether they sit in a user namespace of
    their own (as a non-root instructor, bubblewrap makes an unprivileged one)."""

    def __init__(self, course: Path):
        super().__init__(daemon=True)
        self.course = str(course) + "/"                 # other people's grading on this machine is not ours
        self.stop = threading.Event()
        self.host_userns = os.readlink("/proc/self/ns/user")
        self.seen: dict[int, tuple[str, int, bool]] = {}   # pid -> (what, uid, in a user namespace of its own)

    def run(self):
        while not self.stop.is_set():
            for p in psutil.process_iter(["uids", "cmdline", "cwd"]):
                try:
                    cmd = p.info["cmdline"] or [""]
                    what = "hidden tests" if "lab_src.harness.zygote" in cmd else \
                        "nbgrader kernel" if {"ipykernel_launcher", "lab_src.harness.kernel_zygote"} & set(cmd) else None
                    if what and p.pid not in self.seen and "bwrap" not in cmd[0] \
                            and (p.info["cwd"] or "").startswith(self.course):
                        own_ns = os.readlink(f"/proc/{p.pid}/ns/user") != self.host_userns
                        self.seen[p.pid] = (what, p.info["uids"].real, own_ns)
                except (psutil.Error, OSError, TypeError):
                    continue
            time.sleep(0.5)


def user_processes(uids) -> list[str]:
    out = []
    for p in psutil.process_iter(["uids", "cmdline", "pid", "status"]):
        try:
            if p.info["uids"].real in uids and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} uid {p.info['uids'].real}: {' '.join(p.info['cmdline'] or [])[:120]}")
        except (psutil.Error, TypeError):
            continue
    return out


def check_processes(uids) -> list[str]:
    out = []
    for p in psutil.process_iter(["uids", "cmdline", "cwd", "pid"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if p.info["uids"].real in uids and check_process(cmd, p.info["cwd"] or ""):
                out.append(f"{p.pid} uid {p.info['uids'].real}: {cmd[:120]}")
        except (psutil.Error, TypeError):
            continue
    return out


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def owner(path: Path) -> str:
    import pwd
    return pwd.getpwuid(path.stat().st_uid).pw_name


# ------------------------------------------------------------------------------------- the browser
def login(page, hub, account) -> None:
    page.goto(f"{hub.url}/hub/login")
    page.fill("input#username_input", account.name)
    page.fill("input#password_input", account.password)
    page.click("#login_submit")


def wait_lab(page) -> None:
    page.wait_for_selector(".jp-LabShell", timeout=TIMEOUT_MS)
    page.wait_for_selector(".jp-DirListing-content", timeout=TIMEOUT_MS)


def assignments(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
    page.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
    page.wait_for_selector("text=Released assignments", timeout=60_000)


def panel_text(page) -> str:
    return page.locator("#nbgrader-assignment-list, .lm-DockPanel").first.inner_text()


def open_notebook(page, user: str, name: str, qid: str) -> None:
    """Double-click the notebook in JupyterLab's file browser (in pipeline_lab/), as a student would."""
    item = page.locator(".jp-DirListing-item", has_text=name)
    if not item.count():
        folder = page.locator(".jp-DirListing-item", has_text="pipeline_lab")
        for _ in range(20):                  # the listing may predate the fetch: refresh it
            if folder.count():
                break
            page.locator('[data-command="filebrowser:refresh"]').first.click()
            time.sleep(0.5)
        folder.first.dblclick()
        item.first.wait_for(timeout=60_000)
    item.first.dblclick()
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .cm-content",
                 has_text=f"%%answer {qid}").first.wait_for(timeout=TIMEOUT_MS)
    wait_kernel_idle(page, user)


SESSIONS = """async user => {   // cookie-authenticated API calls under JupyterHub need the XSRF token
  const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
  const r = await fetch(`/user/${user}/api/sessions`, {headers: {'X-XSRFToken': decodeURIComponent(xsrf)}});
  const j = await r.json();
  return Array.isArray(j) ? j.map(s => s.kernel) : [];
}"""


def wait_kernel_idle(page, user: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        kernels = page.evaluate(SESSIONS, user)
        shown = page.eval_on_selector_all(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator",
                                          "els => els.map(e => e.getAttribute('data-status'))")
        if kernels and all(k["execution_state"] == "idle" and k["connections"] for k in kernels) and "idle" in shown:
            return
        time.sleep(0.3)
    pytest.fail(f"{user}'s kernel was not idle within {timeout_s} s")


def write_answer(page, qid: str, text: str) -> None:
    """Select the answer cell's text and put the student's answer there (as a paste would)."""
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell",
                        has=page.locator(".cm-content", has_text=f"%%answer {qid}"))
    editor = cell.locator(".cm-content")
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(f"%%answer {qid}\n{text.strip()}\n")


def run_all(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


def save(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^File$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Save Notebook$")).click()


CHECK_DONE = r"""qid => {
  const cell = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell')]
    .find(c => (c.querySelector('.jp-InputArea-editor')?.textContent || '').includes(`check("${qid}")`));
  return !!cell && /\[\d+\]/.test(cell.querySelector('.jp-InputPrompt').textContent);
}"""


def wait_check(page, qid: str) -> str:
    """The text of every output of the notebook in view, once the check's cell has run: the text as the
    page holds it, not as drawn (JupyterLab skips drawing cells scrolled out of view, content-visibility:
    an output above the view has no innerText; the check's first line was missing so once)."""
    page.wait_for_function(CHECK_DONE, arg=qid, timeout=TIMEOUT_MS)
    return "\n".join(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output").all_text_contents())


def wait_on_disk(path: Path, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.3)
    pytest.fail(f"{path} does not hold the answer after saving")


def submit(page) -> None:
    assignments(page)
    page.get_by_role("button", name="Submit").click()


def wait_submitted(page, count: int) -> None:
    """The panel lists `count` submissions (nbgrader shows each one's timestamp)."""
    page.wait_for_function("""n => {
        const t = document.body.innerText; const i = t.indexOf('Submitted assignments');
        return i >= 0 && (t.slice(i).match(/\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d/g) || []).length >= n; }""",
                           arg=count, timeout=120_000)


# ------------------------------------------------------------------------------------- the test
def seed_earlier_work(account, refs) -> None:
    """What the student did in earlier weeks: Q2, Q3, Q4, Q6 and Q7 answered (their answer cells and the
    files those cells wrote), owned by the student as if written by their own kernel."""
    from lab_src.registry import EXERCISES
    folder = account.home / "pipeline_lab"
    (folder / "answers").mkdir(exist_ok=True)
    for qid in ("q02", "q03", "q04", "q06", "q07"):
        ex = EXERCISES[qid]
        path = folder / ex.notebook
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == ex.answer_cell:
                cell["source"] = f"%%answer {qid}\n" + refs[qid]
        path.write_text(json.dumps(nb, indent=1))
        (folder / "answers" / ex.answer_file).write_text(refs[qid])
    for p in [folder / "answers", *folder.rglob("*")]:
        os.chown(p, account.uid, account.gid)


def test_course_round_trip_on_a_hub(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("creates Unix accounts and a setuid spawner: needs root")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (scripts/system_deps.sh installs Debian's chromium)")
    if not shutil.which("npm") or not shutil.which("useradd"):
        pytest.skip("needs npm (configurable-http-proxy) and useradd")
    sync_api = pytest.importorskip("playwright.sync_api")
    from localhub import Account, LocalHub, build_environment

    steps = Steps()
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    saved: list[Path] = []
    home = build_environment()
    steps.done("single-user environment ready (hub/setup.sh, cached)")
    accounts = (Account("pphub-teacher", "teach-hub-test", "instructor"),
                Account("pphub-ana", "ana-hub-test", "student"), Account("pphub-ben", "ben-hub-test", "student"))
    state = home / "test-state"
    if state.exists():
        shutil.rmtree(state)
    hub = LocalHub(state, home, accounts=accounts)
    hub.remove_accounts()                         # a previous run that died: start from scratch
    refs, (ana_plan, ben_plan) = plans()
    browser = pw = None
    sampler = None
    try:
        hub.create_accounts()
        hub.prepare()
        inst, ana, ben = accounts
        from grader import plan as course_plan
        from lab_src.registry import MODULES
        # a course of two assignments: the core in the browser, the second one fetched and submitted with
        # nbgrader's own commands (two rows in the Assignments panel would make its buttons ambiguous here)
        second = "pipeline_training"
        os.chown(course_plan.write(hub.course, ["pipeline_lab", second]), inst.uid, inst.gid)
        # the core first (one row in the Assignments panel: its Fetch button is unambiguous); the second later
        out = hub.grader("release", "--exchange", "--assignment", "pipeline_lab").stdout
        assert "pipeline_lab released into nbgrader's exchange" in out
        steps.done("instructor: release into the exchange (generate_assignment + release_assignment)")
        hub.start()
        steps.done("hub up")

        homes = {a.uid: str(a.home) for a in (ana, ben)}
        sampler = Sampler(homes)
        sampler.start()
        pw = sync_api.sync_playwright().start()
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        pages = {}
        for a in (ana, ben):
            ctx = browser.new_context(viewport={"width": 1400, "height": 900})
            pages[a.name] = ctx.new_page()
            pages[a.name].on("dialog", lambda d: d.accept())    # "leave the page?" when opening the next notebook
        pa, pb = pages[ana.name], pages[ben.name]

        # ---- log in (both servers spawn at once), fetch the assignment in the Assignments panel
        pa.goto(f"{hub.url}/hub/login")
        shot(pa, "01_login.png", saved)
        login(pa, hub, ana)
        login(pb, hub, ben)
        wait_lab(pa)
        wait_lab(pb)
        steps.done("both students logged in, servers spawned")
        for a, page in ((ana, pa), (ben, pb)):
            assignments(page)
            page.get_by_role("button", name="Fetch").click()
            page.wait_for_selector("text=Downloaded assignments", timeout=60_000)
            page.get_by_role("button", name="Submit").wait_for(timeout=60_000)
        shot(pa, "02_ana_fetched.png", saved)
        steps.done("both fetched pipeline_lab in the Assignments panel")
        for a in (ana, ben):
            nbs = sorted((a.home / "pipeline_lab").glob("*.ipynb"))
            assert len(nbs) == len(MODULES["pipeline_lab"]) and all(owner(p) == a.name for p in nbs)
            assert mode(a.home) == 0o700
            seed_earlier_work(a, refs)

        # ---- Q5, both at once
        for a, page, plan in ((ana, pa, ana_plan), (ben, pb, ben_plan)):
            open_notebook(page, a.name, "q05_distribute_layers.ipynb", "q05")
            write_answer(page, "q05", plan.answers["q05"])
            save(page)
        for a, page in ((ana, pa), (ben, pb)):
            run_all(page)
        out_a, out_b = wait_check(pa, "q05"), wait_check(pb, "q05")
        for page in (pa, pb):
            save(page)
        assert "q05: all checks passed" in out_a, out_a
        assert "q05:" in out_b and "problem" in out_b and "all checks passed" not in out_b, out_b
        shot(pa, "03_ana_q05_passed.png", saved)
        shot(pb, "04_ben_q05_failed.png", saved)
        steps.done("Q5 answered and checked by both at once")
        for a, plan in ((ana, ana_plan), (ben, ben_plan)):
            answer = a.home / "pipeline_lab" / "answers" / "q05_distribute_layers.py"
            assert owner(answer) == a.name and plan.answers["q05"].strip() in answer.read_text()
            wait_on_disk(a.home / "pipeline_lab" / "q05_distribute_layers.ipynb", "%%answer q05")

        # ---- Ana's bad first try: q09 renamed, q10 moved out of the folder -> refused, nothing lost
        folder = ana.home / "pipeline_lab"
        hub.as_user(ana, ["mv", str(folder / "q09_check_outputs.ipynb"), str(folder / "q09_mine.ipynb")])
        hub.as_user(ana, ["mv", str(folder / "q10_check_gradients.ipynb"), str(ana.home / "q10_check_gradients.ipynb")])
        submit(pa)
        dialog = pa.locator(".jp-Dialog")
        dialog.wait_for(timeout=60_000)
        message = dialog.inner_text()
        dialog.locator("pre").first.evaluate("e => e.scrollTop = e.scrollHeight")   # the message ends it
        shot(pa, "05_ana_submit_refused.png", saved)
        assert "NOT SUBMITTED. These notebooks of pipeline_lab are not in your pipeline_lab folder: " \
               "q09_check_outputs.ipynb, q10_check_gradients.ipynb." in flat(message), message
        assert "(renamed?): q09_mine.ipynb" in flat(message) and "Nothing was changed" in message, message
        dialog.get_by_role("button").last.click()
        inbound = hub.exchange / "pipeline-lab" / "inbound"
        assert not list(inbound.glob(f"{ana.name}+*")), "a refused submission reached the exchange"
        assert (folder / "q09_mine.ipynb").exists() and (ana.home / "q10_check_gradients.ipynb").exists()
        hub.as_user(ana, ["mv", str(folder / "q09_mine.ipynb"), str(folder / "q09_check_outputs.ipynb")])
        hub.as_user(ana, ["mv", str(ana.home / "q10_check_gradients.ipynb"), str(folder / "q10_check_gradients.ipynb")])
        submit(pa)                                   # Ana's first submission: Q5 done, Q8 not yet
        wait_submitted(pa, 1)
        steps.done("Ana: a submission with a renamed and a moved notebook refused; then submitted")

        # ---- Q8, both at once; Ben submits while his check runs
        for a, page, plan in ((ana, pa, ana_plan), (ben, pb, ben_plan)):
            open_notebook(page, a.name, "q08_afab_step.ipynb", "q08")
            write_answer(page, "q08", plan.answers["q08"])
            save(page)
            wait_on_disk(a.home / "pipeline_lab" / "q08_afab_step.ipynb", plan.answers["q08"].strip().splitlines()[-1])
        run_all(pa)
        run_all(pb)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not check_processes({ben.uid}):
            time.sleep(0.1)
        running_at_submit = check_processes({ben.uid})
        assert running_at_submit, "Ben's Q8 check should be running when he submits"
        submit(pb)                                   # refused: the check runs
        dialog = pb.locator(".jp-Dialog")
        dialog.wait_for(timeout=60_000)
        message = dialog.inner_text()
        dialog.locator("pre").first.evaluate("e => e.scrollTop = e.scrollHeight")
        shot(pb, "06_ben_submit_refused_check_running.png", saved)
        assert "NOT SUBMITTED. A check is still running (q08 for " in flat(message), message
        assert "save your notebooks" in message and "Nothing was changed" in message, message
        dialog.get_by_role("button").last.click()
        assert not list(inbound.glob(f"{ben.name}+*"))
        pb.locator(".lm-TabBar-tab", has_text="q08_afab_step.ipynb").click()
        out_b = wait_check(pb, "q08")
        assert "q08: all checks passed" in out_b, out_b
        pb.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .pp-timeline svg.pp-timeline-frame",
                             timeout=120_000)
        out_a = wait_check(pa, "q08")
        assert "q08:" in out_a and "problem" in out_a and "micro-batches" in out_a, out_a
        for page in (pa, pb):
            save(page)
        assert running_at_submit and [p for p in user_processes({ben.uid}) if "ipykernel" in p]   # untouched
        steps.done("Q8 answered and checked by both at once (Ben's submit during his check refused)")
        pb.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .pp-timeline").scroll_into_view_if_needed()
        shot(pb, "07_ben_q08_timeline.png", saved)
        pa.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output",
                   has_text="problem").last.scroll_into_view_if_needed()
        shot(pa, "08_ana_q08_failed.png", saved)
        submit(pb)                                   # Ben's one submission, after his check
        wait_submitted(pb, 1)
        submit(pa)                                   # Ana's second submission: the one that counts
        wait_submitted(pa, 2)
        shot(pa, "09_ana_submitted_twice.png", saved)
        steps.done("Ana submitted again")
        assert f"{second} released" in hub.grader("release", "--exchange", "--assignment", second).stdout
        nbgrader = [str(hub.venv / "bin" / "python"), "-m", "nbgrader"]
        for a in (ana, ben):   # the second assignment: fetched and submitted (untouched) as the student
            hub.as_user(a, [*nbgrader, "fetch_assignment", second])
            assert (a.home / second / "README.md").exists() and owner(a.home / second) == a.name
            hub.as_user(a, [*nbgrader, "submit", second])
        steps.done(f"both fetched and submitted {second} (nbgrader fetch_assignment, submit)")
        sampler.stop.set()
        sampler.join()
        assert sampler.overlap, "the two students' checks never ran at the same time"
        assert set(sampler.owners) == {ana.uid, ben.uid} and not sampler.intruders, (sampler.owners,
                                                                                      sampler.intruders[:5])

        # ---- files: owners and modes in the homes and the exchange
        for a in (ana, ben):
            lab = a.home / "pipeline_lab"
            for p in [lab, *lab.rglob("*")]:
                assert owner(p) == a.name, f"{p} belongs to {owner(p)}"
            assert mode(a.home) == 0o700
            assert list((lab / "runs").iterdir()), "the checks keep their runs beside the notebooks"
        outbound = hub.exchange / "pipeline-lab" / "outbound" / "pipeline_lab"
        assert mode(hub.exchange) == 0o777
        assert owner(outbound) == inst.name and mode(outbound) == 0o755
        assert all(mode(p) == 0o644 and owner(p) == inst.name for p in outbound.iterdir())
        assert owner(inbound) == inst.name and mode(inbound) == 0o2733   # write-only, setgid: no listing
        subs = {a.name: sorted(inbound.glob(f"{a.name}+pipeline_lab+*")) for a in (ana, ben)}
        assert len(subs[ana.name]) == 2 and len(subs[ben.name]) == 1, subs
        for name, dirs in subs.items():
            for d in dirs:
                assert owner(d) == name
                files = [p for p in d.rglob("*") if p.is_file()]
                assert all(owner(p) == name and mode(p) == 0o644 for p in files)
                assert not (d / "runs").exists() and not (d / "answers").exists()   # CourseDirectory.ignore
        ben_sub = json.loads((subs[ben.name][0] / "q08_afab_step.ipynb").read_text())
        assert ben_plan.answers["q08"].strip().splitlines()[-1] in json.dumps(ben_sub), "Ben's Q8 was not submitted"
        for a, other in ((ana, ben), (ben, ana)):   # a student cannot see another's work
            for path in (other.home, inbound):
                assert hub.as_user(a, ["ls", str(path)], check=False).returncode != 0, f"{a.name} lists {path}"
            assert hub.as_user(a, ["cat", str(hub.checkout / "solutions" / "pipeline_lab" / "q05_distribute_layers.ipynb")],
                               check=False).returncode != 0

        # ---- the instructor: collect, autograde, feedback
        out = hub.grader("collect", "--exchange").stdout
        print(out)
        assert re.search(rf"{ana.name}\s+submitted .*\(2 submissions in the exchange, the latest counts\)", out), out
        assert re.search(rf"{ben.name}\s+submitted .*\(1 submission in the exchange\)", out), out
        latest = (subs[ana.name][-1] / "timestamp.txt").read_text().strip()
        assert (hub.course / "submitted" / ana.name / "pipeline_lab" / "timestamp.txt").read_text().strip() == latest
        assert all((hub.course / "submitted" / a.name / second / "timestamp.txt").exists() for a in (ana, ben))
        steps.done("instructor: collect from the exchange")
        watch = SandboxWatch(hub.course)
        watch.start()
        try:
            out = hub.grader("autograde", "--jobs", "2", timeout=1200).stdout
        finally:
            watch.stop.set()
            watch.join()
            for a in (ana, ben):        # the hidden tests' own log, kept for a failure's whole story
                log = hub.course / "grader" / a.name / "trusted.log"
                if log.exists():
                    SHOTS.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(log, SHOTS / f"trusted-{a.name}.log")
        print(out)
        steps.done("instructor: autograde both (2 at a time)")
        # the students' code ran in bubblewrap (hidden tests and nbgrader's kernels), as the instructor
        # (not root), in user namespaces of its own
        for a in (ana, ben):
            verdicts = json.loads((hub.course / "grader" / a.name / "verdicts.json").read_text())
            assert verdicts["sandbox"] == "bubblewrap", verdicts["sandbox"]
        assert {what for what, _, _ in watch.seen.values()} == {"hidden tests", "nbgrader kernel"}, watch.seen
        assert all(uid == inst.uid and own_ns for _, uid, own_ns in watch.seen.values()), watch.seen
        cache = inst.home / ".cache" / "pp-lab"           # the reference answers: the instructor's alone
        assert owner(cache) == inst.name and mode(cache) == 0o700 and list(cache.glob("reference-*/*.py"))
        from grader.course import Course, hidden_points
        from grader.report import grade_rows
        rows = {r["student"]: r for r in grade_rows(Course(hub.course))}
        points = {q: p for q, p in hidden_points().items() if q in MODULES["pipeline_lab"]}
        later = {r["student"]: r for r in grade_rows(Course(hub.course, assignment=second))}
        assert {a.name: (later[a.name]["state"], later[a.name]["autograded"]) for a in (ana, ben)} == \
            {a.name: ("graded", 0.0) for a in (ana, ben)}, later          # submitted untouched
        for plan in (ana_plan, ben_plan):
            got = {qid: rows[plan.name].get(qid) for qid in points}
            assert got == pytest.approx(plan.expected_points(points)), plan.story
        out = hub.grader("feedback", "--release", "--assignment", "pipeline_lab").stdout
        assert "released" in out
        feedback = hub.exchange / "pipeline-lab" / "feedback"
        assert owner(feedback) == inst.name and mode(feedback) == 0o711        # no listing: fetch by hash
        for course_file in (hub.course / "submitted").rglob("*"):
            assert owner(course_file) == inst.name
        steps.done("instructor: feedback generated and released")

        # ---- each student fetches their feedback and reads it in the browser
        for a, page, plan in ((ana, pa, ana_plan), (ben, pb, ben_plan)):
            assignments(page)
            page.get_by_role("button", name="Fetch Feedback").first.click()
            page.get_by_text("view feedback").first.wait_for(timeout=120_000)
            page.get_by_text("view feedback").first.click()        # the file browser opens the feedback folder
            page.locator(".jp-DirListing-item", has_text="q08_afab_step").wait_for(timeout=60_000)
            if a is ana:
                shot(page, "10_ana_feedback_fetched.png", saved)
            fb_files = sorted((a.home / "pipeline_lab" / "feedback").rglob("*.html"))
            assert len(fb_files) == len(MODULES["pipeline_lab"]) and all(owner(p) == a.name for p in fb_files)
            other = ben if a is ana else ana
            assert not any(other.name in p.read_text() for p in fb_files), "feedback names another student"
            q08 = next(p for p in fb_files if p.name == "q08_afab_step.html")
            want = plan.expected_points(points)["q08"]
            assert f"Score {want:g} / 20" in q08.read_text(), f"{a.name}: q08 feedback"
            fb = page.context.new_page()                            # the HTML itself, in a browser tab
            rel = urllib.parse.quote(str(q08.relative_to(a.home)))
            fb.goto(f"{hub.url}/user/{a.name}/files/{rel}")
            fb.get_by_text(f"Score {want:g} / 20").first.wait_for(timeout=60_000)
            fb.get_by_text(f"Score {want:g} / 20").first.scroll_into_view_if_needed()
            shot(fb, f"{11 if a is ana else 12}_{a.name.split('-')[1]}_q08_feedback.png", saved)
            fb.close()
        steps.done("both fetched and opened their feedback")

        # ---- log out: the servers stop, and with them every kernel and check
        for page in (pa, pb):
            page.goto(f"{hub.url}/hub/logout")
        shot(pa, "13_logged_out.png", saved)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and user_processes({ana.uid, ben.uid}):
            time.sleep(0.5)
        assert not user_processes({ana.uid, ben.uid}), user_processes({ana.uid, ben.uid})
        steps.done("both logged out; nothing of theirs runs")
    except Exception:
        for name, page in (locals().get("pages") or {}).items():
            try:
                page.screenshot(path=str(SHOTS / f"failure_{name}.png"))
            except Exception:  # noqa: BLE001
                pass
        print(hub.log_tail(6000))
        raise
    finally:
        if sampler is not None:
            sampler.stop.set()
        if browser is not None:
            browser.close()
        if pw is not None:
            pw.stop()
        hub.stop()
        left = [f"{p.pid}: {' '.join(p.cmdline())[:120]}" for p in hub.processes() if p.is_running()]
        hub.remove_accounts()
        (SHOTS / "timings.json").write_text(json.dumps({"steps": steps.times,
                                                        "total_s": round(time.monotonic() - steps.t0, 1)}, indent=1))
    assert not left, f"left running after the hub stopped: {left}"
    children = children_left(timeout=10)
    assert not children, f"child processes left behind: {children}"
    assert len(saved) == 13 and all(p.stat().st_size > 5_000 for p in saved)
    print(f"hub round trip: {time.monotonic() - steps.t0:.1f} s")
