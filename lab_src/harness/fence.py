"""A rank's fences: moments where it stops until the launching process has counted its bytes on the wire.

At a fence the rank writes a request (`<run dir>/wire/<rank>.<number>`: its pid and the fence's name) and waits
until the launching process, which reads the kernel's counts of the rank's connections (harness/wire.py
`WireWatch`), answers with `<rank>.<number>.ok`. The worker puts a fence at the start and at the end of every
case (`start <case>`, `end <case>`; `pass <case>` at the start of one that is not counted). What is counted
between two fences is what the rank sent between them. A connection's counts close with it: the groups a counted
case destroys (comm/mesh.py) are destroyed after its end, once every rank of the launch is past its own end fence
(`after_end`, run by the worker after the all-reduce that follows every case).

A rank that skips a fence, or answers its own, leaves the launching process no reading there: the judge then
has nothing that vouches for its record (judge/wire.py). The fences are armed only where a watch runs
(`arm`, from the launch's spec); unarmed, `here` does nothing.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

WAIT_S = 20.0       # how long a rank waits for the count (a launching process starved of CPU on a loaded machine)

_armed: dict = {}
_later: list = []       # what waits for the case's end to be read everywhere (`after_end`)


def arm(run_dir: Path, rank: int) -> None:
    folder = Path(run_dir) / "wire"
    folder.mkdir(exist_ok=True)
    _armed.update(folder=folder, rank=rank, number=0, case=None)


def start(case: int) -> None:
    """The case's first fence; the fences of `here` count until `end`."""
    if _armed:
        here(f"start {case}", force=True)
        _armed["case"] = case


def passing(case: int) -> None:
    """A case whose bytes are not counted (another kind's, or one this rank sits out) begins: what the rank sent
    after the last counted case's end is read up to here, not across this case's own traffic."""
    if _armed:
        here(f"pass {case}", force=True)


def end(case: int) -> bool:
    """The case's last fence (True where the case was counted)."""
    if _armed and _armed.get("case") == case:
        here(f"end {case}")
        _armed["case"] = None
        return True
    return False


def after_end(action) -> bool:
    """Inside a counted case, keep `action` (closing connections) for `run_after_end` and say True; else False."""
    if _armed and _armed.get("case") is not None:
        _later.append(action)
        return True
    return False


def run_after_end() -> None:
    """What `after_end` kept: the worker calls it once every rank of the launch has passed its case's end fence."""
    while _later:
        action = _later.pop(0)
        try:
            action()
        except Exception:  # noqa: BLE001 - a group that cannot be destroyed is left to the process's end
            pass


def here(name: str, force: bool = False) -> bool:
    """Stop until the launching process has counted this rank's bytes (True), or WAIT_S has passed. Outside a
    counted case (or unarmed), nothing."""
    if not _armed or (_armed.get("case") is None and not force):
        return False
    _armed["number"] += 1
    stem = f"{_armed['rank']}.{os.getpid()}.{_armed['number']}"
    request = _armed["folder"] / stem
    tmp = request.with_name("." + stem)
    tmp.write_text(json.dumps({"pid": os.getpid(), "name": name}))
    os.replace(tmp, request)
    ok = request.with_name(stem + ".ok")
    until = time.monotonic() + WAIT_S
    pause = 0.0005
    while time.monotonic() < until:
        if ok.exists():
            ok.unlink(missing_ok=True)      # the folder stays short: the watch lists it every 2 ms
            return True
        time.sleep(pause)
        pause = min(pause * 1.5, 0.002)
    return False
