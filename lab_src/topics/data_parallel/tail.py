"""Parent side of the network study (q19's notebook): each layer's all-reduce time and each step's time as a
distribution over the steps of a run on an emulated network (network.py), against what the model predicts.

    study = network_study(predicted={"p50": 40, "p99": 200})   # lab_src/checks/network_study.py
    study.table(predicted)      # (network_study prints it) per layer and per step: p50, p99, max; slow steps
    study.figure(predicted)     # each layer's times as the seed draws them, and the steps' with p50 and p99
    study.timeline()            # the slowest step's messages on every rank, its slow message named

A step's time is its slowest rank's (a data-parallel step ends when every rank has its gradients), and so is
a layer's. The network is emulated (network.py): its delays are sleeps before each send, on this machine.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lab_src.topics.data_parallel.network import Network, ring_messages, share_of_slow
from lab_src.topics.data_parallel.records import chunk_cap


def quantile(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) of xs, linear between order statistics; nan for none."""
    import numpy as np
    return float(np.quantile(xs, q)) if len(xs) else float("nan")


def given(predicted: dict | None) -> dict:
    """The numbers of a prediction ({"p50": ms, "p99": ms}), those still None left out."""
    return {k: float(v) for k, v in (predicted or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@dataclass
class NetworkStudy:
    n: int
    network: Network
    layers: list                            # [[name, length]] in the order summed (a backward's: last layer first)
    layer_times: dict                       # name -> [seconds per step], each step's slowest rank
    step_times: list                        # [seconds per step], each step's slowest rank
    slow: list = field(default_factory=list)     # the slow messages: {"step", "layer", "src", "dst", "bytes", "delay",
                                                 # "posted": when the sender handed it to its link, perf_counter}
    events: list = field(default_factory=list)   # per step: every message of every rank (pipeline/trace.py Event)

    @property
    def messages_per_step(self) -> int:
        """k: the messages one step sends, all links together (a ring: L layers x n ranks x 2(n - 1))."""
        return ring_messages(len(self.layers), self.n)

    def predicted_share(self, k: int | None = None) -> float:
        """P(a step meets a slow message) = 1 - (1 - q)^k."""
        return share_of_slow(self.network.tail_share, self.messages_per_step if k is None else k)

    def slow_steps(self) -> set[int]:
        return {m["step"] for m in self.slow}

    def base_step(self) -> float:
        """The network's part of a step without a slow message: each layer's 2(n - 1) steps, one after another,
        each a message of a chunk (S / n bytes) with its latency. The machine's own time comes on top."""
        return sum(2 * (self.n - 1) * self.network.base(chunk_cap(length, self.n) * 4) for _, length in self.layers)

    def modelled(self, machine: float = 0.0, samples: int = 20_000, seed: int = 0) -> tuple[float, float]:
        """(p50, p99) of a step in seconds as the model has it: the network's part without a slow message, plus
        `machine` (this machine's part, measured), plus, for each slow message among the step's k (each slow
        with probability q), the (factor - 1) times its delay that the ring waits for it on top."""
        import random
        rng, net = random.Random(seed), self.network
        per_layer = self.n * 2 * (self.n - 1)
        extra = [(net.tail_factor - 1) * net.base(chunk_cap(length, self.n) * 4) for _, length in self.layers]
        steps = [self.base_step() + machine + sum(x for x in extra for _ in range(per_layer)
                                                   if rng.random() < net.tail_share) for _ in range(samples)]
        return quantile(steps, 0.5), quantile(steps, 0.99)

    def table(self, predicted: dict | None = None) -> None:
        predicted = given(predicted)
        net = self.network
        print(f"{len(self.step_times)} steps, each all-reducing the seed's {len(self.layers)} layers with your ring "
              f"on {self.n} ranks, over an EMULATED network: latency {net.latency * 1e3:g} ms, "
              f"{net.bandwidth / 1e6:g} MB/s, {net.tail_share:.1%} of messages {net.tail_factor:g}x slower")
        print(f"{'':14} {'p50 (ms)':>9} {'p99 (ms)':>9} {'max (ms)':>9}   steps with a slow message")
        for name, _ in self.layers:
            xs = self.layer_times[name]
            hit = len({m["step"] for m in self.slow if m["layer"] == name})
            print(f"{name + ' all-reduce':14} {quantile(xs, .5) * 1e3:>9.1f} {quantile(xs, .99) * 1e3:>9.1f} "
                  f"{max(xs) * 1e3:>9.1f}   {hit} of {len(xs)}")
        xs = self.step_times
        print(f"{'step':14} {quantile(xs, .5) * 1e3:>9.1f} {quantile(xs, .99) * 1e3:>9.1f} {max(xs) * 1e3:>9.1f}   "
              f"{len(self.slow_steps())} of {len(xs)}")
        k = self.messages_per_step
        print(f"\nk = {k} messages per step (all links): 1 - (1 - q)^k = {self.predicted_share():.1%} of steps "
              f"should meet a slow message; {len(self.slow_steps()) / len(xs):.1%} did in this run. The network's "
              f"part of a step without one: {self.base_step() * 1e3:.1f} ms (emulated); the rest is this machine's.")
        if predicted:
            said = ", ".join(f"{key} {predicted[key]:g} ms (measured {quantile(xs, q) * 1e3:.1f})"
                             for key, q in (("p50", .5), ("p99", .99)) if key in predicted)
            print(f"your prediction of a step: {said}")
        else:
            print("no prediction given: write your p50 and p99 of a step (ms) into `predicted` before you run it")

    def figure(self, predicted: dict | None = None):
        """As the seed draws its per-layer latencies: left, each layer's all-reduce time over the steps as a
        cumulative distribution; right, the steps' (red: a step that met a slow message), with the measured
        p50 and p99 and, when given, your predicted ones."""
        from matplotlib.ticker import FormatStrFormatter, NullFormatter

        from lab_src.views.static import TimelineFigure
        predicted = given(predicted)
        fig = TimelineFigure(figsize=(10, 4.2), layout="constrained")
        left, right = fig.subplots(1, 2)
        colors = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#9d755d")
        for i, (name, _) in enumerate(self.layers):
            xs = sorted(x * 1e3 for x in self.layer_times[name])
            left.step(xs, [(j + 1) / len(xs) for j in range(len(xs))], where="post", color=colors[i % len(colors)],
                      label=name)
        left.set_xscale("log")
        left.set_xlabel("all-reduce time of the layer (ms)")
        left.set_ylabel("share of steps")
        left.set_title("Each layer's all-reduce: cumulative distribution", fontsize=9)
        left.legend(fontsize=8)
        slow = self.slow_steps()
        order = sorted(range(len(self.step_times)), key=self.step_times.__getitem__)
        ys = [(j + 1) / len(order) for j in range(len(order))]
        right.scatter([self.step_times[t] * 1e3 for t in order], ys, s=6,
                      c=["#e45756" if t in slow else "#4c78a8" for t in order])
        right.scatter([], [], s=6, color="#e45756", label="a step that met a slow message")
        for q, style in ((.5, "-"), (.99, "--")):
            right.axvline(quantile(self.step_times, q) * 1e3, color="#333", ls=style, lw=1,
                          label=f"measured p{round(q * 100)}: {quantile(self.step_times, q) * 1e3:.0f} ms")
        for key, style in (("p50", "-"), ("p99", "--")):
            if key in predicted:
                right.axvline(predicted[key], color="#e45756", ls=style, lw=1.5,
                              label=f"your {key}: {predicted[key]:g} ms")
        right.set_xscale("log")
        for ax in (left, right):            # 20, 50, 100 ms rather than 10^1, 10^2
            lo, hi = ax.get_xlim()
            ax.set_xticks([x for x in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000) if lo <= x <= hi])
            ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        right.set_xlabel("step time (ms)")
        right.set_ylabel("share of steps")
        right.set_title(f"Steps: {len(slow)} of {len(order)} met a slow message "
                        f"(1 - (1 - q)^k = {self.predicted_share():.1%})", fontsize=9)
        right.legend(fontsize=8, loc="lower right")
        net = self.network
        fig.suptitle(f"Your ring on {self.n} ranks over an EMULATED network ({net.latency * 1e3:g} ms, "
                     f"{net.bandwidth / 1e6:g} MB/s, {net.tail_share:.1%} of messages {net.tail_factor:g}x slower)",
                     fontsize=9)
        return fig

    def slowest_step(self) -> int:
        return max(range(len(self.step_times)), key=self.step_times.__getitem__)

    def timeline(self, step: int | None = None):
        """One step's messages on every rank (the slowest step unless `step` says), its slow messages named."""
        from lab_src.views.timeline import show
        step = self.slowest_step() if step is None else step
        events = self.events[step]
        slow = [m for m in self.slow if m["step"] == step]
        said = ", ".join(f"{m['src']} -> {m['dst']} in {m['layer']} held {m['delay'] * 1e3:.0f} ms"
                         for m in slow) or "none (this machine's own delay)"
        marked = []
        for m in slow:          # the send the network held back: the sender's bar that spans its posting
            send = next((e for e in events if e.rank == m["src"] and e.is_send and e.peer == m["dst"]
                         and e.t_start <= m["posted"] <= e.t_end), None)
            if send is not None:
                marked.append((send, f"slow: held {m['delay'] * 1e3:.0f} ms (emulated)"))
        return show(events, self.n, 1, marked=marked,
                    title=f"Training step {step}, {self.step_times[step] * 1e3:.0f} ms. Slow messages "
                    f"(emulated, {self.network.tail_factor:g}x): {said}",
                    compute_free="between its bars a rank adds, or copies, the chunk it received")


def study_of(outcome, n: int, network: Network, layers: list) -> NetworkStudy:
    """The steps' and layers' slowest ranks, the slow messages and each step's messages, from a run's records."""
    from lab_src.pipeline.trace import Event
    obs = [outcome.obs[r] for r in range(n)]
    steps = [o.get("steps", []) for o in obs]
    count = min(len(s) for s in steps)
    layer_times = {name: [max(s[t][i] for s in steps) for t in range(count)] for i, (name, _) in enumerate(layers)}
    step_times = [max(s[t][-1] for s in steps) for t in range(count)]
    slow = []
    for r, o in enumerate(obs):
        for peer, _, nbytes, delay, is_slow, posted, (step, layer) in o.get("sent", []):
            if is_slow:
                slow.append({"step": step, "layer": layers[layer][0], "src": r, "dst": peer, "bytes": nbytes,
                             "delay": delay, "posted": posted})
    events = [[] for _ in range(count)]
    for o in obs:
        rows, marks = o.get("events", []), list(o.get("marks", [])) + [None]
        for t in range(min(count, len(marks) - 1)):
            events[t] += [Event.from_row(row) for row in rows[marks[t]:marks[t + 1]]]
    return NetworkStudy(n=n, network=network, layers=[list(x) for x in layers], layer_times=layer_times,
                        step_times=step_times, slow=slow, events=[sorted(e, key=lambda e: e.t_start) for e in events])
