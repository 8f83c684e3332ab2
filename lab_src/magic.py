"""The %%answer cell magic: run an answer cell, and keep its source where every process can load it.

    %%answer q05
    def distribute_layers(num_layers, pp_rank, pp_size):
        ...

Running the cell defines the function in the notebook, as usual, and writes the cell (without the
magic line) to answers/q05_distribute_layers.py beside the notebook. torchrun workers load that file,
so the processes of a check run the student's code, not a copy of the notebook's memory. The grader
does not use these files: it reads the answer cell out of the submitted notebook itself.
"""
from __future__ import annotations

import ast
import builtins
import os
import tempfile

from lab_src.answers import answers_dir
from lab_src.registry import exercise


def free_names(source: str) -> list[str]:
    """Names the cell's functions use that the cell itself does not define or import.

    An answer cell must stand alone: the checks and the grader run it without the rest of the notebook.
    """
    tree = ast.parse(source)
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
            if not isinstance(node, ast.ClassDef):
                args = node.args
                defined.update(a.arg for a in args.args + args.kwonlyargs + args.posonlyargs)
                defined.update(a.arg for a in (args.vararg, args.kwarg) if a)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted(used - defined)


def write_answer(qid: str, source: str) -> str:
    """Write the answer file atomically (a check running meanwhile sees the old or the new file)."""
    ex = exercise(qid)
    folder = answers_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{ex.id}", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(f"# Answer to {ex.id} ({ex.function}), written by the %%answer cell of {ex.notebook}.\n")
        f.write("# Edit the notebook, not this file: running the cell rewrites it.\n")
        f.write(source if source.endswith("\n") else source + "\n")
    path = folder / ex.answer_file
    os.replace(tmp, path)
    return str(path)


def register(ipython) -> None:
    def answer(line: str, cell: str):
        qid = line.strip().split()[0] if line.strip() else ""
        ex = exercise(qid)
        try:
            code = compile(cell, f"<{ex.id} answer>", "exec")
        except SyntaxError:
            ipython.showsyntaxerror()
            return
        write_answer(ex.id, cell)
        ipython.ex(code)  # define the function in the notebook; an exception shows as usual
        unknown = free_names(cell)
        if unknown:
            print(f"Note: this cell uses {', '.join(unknown)} without defining or importing it here. "
                  f"The checks and the grader run the cell on its own, so import or define it in this cell.")

    ipython.register_magic_function(answer, magic_kind="cell", magic_name="answer")
