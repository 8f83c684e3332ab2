"""q19's network study: the emulated network under the point-to-point layer (topics/data_parallel/network.py) and
the study of a step's time on it (tail.py, checks/network_study.py).

Fast: the delay model is seeded (the same slow messages in every run, about a share q of them), the links post in
order and not before a message's time (a message behind a slow one waits for it), a send returns at once, and
1 - (1 - q)^k is what the study predicts. Multi-process: the reference's ring over the emulated network on 4 ranks
sends every message through it, each step that met a slow message lasted at least that message's delay, and the
table, the figure and the slowest step's timeline are drawn from the run.
"""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from lab_src.topics.data_parallel.network import DelayedWork, Links, Network, ring_messages, share_of_slow
from lab_src.topics.data_parallel.tail import given, quantile

pytestmark = pytest.mark.q19


def test_the_slow_messages_are_drawn_from_the_seed_about_a_share_q_of_them():
    net = Network(tail_share=0.05, seed=4)
    draws = [net.slow(0, 1, k) for k in range(20_000)]
    assert draws == [Network(tail_share=0.05, seed=4).slow(0, 1, k) for k in range(20_000)]
    assert 0.04 < sum(draws) / len(draws) < 0.06
    assert draws != [Network(tail_share=0.05, seed=5).slow(0, 1, k) for k in range(20_000)]
    assert [net.slow(1, 0, k) for k in range(200)] != draws[:200]          # each link its own
    slow = draws.index(True)
    assert net.delay(0, 1, slow, 1000) == (pytest.approx(100 * (1e-3 + 1000 / 125e6)), True)
    assert net.delay(0, 1, draws.index(False), 1000) == (pytest.approx(1e-3 + 1000 / 125e6), False)


def test_a_step_meets_a_slow_message_with_probability_one_minus_one_minus_q_to_the_k():
    assert ring_messages(layers=4, n=4) == 96                 # 4 layers x 4 ranks x 2(n - 1) messages
    assert share_of_slow(0.002, 96) == pytest.approx(1 - 0.998 ** 96)
    assert share_of_slow(0.0, 96) == 0.0
    assert quantile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.5 and quantile([5.0], 0.99) == 5.0
    assert given({"p50": None, "p99": 120}) == {"p99": 120.0}


class _Posted:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait(self):
        return True

    def is_completed(self):
        return True


def test_a_link_posts_in_order_and_not_before_each_messages_time():
    import torch
    log = []
    # message 0 on the link 0 -> 1 is slow with this seed and share, message 1 is not
    net = next(Network(latency=0.02, bandwidth=1e12, tail_share=0.3, tail_factor=10, seed=s) for s in range(100)
               if Network(tail_share=0.3, seed=s).slow(0, 1, 0) and not Network(tail_share=0.3, seed=s).slow(0, 1, 1))
    links = Links(net, rank=0, post=lambda t, *a, **k: (log.append((float(t[0]), time.perf_counter())),
                                                        _Posted(log, float(t[0])))[1])
    t0 = time.perf_counter()
    first = links.send(1, torch.tensor([0.0]), (), {"dst": 1})
    second = links.send(1, torch.tensor([1.0]), (), {"dst": 1})
    assert time.perf_counter() - t0 < 0.02, "a send hands its message to the link and returns"
    assert isinstance(first, DelayedWork) and not first.is_completed()
    second.wait()
    assert first.is_completed() and [x for x, _ in log] == [0.0, 1.0]       # first in, first out
    assert log[0][1] - t0 >= 0.2                                            # the slow one: 10 x 20 ms
    assert log[1][1] >= log[0][1]                       # the next one, due at 20 ms, waited behind it
    assert [m[4] for m in links.sent] == [True, False] and links.sent[0][3] == pytest.approx(0.2)
    threads = [t for t in threading.enumerate() if t.name == "lab-link-0-1"]
    links.close()                                       # nothing is left running after the case
    for t in threads:
        t.join(5)
    assert threads and not any(t.is_alive() for t in threads)


def test_an_error_in_posting_reaches_the_ranks_wait():
    import torch

    def refuse(*args, **kwargs):
        raise RuntimeError("no such peer")
    links = Links(Network(latency=0.0, tail_share=0.0), rank=0, post=refuse)
    with pytest.raises(RuntimeError, match="no such peer"):
        links.send(3, torch.zeros(2), (), {}).wait()


def test_the_study_runs_the_ring_over_the_emulated_network(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks.network_study import BACKWARD_ORDER, network_study
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    net = Network(latency=2e-3, bandwidth=125e6, tail_share=0.02, tail_factor=20.0, seed=1)
    try:
        study = network_study(n=4, steps=24, predicted={"p50": 40, "p99": None}, network=net)
    finally:
        del os.environ["LAB_ANSWERS"]
    out = capsys.readouterr().out
    assert "EMULATED network" in out and "k = 96 messages per step" in out and "p50 40 ms (measured" in out
    assert len(study.step_times) == 24 and all(len(v) == 24 for v in study.layer_times.values())
    # every message of the ring went through the network: 2(n - 1) sends per layer per rank, each in the step's record
    for step in (0, 23):
        sends = [e for e in study.events[step] if e.is_send]
        assert len(sends) == 4 * 4 * 2 * 3
        assert all(e.t_end - e.t_start >= net.latency for e in sends)
    assert {tuple(x) for x in study.layers} == {tuple(x) for x in BACKWARD_ORDER}
    slow = study.slow
    assert slow, "with q = 2 % and 96 messages a step, 24 steps meet a slow message (the draw is seeded)"
    for m in slow:           # a slow message is held at least its delay, and the step waits for it
        assert study.step_times[m["step"]] >= m["delay"]
        assert m["delay"] == pytest.approx(20 * net.base(m["bytes"]))
    assert study.predicted_share() == pytest.approx(1 - 0.98 ** 96)
    assert len(study.figure({"p50": 40}).axes) == 2
    step = slow[0]["step"]                              # a step with a slow message: its send is marked
    held = [m for m in slow if m["step"] == step]
    os.environ["NBGRADER_EXECUTION"] = "autograde"      # the static figure of the widget's timeline
    try:
        figure = study.timeline(step)
    finally:
        del os.environ["NBGRADER_EXECUTION"]
    titles = " ".join(t.get_text() for t in figure.texts) + " ".join(ax.get_title() for ax in figure.axes)
    assert f"Training step {step}," in titles and "Slow messages (emulated" in titles
    marks = [t.get_text() for ax in figure.axes for t in ax.texts if "slow: held" in t.get_text()]
    assert len(marks) == len(held) and "(emulated)" in marks[0]
    widget = study.timeline(step)                       # in a live kernel: the widget's frame marks the same
    assert widget.frame.value.count("slow: held") == len(held)
