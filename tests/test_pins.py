"""environment.yml (conda, JupyterHub images, clusters) carries the same pins as pyproject.toml (pip)."""
import re
import tomllib

from conftest import ROOT


def pins_of(requirements):
    out = {}
    for req in requirements:
        name, _, version = req.partition("==")
        assert version, f"{req!r} is not pinned exactly"
        out[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    return out


def test_environment_yml_has_the_pyproject_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip = pins_of(project["dependencies"])
    for extra in ("student", "instructor", "hub"):
        pip.update(pins_of(project["optional-dependencies"][extra]))
    env = (ROOT / "environment.yml").read_text()
    conda = pins_of(re.findall(r"^\s+- ([A-Za-z0-9_.-]+==[^\s#]+)", env, flags=re.M))
    assert conda == pip
    python = re.search(r"^\s+- python=(\S+)", env, flags=re.M).group(1)
    assert project["requires-python"] == ">=3.10" and python.startswith("3.1")
