"""End to end: the Q8 notebook in a real JupyterLab, driven by headless Chromium through Playwright.

The test starts JupyterLab on a free port in a temporary workspace holding the Q8 notebook (its answer
cell filled with the reference answer) and the reference answers of Q2-Q7, runs every cell, waits for
the check to pass and the timeline widget to appear, presses Play and checks that the frame changes
as the animation runs, moves the slider, switches to the ideal view, and saves screenshots under
out/screenshots/. Whatever happens, JupyterLab, its kernel and any torchrun process are stopped; the
test then asserts that none of them is left.

Chromium is Debian's /usr/bin/chromium (scripts/system_deps.sh installs it); without it the test skips.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest
from conftest import children_left

from lab_src.registry import EXERCISES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "pipeline_lab" / "q08_afab_step.ipynb"
SHOTS = ROOT / "out" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
TAG = "PP_LAB_BROWSER_TEST"        # every process this test starts carries it in its environment
WIDGET = ".pp-timeline"
FRAME = ".pp-timeline svg.pp-timeline-frame"


# ------------------------------------------------------------------------------------ the workspace
def make_workspace(ws: Path) -> Path:
    """Q8's notebook with the reference answer in its answer cell; answers/ holds the references of Q2-Q7."""
    from grader.reference import reference_sources
    refs = reference_sources()
    nb = json.loads(NOTEBOOK.read_text())
    cells = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "q08_answer"]
    assert len(cells) == 1, "the Q8 notebook must have exactly one answer cell"
    cells[0]["source"] = "%%answer q08\n" + Path(refs["q08"]).read_text()
    ws.mkdir(parents=True)
    (ws / NOTEBOOK.name).write_text(json.dumps(nb, indent=1))
    (ws / "answers").mkdir()
    for qid in ("q02", "q03", "q04", "q05", "q06", "q07"):
        shutil.copyfile(refs[qid], ws / "answers" / EXERCISES[qid].answer_file)
    return ws / NOTEBOOK.name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------- JupyterLab
