"""The hidden tests, one module per exercise (grader/checks/qNN_<function>.py)."""
from . import (q02_check_args, q03_activation_shape, q04_baseline_step, q05_distribute_layers,
               q06_needs_dataloader, q07_pipeline_communicate, q08_afab_step, q09_check_outputs,
               q10_check_gradients)

HIDDEN = {m.QID: m for m in (q02_check_args, q03_activation_shape, q04_baseline_step, q05_distribute_layers,
                             q06_needs_dataloader, q07_pipeline_communicate, q08_afab_step, q09_check_outputs,
                             q10_check_gradients)}
