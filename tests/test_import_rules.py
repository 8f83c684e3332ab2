"""Rules on the imports between the modules of lab_src and grader, read from the source with ast.

Every import counts: at the top of a module, inside a function, under `if TYPE_CHECKING:`, absolute or
relative. `import_graph()` builds the graph once ({module: the modules it imports}); a rule is a test that
reads it. Rules so far:
1. no import circle: no two modules import each other, directly or through others. A module's edges to the
   packages that hold it (its parent, and theirs) are left out: Python imports a package before any of its
   modules, so `pkg/__init__.py` importing `pkg.sub` is not a circle with `pkg.sub` importing from `pkg`;
2. the grading limits (lab_src/harness/limits.py) import nothing.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

TOPS = ("lab_src", "grader")


def source_modules(root: Path = ROOT, tops: tuple[str, ...] = TOPS) -> dict[str, Path]:
    """{dotted module name: its file} for every .py under `tops` (a package by its own name, not `.__init__`)."""
    found = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            if "cohort/answers" in path.relative_to(root).as_posix():
                continue            # a student's answer text (grader/cohort/answers/), never imported
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _known(name: str, known: set[str]) -> str | None:
    """The longest known module that `name` is or lies in (`lab_src.harness.runner.run_cases` -> the module)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _enclosing(name: str) -> set[str]:
    """The packages that hold module `name`: its parent, its parent's parent, ..."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules that module `name` (file `path`) imports, each as the longest known name.
    `from pkg import sub` imports the module pkg.sub when there is one, else something of pkg; a relative
    import is resolved against the module's package. Its own name and the packages that hold it are left out."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets |= {_known(alias.name, known) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                if node.level - 1 > len(parts) - 1:
                    raise ValueError(f"{path}: a relative import above the top package")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                targets.add(sub if sub in known else _known(base, known))
    return {t for t in targets if t is not None and t != name and t not in _enclosing(name)}


def import_graph(root: Path = ROOT, tops: tuple[str, ...] = TOPS) -> dict[str, set[str]]:
    """{module: the modules of `tops` it imports} for every module under `tops` (see `imports_of`)."""
    mods = source_modules(root, tops)
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the strongly connected components of `graph`, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph.get(start, ()))))]
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def circles(graph: dict[str, set[str]]) -> list[str]:
    """Each import circle as "a <-> b" (a component of more modules: "a <-> b <-> c", with the imports
    that close it), sorted; a module importing itself is not in the graph (see `imports_of`)."""
    found = []
    for component in strongly_connected(graph):
        if len(component) < 2:
            continue
        members = set(component)
        line = " <-> ".join(component)
        if len(component) > 2:
            line += ": " + ", ".join(f"{a} -> {b}" for a in component for b in sorted(graph[a] & members))
        found.append(line)
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_no_import_circle(graph):
    assert graph and all(isinstance(v, set) for v in graph.values())
    found = circles(graph)
    assert not found, "import circles (a module reaches itself through its imports):\n" + "\n".join(found)


def test_the_circle_finder_sees_a_circle_through_a_function_and_a_relative_import(tmp_path):
    """The rule's own check, on a made-up package: a circle hidden in a function's relative import is found;
    a package whose __init__ imports its module, which imports from the package, is not a circle."""
    pkg = tmp_path / "lab_src"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .sub import b\n")
    (pkg / "a.py").write_text("def f():\n    from .sub.b import g\n    return g\n")
    (pkg / "sub" / "__init__.py").write_text("from . import b\nVALUE = 1\n")
    (pkg / "sub" / "b.py").write_text("from lab_src.sub import VALUE\nimport lab_src.c\n")
    (pkg / "c.py").write_text("from lab_src import a\n")
    (pkg / "d.py").write_text("from .a import f\n")
    made = import_graph(tmp_path, ("lab_src",))
    assert made["lab_src.a"] == {"lab_src.sub.b"}
    assert made["lab_src.sub.b"] == {"lab_src.c"}          # its own packages left out
    assert made["lab_src.c"] == {"lab_src.a"}
    assert made["lab_src.sub"] == {"lab_src.sub.b"}
    assert circles(made) == ["lab_src.a <-> lab_src.c <-> lab_src.sub.b: lab_src.a -> lab_src.sub.b, "
                             "lab_src.c -> lab_src.a, lab_src.sub.b -> lab_src.c"]
    (pkg / "c.py").write_text("X = 1\n")
    (pkg / "a.py").write_text("from . import d\n")
    assert circles(import_graph(tmp_path, ("lab_src",))) == ["lab_src.a <-> lab_src.d"]


def test_the_grading_limits_import_nothing():
    """lab_src/harness/limits.py (every time, size and count limit of grading) is read by the ranks in the
    sandbox, the launching process and grader/: it imports nothing (no torch), so any of them may read it."""
    tree = ast.parse((ROOT / "lab_src" / "harness" / "limits.py").read_text())
    imports = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports == ["from __future__ import annotations"], imports
