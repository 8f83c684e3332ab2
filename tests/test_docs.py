"""The docs name what is there: docs/architecture.md's layout table names every module of lab_src/ and grader/
(a topic folder's modules: its README.md, which every topic has), and the relative links of the docs lead to files
that exist."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUT_START, LAYOUT_END = "## Layout", "## A student's code"


def _rows(layout: str) -> dict[str, str]:
    """The layout table's rows by their first cell."""
    return {line.split(" | ", 1)[0]: line for line in layout.splitlines() if line.startswith("| `")}


def unnamed_modules() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    layout = text[text.index(LAYOUT_START):text.index(LAYOUT_END)]
    rows, kinds_table = _rows(layout), layout[layout.index("### Case kinds"):]
    missing = []
    for path in sorted([*(ROOT / "lab_src").rglob("*.py"), *(ROOT / "grader").rglob("*.py")]):
        rel = path.relative_to(ROOT)
        parts, name, folder = rel.parts, rel.name, rel.parent.as_posix() + "/"
        if parts[:2] == ("lab_src", "topics") and len(parts) > 3:
            ok = (path.parent / "README.md").exists() and f"topics/{parts[2]}/README.md" in layout
        elif parts[:3] == ("grader", "cohort", "answers"):
            ok = "`answers/`" in rows.get("| `grader/cohort/`", "")
        elif parts[:3] == ("lab_src", "harness", "kinds"):
            ok = (name == "__init__.py" and "`harness/kinds/__init__.py`" in kinds_table) \
                or f"| `{rel.stem}` |" in kinds_table or f"`kinds/{name}`" in kinds_table
        else:
            row = " ".join(r for first, r in rows.items() if f"`{folder}`" in first or f"`{rel.as_posix()}`" in first
                           or (folder in ("lab_src/", "grader/") and f"`{folder}" in first))
            if re.fullmatch(r"q\d\d_\w+\.py", name):
                ok = "qNN_<function>.py" in row
            elif name == "__init__.py" and folder not in ("lab_src/", "grader/hidden/"):
                ok = bool(row)        # a package's own __init__.py: its folder's row
            else:
                ok = f"`{name}`" in row or f"`{rel.as_posix()}`" in row or f"`{folder.split('/', 1)[1]}{name}`" in row
        if not ok:
            missing.append(rel.as_posix())
    return missing


def test_the_layout_table_names_every_module():
    assert unnamed_modules() == [], "name these in docs/architecture.md's layout table (the row of their folder)"


def test_every_topic_has_its_readme():
    topics = [p for p in (ROOT / "lab_src" / "topics").iterdir() if (p / "__init__.py").exists()]
    assert topics and [t.name for t in topics if not (t / "README.md").exists()] == []


def test_the_docs_relative_links_lead_to_files():
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "lab_src" / "topics").glob("*/README.md"),
             ROOT / "benchmarks" / "README.md"]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_readme_opens_with_the_lab_of_today():
    """README's first paragraph counts the notebooks and names each module of the registry, with its exercises."""
    from lab_src.registry import EXERCISES, MODULES
    text = (ROOT / "README.md").read_text()
    first = text.split("\n\n")[1]
    words = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
    count = words[len(MODULES)] if len(MODULES) < len(words) else str(len(MODULES))
    assert f"in {len(EXERCISES)} notebooks, in {count} modules" in first
    for module, qids in MODULES.items():
        span = f"{qids[0]}-{qids[-1]}" if len(qids) > 4 else ", ".join(qids)
        assert f"`{module}` ({span})" in first, module


def test_choosing_modules_names_every_module_with_its_exercises():
    """README's 'Choosing modules' section lists the registry's modules as its first paragraph does (it had stopped at
    sharding's first two exercises while three modules and two exercises were added)."""
    from lab_src.registry import MODULES
    text = (ROOT / "README.md").read_text()
    section = " ".join(text.split("### Choosing modules")[1].split("\n\n")[1].split())
    for module, qids in MODULES.items():
        span = f"{qids[0]}-{qids[-1]}" if len(qids) > 4 else ", ".join(qids)
        assert f"`{module}` ({span}" in section, module
