"""Giving a kernel's memory back after a study: collect the garbage, then ask glibc to return its free heap.

A study (q12's experiments, q15's and q16's bubble studies, q19's) reads every rank's observations and events
into the kernel, keeps the few numbers and views its figures need, and drops the rest; CPython frees those
objects, but glibc's allocator keeps the freed pages in the process (in its arenas) until `malloc_trim` asks it
to give them back. Without it a kernel that ran q15's study twice held 1,090 MiB (benchmarks/README.md,
"What a study leaves in the kernel").
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc

_libc = None


def trim() -> bool:
    """glibc's malloc_trim(0): free heap pages go back to the system. False where there is no glibc, or where the
    kernel's own code broke what finding it needs: a trim is a courtesy, and never raises into a student's cell
    (the sample cohort's pia sets subprocess.Popen = None in her kernel, which ctypes.util.find_library calls)."""
    global _libc
    try:
        if _libc is None:
            try:
                _libc = ctypes.CDLL("libc.so.6")          # glibc's name on Linux: no subprocess to find it
            except OSError:
                _libc = ctypes.CDLL(ctypes.util.find_library("c"))
        return bool(_libc.malloc_trim(0))
    except Exception:
        return False


def release() -> None:
    """Collect the garbage (the cycles a launch's records leave), then trim."""
    gc.collect()
    trim()


def released(study):
    """A study function that gives the kernel's memory back once it has returned: its frame, and with it every
    rank's records it read, is gone by then (a trim inside it would find them still alive)."""
    import functools

    @functools.wraps(study)
    def run(*args, **kwargs):
        try:
            return study(*args, **kwargs)
        finally:
            release()
    return run
