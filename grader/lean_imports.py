"""A third-party import the grader's own processes leave out, because nothing in them uses it.

jsonschema imports `rfc3987_syntax` wherever it is installed (jupyter-events asks for jsonschema's
format-nongpl extra), and that module builds its grammars as it is imported: 0.75 s of CPU in every
process that imports nbformat, which is every nbgrader command and every `grader.trusted` run (measured
on this machine: `import rfc3987_syntax` 0.74 s, `import nbformat` 1.0 s). It serves only jsonschema's
"iri" format checks, and neither nbformat nor nbgrader checks formats (no FormatChecker anywhere in
them), so these processes validate notebooks exactly as before without it.

    python -m grader.lean_imports nbgrader ARGS...    # `python -m nbgrader ARGS...`, without it

`leave_out()` does the same in a process of our own (grader/trusted.py); it must run before jsonschema
is imported, and changes nothing in a process that has imported it already.
"""
from __future__ import annotations

import runpy
import sys

LEFT_OUT = ("rfc3987_syntax",)


def leave_out() -> None:
    if "jsonschema" in sys.modules:
        return
    for name in LEFT_OUT:
        sys.modules.setdefault(name, None)       # `import` then raises ImportError, which jsonschema expects


if __name__ == "__main__":
    leave_out()
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