def start_lab(ws: Path, home: Path, port: int, token: str, tag: str) -> subprocess.Popen:
    settings = home / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)   # no news or update pop-ups over the screenshots
    (settings / "notification.jupyterlab-settings").write_text('{"checkForUpdates": false, "fetchNews": "false"}')
    env = {k: v for k, v in os.environ.items() if k != "NBGRADER_EXECUTION"}
    env.update({TAG: tag, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
                "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
                "JUPYTERLAB_SETTINGS_DIR": str(home / "lab-settings"),
                "JUPYTERLAB_WORKSPACES_DIR": str(home / "lab-workspaces"), "IPYTHONDIR": str(home / "ipython")})
    cmd = [str(Path(sys.executable).with_name("jupyter-lab")), "--allow-root", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", "--port-retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={ws}", "--LabApp.news_url=None"]
    with open(home / "jupyterlab.log", "wb") as log:
        return subprocess.Popen(cmd, cwd=ws, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"JupyterLab did not answer {url} within {timeout_s} s:\n{log.read_text()[-3000:]}")


def tagged(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(TAG) == tag:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid}: {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            pass
    return out


def stop_lab(proc: subprocess.Popen, base: str, token: str, tag: str) -> None:
    """Ask JupyterLab to shut down (it stops its kernels), then end whatever of ours is still alive."""
    if proc.poll() is None:
        try:
            req = urllib.request.Request(f"{base}/api/shutdown", method="POST",
                                         headers={"Authorization": f"token {token}"})
            urllib.request.urlopen(req, timeout=5).close()
            proc.wait(timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    leftovers = tagged(tag)       # a kernel or torchrun worker in a session of its own
    for p in leftovers:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, stubborn = psutil.wait_procs(leftovers, timeout=5)
    for p in stubborn:
        p.kill()
    psutil.wait_procs(stubborn, timeout=5)


# --------------------------------------------------------------------------------------- the page
NOTEBOOK_HEIGHT = """() => {
  const nb = document.querySelector('.jp-NotebookPanel .jp-Notebook');
  const inner = nb.querySelector('.jp-WindowedPanel-outer') || nb;
  return Math.max(inner.scrollHeight, nb.scrollHeight) + nb.getBoundingClientRect().top;
}"""
LAST_CELL_BOTTOM = """() => Math.max(...[...document.querySelectorAll('.jp-NotebookPanel .jp-Cell')]
                                       .map(c => c.getBoundingClientRect().bottom))"""
SCROLL_TO_TOP = """() => {
  const nb = document.querySelector('.jp-NotebookPanel .jp-Notebook');
  for (const el of [nb, nb.querySelector('.jp-WindowedPanel-outer')]) if (el) el.scrollTop = 0;
}"""
SETTLE = """async () => {
  await document.fonts.ready;
  await Promise.all([...document.images].map(img => img.decode().catch(() => null)));
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
}"""


STARTED_RUNNING = r"""() => [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')]
                             .some(p => /\[(\*|\d+)\]/.test(p.textContent))"""


CHECK_DONE = r"""() => {  // the cell `report = check("q08")` has finished: its prompt shows a number
  const cell = [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell')]
    .find(c => (c.querySelector('.jp-InputArea-editor')?.textContent || '').includes('check("q08")'));
  return !!cell && /\[\d+\]/.test(cell.querySelector('.jp-InputPrompt').textContent);
}"""


def wait_kernel_idle(page, base: str, token: str, timeout_s: float = 60) -> None:
    """The notebook's kernel is connected and idle. The page alone cannot tell: its execution indicator
    reads "idle" for a moment before the kernel has even started, so ask the server as well."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=5) as r:
            kernels = [s["kernel"] for s in json.load(r)]
        shown = page.eval_on_selector_all(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator",
                                          "els => els.map(e => e.getAttribute('data-status'))")
        if kernels and all(k["execution_state"] == "idle" and k["connections"] for k in kernels) \
                and shown == ["idle"]:
            return
        time.sleep(0.25)
    pytest.fail(f"the kernel was not idle within {timeout_s} s (server: {kernels}, page: {shown})")


def settle(page) -> None:
    """Fonts loaded, every image decoded, two frames painted: then a screenshot shows what is there."""
    page.evaluate(SETTLE)


def frame_state(page) -> tuple[str, str, str]:
    """(step, view, hash of the SVG) of the frame the browser shows now."""
    step, view, svg = page.eval_on_selector(
        FRAME, "svg => [svg.getAttribute('data-step'), svg.getAttribute('data-view'), svg.outerHTML]")
    return step, view, hashlib.sha1(svg.encode()).hexdigest()


def shot(target, name: str, saved: list[Path]) -> None:
    path = SHOTS / name
    target.screenshot(path=str(path))
    saved.append(path)
    print(f"screenshot: {path}")


def set_slider(page, value: int) -> None:
    readout = page.locator(f"{WIDGET} .widget-slider .widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(str(value))
    page.keyboard.press("Enter")


def drive_notebook(page, base: str, token: str, saved: list[Path]) -> None:
    t0 = time.monotonic()

    def phase(what: str) -> None:
        print(f"  {time.monotonic() - t0:5.1f} s  {what}")

    page.goto(f"{base}/lab/tree/{NOTEBOOK.name}?token={token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=60_000)
    wait_kernel_idle(page, base, token)
    phase("kernel idle")
    page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()   # fold the file browser
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_function(STARTED_RUNNING, timeout=15_000)
    page.wait_for_function(CHECK_DONE, timeout=120_000)
    # textContent, not innerText: JupyterLab skips rendering cells outside the view (content-visibility),
    # and Run All leaves the view at the last cell, far below the check's output
    outputs = page.locator(".jp-NotebookPanel .jp-OutputArea-output").all_text_contents()
    assert any("q08: all checks passed" in o for o in outputs), "the check did not pass:\n" + "\n".join(outputs)
    phase("check passed")
    page.wait_for_selector(FRAME, timeout=30_000)
    phase("timeline widget shown")
    wait_kernel_idle(page, base, token)

    # the whole notebook: a window tall enough to hold it (the notebook scrolls inside its panel)
    height = page.evaluate(NOTEBOOK_HEIGHT)
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 200, 12_000)})
    page.evaluate(SCROLL_TO_TOP)
    page.set_viewport_size({"width": 1400, "height": min(int(page.evaluate(LAST_CELL_BOTTOM)) + 60, 12_000)})
    settle(page)
    shot(page, "q08_notebook_after_run.png", saved)
    page.set_viewport_size({"width": 1400, "height": 1000})
    widget = page.locator(WIDGET)
    widget.scroll_into_view_if_needed()

    # Play: the browser advances the slider, the kernel redraws; sample what the page shows
    before = frame_state(page)
    assert before[1] == "measured" and int(before[0]) > 30       # it opens on the whole run
    page.locator(f"{WIDGET} .widget-play button").first.click()
    seen, mid_saved = [], False
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not mid_saved:
        state = frame_state(page)
        if not seen and state == before:
            time.sleep(0.05)
            continue                     # Play has not reached the page yet
        seen.append(state)
        if int(state[0]) >= 30:          # a third of the way in: the forwards done, the backwards to come
            settle(page)
            shot(widget, "q08_timeline_mid_animation.png", saved)
            mid_saved = True
        time.sleep(0.1)
    page.locator(f"{WIDGET} .widget-play button").first.click()   # pause
    steps = [int(s) for s, _, _ in seen]
    distinct = {h for _, _, h in seen}
    print(f"sampled steps while playing: {steps}")
    assert len(distinct) >= 10, f"the frame changed only {len(distinct)} times while playing: steps {steps}"
    assert len({s for s in steps}) == len(distinct), "each new frame should belong to a new step"
    assert steps == sorted(steps) and steps[0] < 5, f"Play should start over and move forward: {steps}"
    assert mid_saved

    phase("played")
    # the slider moves the frame, and the step line tells what happened there
    set_slider(page, 12)
    page.wait_for_selector(f"{FRAME}[data-step='11']", timeout=10_000)   # data-step counts from 0
    info = page.locator(f"{WIDGET} .pp-timeline-info").inner_text()
    assert info.startswith("event 12/") and "rank " in info and "micro-batch" in info, info

    # the ideal view, at the end of its run
    page.locator(f"{WIDGET} .widget-toggle-button", has_text="ideal").click()
    page.wait_for_selector(f"{FRAME}[data-view='ideal']", timeout=10_000)
    set_slider(page, 10_000)   # the readout clamps to the last step
    page.wait_for_function(f"""() => {{
        const t = document.querySelector('{WIDGET} .pp-timeline-info');
        return t && /event (\\d+)\\/(\\1)\\b/.test(t.textContent); }}""", timeout=10_000)
    assert frame_state(page)[2] not in distinct
    side = page.locator(f"{WIDGET} .pp-timeline-side").inner_text()
    assert "theory (p-1)/(m+p-1) = (4-1)/(4+4-1) = 42.9%" in side and "Bytes sent" in side, side
    settle(page)
    shot(widget, "q08_timeline_ideal.png", saved)
    phase("slider and ideal view")


@pytest.mark.q08
def test_q08_timeline_widget_in_jupyterlab(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (scripts/system_deps.sh installs Debian's chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    started = time.monotonic()
    SHOTS.mkdir(parents=True, exist_ok=True)
    ws = tmp_path / "workspace"
    make_workspace(ws)
    port, token, tag = free_port(), uuid.uuid4().hex, uuid.uuid4().hex
    base = f"http://127.0.0.1:{port}"
    lab = start_lab(ws, tmp_path / "home", port, token, tag)
    saved: list[Path] = []
    try:
        wait_http(f"{base}/api/status?token={token}", lab, tmp_path / "home" / "jupyterlab.log")
        print(f"JupyterLab answers after {time.monotonic() - started:.1f} s")
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                drive_notebook(page, base, token, saved)
            except Exception:
                try:
                    page.screenshot(path=str(SHOTS / "q08_failure.png"))
                    print(f"screenshot of the failure: {SHOTS / 'q08_failure.png'}")
                except Exception as e:  # noqa: BLE001 - the page may be gone; the first error matters
                    print(f"no screenshot of the failure: {e}")
                raise
            finally:
                browser.close()
    finally:
        stopping = time.monotonic()
        stop_lab(lab, base, token, tag)
        print(f"JupyterLab and its kernel stopped in {time.monotonic() - stopping:.1f} s")
    left = describe(alive(tagged(tag)))
    assert not [p for p in left if "jupyter-lab" in p], f"JupyterLab left behind: {left}"
    assert not [p for p in left if "torch.distributed.run" in p or "lab_src.harness.worker" in p], f"torchrun left: {left}"
    assert not left, f"processes of the test left behind: {left}"
    children = children_left(timeout=5)
    assert not children, f"child processes left behind: {describe(children)}"   # Playwright, Chromium
    assert all(p.stat().st_size > 10_000 for p in saved) and len(saved) == 3
    print(f"browser test: {time.monotonic() - started:.1f} s")
