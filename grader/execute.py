"""nbgrader's Execute preprocessor, with a kernel start that survives a loaded grading node.

nbgrader gives its kernel `Execute.startup_timeout` seconds (60 by default) to answer, then gives up on
the notebook, and autograde then removes the student's whole autograded folder. While other students'
hidden tests keep every core busy, a kernel can need longer than that (benchmarks/kernel_start.py
measures it). This class keeps nbgrader's behaviour, takes the longer limit grader/course.py
configures, and makes `startup_retries` fresh starts when a kernel still does not answer. It logs how
long each kernel took to answer (KERNEL-START) and each retry (KERNEL-START-RETRY). nbgrader 0.9.6
declares `execute_retries` but never reads it, hence a trait of our own.

A kernel that dies while a cell runs (the student's code killed the process that started it, or itself)
costs that cell, not the submission: nbclient raises DeadKernelError, on which nbgrader gives up the whole
assignment and the student is `failed`. Here the cell gets an error output that says what happened
(KERNEL-DIED in the log), and the notebook's later cells run in a fresh kernel, without what the earlier
cells defined, so they fail or pass on their own; `kernel_deaths` such restarts per notebook at most.
"""
from __future__ import annotations

import time

from jupyter_core.utils import run_sync
from nbclient.exceptions import DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Integer

from lab_src.harness import limits

RETRY_MARK = "KERNEL-START-RETRY"
START_MARK = "KERNEL-START answered"
DEATH_MARK = "KERNEL-DIED"
KERNEL_DIED = ("KernelDied", "the process running this notebook ended while this cell ran: the code in the cell "
               "killed it or the process that started it (os.kill, os._exit, ...). The cells after it ran in a "
               "fresh kernel, without what the cells before defined.")


class RetryingExecute(Execute):
    startup_retries = Integer(limits.KERNEL_START_RETRIES,
                              help="fresh kernel starts after one did not answer within startup_timeout").tag(config=True)
    kernel_deaths = Integer(limits.KERNEL_DEATHS,
                            help="fresh kernels per notebook after one died while a cell ran").tag(config=True)

    async def async_start_new_kernel_client(self):
        attempt = 0
        while True:
            started = time.monotonic()
            try:
                kc = await super().async_start_new_kernel_client()
            except (RuntimeError, TimeoutError) as e:
                # nbclient has shut that kernel down and dropped its manager: start a fresh one
                if attempt >= self.startup_retries:
                    raise
                attempt += 1
                self.log.warning("%s the kernel did not answer within %s s (%s); starting a fresh kernel "
                                 "(retry %d of %d)", RETRY_MARK, self.startup_timeout, e, attempt,
                                 self.startup_retries)
                if self.km is None:
                    self.km = self.create_kernel_manager()
                await self.async_start_new_kernel()
                continue
            self.log.info("%s after %.1f s", START_MARK, time.monotonic() - started)
            return kc

    # nbclient's synchronous wrapper is bound to its own coroutine, not to an override: rebind it, or
    # nbconvert's setup_kernel() would never see the retry
    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    def reset_execution_trackers(self) -> None:       # at the start of each notebook
        super().reset_execution_trackers()
        self._deaths = 0

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        except DeadKernelError:
            if getattr(self, "_deaths", 0) >= self.kernel_deaths:
                raise
            self._deaths = getattr(self, "_deaths", 0) + 1
            self.log.warning("%s while cell %d ran; the cells after it run in a fresh kernel", DEATH_MARK, cell_index)
            cell.outputs.append(NotebookNode(output_type="error", ename=KERNEL_DIED[0], evalue=KERNEL_DIED[1],
                                             traceback=[f"{KERNEL_DIED[0]}: {KERNEL_DIED[1]}"]))
            await self._async_cleanup_kernel()
            if self.km is None:
                self.km = self.create_kernel_manager()
            await self.async_start_new_kernel()
            await self.async_start_new_kernel_client()
            return cell

    execute_cell = run_sync(async_execute_cell)     # as above: nbconvert's preprocess_cell calls the sync wrapper
