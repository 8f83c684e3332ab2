"""The ring's time against its length, beside gloo's all-reduce, on the student's machine (q19's notebook;
benchmarks/ring_all_reduce.py runs it with the reference answer).

    study = ring_study()           # lab_src/checks/ring_study.py: 4 ranks, the answer's ring and gloo's
                                   # all_reduce, lengths 1 to 4,194,304
    study.table()                  # (ring_study prints it) per length: time, algbw, busbw (nccl-tests'); no fit
    study.table(alpha, beta)       # the same with the model's time beside each length
    alpha, beta = study.fit()      # the lab's least-squares fit of the alpha-beta model to the ring's times
    study.figure(alpha, beta)      # the times, your model and the lab's fit; study.figure(): the times alone

The student fits alpha and beta (q19's notebook asks for them): the table the study prints and the figure drawn
without the student's numbers say nothing of the lab's fit, so that nothing answers the question before it is
asked.

Each call is timed on every rank after a barrier of the case's ranks; a call's time is its slowest rank's,
and a length's time the median over its repeats. nccl-tests (PERFORMANCE.md) defines, for an all-reduce of S
bytes that took t seconds on n ranks, algbw = S / t and busbw = algbw x 2(n - 1)/n: the bytes each rank's
link carries, which for a ring is the number to compare with the link's bandwidth. The alpha-beta model of
a ring: 2(n - 1) steps, each a latency alpha plus a chunk of S / n bytes at beta seconds per byte,
    T(S) = 2(n - 1) alpha + 2(n - 1)/n S beta.
The ranks share the machine's cores and talk over loopback: the numbers are this machine's, not a network's.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

LENGTHS = (1, 16, 256, 4096, 65_536, 262_144, 1_048_576, 4_194_304)


@dataclass
class RingStudy:
    n: int
    element: int                         # bytes per element
    ring: dict[int, float]               # length -> median seconds (the slowest rank's, per call)
    gloo: dict[int, float]

    def nbytes(self, length: int) -> int:
        return length * self.element

    def algbw(self, length: int, seconds: float) -> float:
        return self.nbytes(length) / seconds if seconds > 0 else float("nan")

    def busbw(self, length: int, seconds: float) -> float:
        return self.algbw(length, seconds) * 2 * (self.n - 1) / self.n

    def model(self, length: int, alpha: float, beta: float) -> float:
        return 2 * (self.n - 1) * alpha + 2 * (self.n - 1) / self.n * self.nbytes(length) * beta

    def fit(self) -> tuple[float, float]:
        """(alpha in seconds, beta in seconds per byte): least squares of the model on the ring's times."""
        import numpy as np
        lengths = sorted(self.ring)
        a = np.array([[2 * (self.n - 1), 2 * (self.n - 1) / self.n * self.nbytes(x)] for x in lengths])
        t = np.array([self.ring[x] for x in lengths])
        (alpha, beta), *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)   # relative errors
        return float(alpha), float(beta)

    def table(self, alpha: float | None = None, beta: float | None = None) -> None:
        """Per length: the ring's time, algbw and busbw beside gloo's; with (alpha, beta), the model's time too."""
        modelled = alpha is not None and beta is not None
        print(f"ring all-reduce on {self.n} ranks of this machine (loopback, shared cores), float32"
              + (f"; the model with alpha = {alpha * 1e6:.0f} us, 1/beta = {1 / beta / 1e9:.2f} GB/s" if modelled else ""))
        print(f"{'length':>10} {'bytes':>11} | {'ring (ms)':>9} {'algbw':>9} {'busbw':>9} "
              + (f"{'model (ms)':>10} " if modelled else "") + f"| {'gloo (ms)':>9} {'busbw':>9} | ring / gloo")
        for x in sorted(self.ring):
            r, g = self.ring[x], self.gloo.get(x, float("nan"))
            print(f"{x:>10,} {self.nbytes(x):>11,} | {r * 1e3:>9.2f} {_bw(self.algbw(x, r))} {_bw(self.busbw(x, r))} "
                  + (f"{self.model(x, alpha, beta) * 1e3:>10.2f} " if modelled else "")
                  + f"| {g * 1e3:>9.2f} {_bw(self.busbw(x, g))} | {r / g:>6.2f}")
        print("(algbw = bytes / time; busbw = algbw x 2(n-1)/n, what each rank's link carries; GB/s)")

    def figure(self, alpha: float | None = None, beta: float | None = None):
        """The measured times of the ring and of gloo against the bytes; given (alpha, beta), the model with them
        and, beside it, the lab's fit (not before: the fit is what the student is asked for)."""
        from lab_src.views.static import TimelineFigure
        fig = TimelineFigure(figsize=(8, 4.2), layout="constrained")
        ax = fig.subplots()
        xs = sorted(self.ring)
        sizes = [self.nbytes(x) for x in xs]
        ax.loglog(sizes, [self.ring[x] * 1e3 for x in xs], "o", color="#4c78a8", label="your ring (measured)")
        ax.loglog(sizes, [self.gloo[x] * 1e3 for x in xs], "s", color="#999", label="gloo's all_reduce (measured)")
        title = (f"All-reduce on {self.n} ranks of this machine: latency-bound on the left, "
                 f"bandwidth-bound on the right")
        if alpha is not None and beta is not None:
            fitted = self.fit()
            ax.loglog(sizes, [self.model(x, alpha, beta) * 1e3 for x in xs], "-", color="#e45756", lw=1.5,
                      label=f"your model: alpha {alpha * 1e6:.0f} us, 1/beta {1 / beta / 1e9:.2f} GB/s")
            ax.loglog(sizes, [self.model(x, *fitted) * 1e3 for x in xs], "--", color="#4c78a8", lw=1,
                      label=f"the lab's fit: alpha {fitted[0] * 1e6:.0f} us, 1/beta {1 / fitted[1] / 1e9:.2f} GB/s")
        else:
            title += "\n(set your alpha and beta to draw your model, and the lab's fit beside it)"
        ax.set_xlabel("bytes summed (float32)")
        ax.set_ylabel("time of one all-reduce (ms)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        return fig


def _bw(bps: float) -> str:
    return f"{bps / 1e9:>9.3f}"


def study_of(outcome, n: int) -> RingStudy:
    """The medians, over repeats, of each call's slowest rank."""
    timed = {}
    for name in ("ring", "gloo"):
        per_rank = [o.get("timings", {}).get(name, {}) for o in outcome.obs.values()]
        timed[name] = {int(x): statistics.median(max(p[x][i] for p in per_rank) for i in range(len(per_rank[0][x])))
                       for x in per_rank[0]}
    return RingStudy(n=n, element=4, ring=timed["ring"], gloo=timed["gloo"])
