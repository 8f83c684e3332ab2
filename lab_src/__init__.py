"""lab_src: what the pipeline-parallelism lab's notebooks import.

    %load_ext lab_src                   # in a notebook: enables the %%answer cell magic
    from lab_src import distribute_layers, pipeline_communicate, PipelineStage, LabConfig

The exercise functions (q02 onwards: q01 asks for written answers) are stubs until the matching
notebook's answer cell has run; see `lab_src.exercises` for their contracts. Importing lab_src does not
import torch; the parts that need it load on first use, so notebooks without tensors start fast.
"""
from lab_src import exercises as _exercises
from lab_src.pipeline.config import DEMO, LabConfig
from lab_src.registry import CODED, EXERCISES

# each exercise's function, by the name the registry gives it: `from lab_src import distribute_layers`
globals().update({e.function: _exercises.API[e.id] for e in CODED})

_LAZY = {
    "PipelineStage": ("lab_src.pipeline.stage", "PipelineStage"),
    "build_model": ("lab_src.pipeline.model", "build_model"),
    "make_dataloader": ("lab_src.pipeline.data", "make_dataloader"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'lab_src' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """`%load_ext lab_src` registers the %%answer cell magic and starts the checks' warm launcher."""
    from lab_src.magic import register
    register(ipython)
    from lab_src import grading
    if not grading.autograding():       # a kernel's checks start ranks from a warm process (harness/warm.py):
        from lab_src.harness import warm_launch      # it imports torch now, while the student reads
        warm_launch.prestart()


__all__ = ["LabConfig", "DEMO", "EXERCISES", *(e.function for e in CODED), "PipelineStage", "build_model",
           "make_dataloader"]
