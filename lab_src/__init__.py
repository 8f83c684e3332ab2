"""lab_src: what the pipeline-parallelism lab's notebooks import.

    %load_ext lab_src                   # in a notebook: enables the %%answer cell magic
    from lab_src import distribute_layers, pipeline_communicate, PipelineStage, LabConfig

The exercise functions (q02..q10) are stubs until the matching notebook's answer cell has run; see
`lab_src.exercises` for their contracts. Importing lab_src does not import torch; the parts that need
it load on first use, so notebooks without tensors start fast.
"""
from .config import DEMO, LabConfig
from .exercises import (activation_shape, afab_step, baseline_step, check_args, check_gradients,
                        check_outputs, distribute_layers, needs_dataloader, pipeline_communicate)
from .registry import EXERCISES

_LAZY = {
    "PipelineStage": ("lab_src.stage", "PipelineStage"),
    "build_model": ("lab_src.model", "build_model"),
    "make_dataloader": ("lab_src.data", "make_dataloader"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'lab_src' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """`%load_ext lab_src` registers the %%answer cell magic."""
    from .magic import register
    register(ipython)


__all__ = ["LabConfig", "DEMO", "EXERCISES", "check_args", "activation_shape", "baseline_step",
           "distribute_layers", "needs_dataloader", "pipeline_communicate", "afab_step", "check_outputs",
           "check_gradients", "PipelineStage", "build_model", "make_dataloader"]
