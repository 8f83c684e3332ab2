"""What students install (`pip install .`: lab_src alone) carries no reference answer and no grader."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from conftest import ROOT
from test_release import answer_lines


def test_student_package_has_no_answers_and_no_grader(tmp_path, reference):
    # build from a copy of what git tracks: a build/ folder left in the checkout could carry old files
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files", "pyproject.toml", "README.md", "lab_src"], cwd=ROOT,
                             check=True, capture_output=True, text=True).stdout.split()
    for name in tracked:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(src)], check=True, capture_output=True, text=True)
    (wheel,) = wheels.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} <= {"lab_src", next(n.split("/")[0] for n in names if ".dist-info" in n)}
    assert any(n == "lab_src/exercises.py" for n in names)

    # a fresh environment with nothing but the student package (no torch needed to import it)
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next((env / "lib").glob("python3*/site-packages"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True)
    secret = answer_lines(reference)
    for path in site.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".txt", ".json", ".ipynb", ""):
            body = {ln.strip() for ln in path.read_text(errors="replace").splitlines()}
            assert not (secret & body), (path, sorted(secret & body)[:3])
    probe = """
import importlib.util, lab_src
assert lab_src.__file__.startswith(%r), lab_src.__file__
for name in ("grader", "solutions"):
    assert importlib.util.find_spec(name) is None, name + " is importable"
try:
    lab_src.distribute_layers(8, 0, 4)
except NotImplementedError as e:
    print("STUB:", e)
""" % str(site)
    out = subprocess.run([str(env / "bin" / "python"), "-I", "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "STUB: q05 distribute_layers() has no answer yet" in out.stdout
