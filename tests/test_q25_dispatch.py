"""q25: a mixture of experts with expert parallelism: route, dispatch and combine with all-to-alls, the experts'
gradients scaled for the layout.

Fast, in this process: the routing rule (capacity, first choices first) against a hand count; one process's MoE
against a dense loop; the recorder's split record of an all-to-all-single; the traffic formula and the prediction;
the judge's factors; the figure. Multi-process: the reference passes the visible check (bytes per rank per layer
equal to what the rule sends off-rank, at ep = 2 and ep = 2 x dp = 2), and the hidden tests' 5 cases (ep = 2 and 4);
every realistic mistake, graded through the hidden tests in one launch, loses the right parts with its message.
"""
from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
import torch

from grader.cohort.answers import answer

pytestmark = pytest.mark.q25


def _reference_module(reference):
    module = types.ModuleType("q25_reference")
    path = reference["q25"]
    exec(compile(Path(path).read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - the reference answer
    return module


def _router(h=8, E=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    router = torch.nn.Linear(h, E).double()
    with torch.no_grad():
        router.weight.copy_(torch.randn(E, h, generator=g))
        router.bias.zero_()
    return router, g


def test_the_rule_drops_first_choices_last_and_the_reference_route_is_the_rule(reference):
    from grader.hidden.q25_dispatch import route_rule
    from lab_src.topics.experts.records import capacity
    ref = _reference_module(reference)
    assert capacity(16, 2, 4, 1.0) == 8 and capacity(16, 2, 4, 1.25) == 10 and capacity(16, 1, 2, 0.0) is None
    for seed in range(6):
        router, g = _router(seed=seed)
        x = torch.randn(16, 8, generator=g, dtype=torch.float64)
        for k, cf in [(1, 0.0), (1, 1.0), (2, 1.0), (2, 0.5), (2, 1.25)]:
            want = route_rule(x, router, k, cf)
            got = ref.route(x, router, k, cf)
            assert torch.equal(got.experts, want.experts) and torch.equal(got.keep, want.keep)
            assert torch.equal(got.weights, want.weights)
            # by hand: every first choice in token order, then every second choice
            cap = capacity(16, k, 4, cf)
            taken, keep = [0] * 4, torch.ones(16, k, dtype=torch.bool)
            for j in range(k):
                for t in range(16):
                    e = int(want.experts[t, j])
                    keep[t, j] = cap is None or taken[e] < cap
                    taken[e] += int(bool(keep[t, j]))
            assert torch.equal(keep, want.keep)
            if cap is not None and k == 2:
                # a first choice is dropped only where its expert took cap first choices before it
                assert all(taken[e] <= cap for e in range(4))


def test_the_properties_the_visible_check_holds_route_to_accept_the_rule_alone():
    """The student package has no rule; the visible check holds the answer's routing to routing_properties. The rule's
    routing shows them all; each way of missing the rule is named."""
    from grader.hidden.q25_dispatch import route_rule
    from lab_src.topics.experts.judge import routing_properties, token_major_keep
    from lab_src.topics.experts.records import capacity
    for seed in range(6):
        router, g = _router(seed=seed)
        x = torch.randn(16, 8, generator=g, dtype=torch.float64)
        for k, cf in [(1, 0.0), (1, 1.0), (2, 1.0), (2, 0.5), (2, 1.25), (4, 1.0)]:
            w = route_rule(x, router, k, cf)

            def said(experts=w.experts, weights=w.weights, keep=w.keep):
                return routing_properties(x, router, k, cf, experts, weights, keep)
            assert said() == []
            cap = capacity(16, k, 4, cf)
            if cap is not None and not torch.equal(token_major_keep(w.experts, k, 4, cap), w.keep):
                assert "token by token" in said(keep=token_major_keep(w.experts, k, 4, cap))[0]
            if not bool(w.keep.all()):
                assert "nothing is dropped" in said(keep=torch.ones_like(w.keep))[0] if cap is None else \
                    "more than the capacity" in said(keep=torch.ones_like(w.keep))[0]
                more = w.keep.clone()
                more[w.keep.nonzero()[-1].tolist()[0], w.keep.nonzero()[-1].tolist()[1]] = False
                assert "fewer than its capacity" in said(keep=more)[0]
            if 1 < k < 4:                                         # with k = E the weights add up to 1 already
                assert "renormalised" in said(weights=w.weights / w.weights.sum(1, keepdim=True))[0]
            if k > 1:
                assert "top" in said(experts=w.experts.flip(1), weights=w.weights.flip(1))[0]
                assert "twice" in said(experts=w.experts[:, :1].expand(-1, k).contiguous())[0]
            if k < 4:
                low = router(x).argsort(dim=1)[:, :k]            # the k least likely experts
                assert "top" in said(experts=low)[0]
            assert "not (16" in said(keep=w.keep[:-1])[0]


def test_the_opening_figures_numbers_are_the_rules():
    """figure.py EXAMPLE is recorded (the student package holds no rule): the grader's rule gives it again."""
    from grader.hidden.q25_dispatch import route_rule
    from lab_src.topics.experts.figure import EXAMPLE
    from lab_src.topics.experts.records import capacity
    g = torch.Generator().manual_seed(0)
    router = torch.nn.Linear(16, 8)
    with torch.no_grad():
        router.weight.copy_(torch.randn(8, 16, generator=g))
        router.bias.zero_()
    sent, load, dropped = [[0] * 4 for _ in range(4)], [[0] * 4 for _ in range(8)], []
    for r in range(4):
        x = torch.randn(64, 16, generator=g) + 0.5 * torch.randn(1, 16, generator=g)
        with torch.no_grad():
            routing = route_rule(x, router, 2, 1.0)
        for e in routing.experts[routing.keep].tolist():
            sent[r][e // 2] += 1
            load[e][r] += 1
        dropped.append(int((~routing.keep).sum()))
    assert EXAMPLE == {"sent": sent, "load": load, "dropped": dropped, "capacity": capacity(64, 2, 8, 1.0)}


def test_one_process_moe_is_a_dense_loop_over_tokens():
    from lab_src.pipeline.config import LabConfig
    from grader.hidden.q25_dispatch import route_rule
    from lab_src.topics.experts.moe import MoeModel, one_process_moe
    cfg = LabConfig(num_layers=1, hidden_size=8, num_heads=2, seq_len=4, vocab_size=16, num_stages=1, seed=3)
    block = MoeModel(cfg, 4, range(4), "float64").blocks[0]
    x = torch.randn(12, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    routing = route_rule(x, block.router, 2, 0.75)
    got = one_process_moe(block, x, routing)
    for t in range(12):
        want = sum((routing.weights[t, j] * block.experts[str(int(routing.experts[t, j]))](x[t])
                    for j in range(2) if routing.keep[t, j]), torch.zeros(8, dtype=torch.float64))
        assert torch.allclose(got[t], want, rtol=0, atol=1e-14)
    assert int((~routing.keep).sum()) > 0


def test_the_prediction_and_the_traffic_formula():
    from lab_src.topics.experts.records import even_bytes_per_layer, prediction_wanted
    # 2 T k (ep - 1)/ep rows of h float32 elements: ep = 4, T = 512, k = 2, h = 64
    assert prediction_wanted() == {"forward_bytes": 393_216, "backward_bytes": 393_216, "undivided_factor": 8}
    assert even_bytes_per_layer(512, 2, 64, 2, 4) == 262_144           # ep = 2: half the rows leave
    assert even_bytes_per_layer(16, 1, 16, 1, 8) == 0                   # one rank: nothing leaves it


def test_the_judge_names_the_factors():
    from lab_src.topics.experts.judge import factor_of, factor_words
    w = [torch.randn(3, 4, dtype=torch.float64), torch.randn(5, dtype=torch.float64)]
    assert factor_of([(2 * t, t) for t in w]) == pytest.approx(2)
    assert factor_of([(2 * w[0], w[0]), (3 * w[1], w[1])]) is None
    assert factor_words(4, 4, 1, "experts").startswith("4x one process's (ep = 4): not divided by the expert-parallel")
    assert factor_words(0.25, 4, 1, "experts").startswith("1/4 of one process's (ep = 4): divided by the expert")
    assert factor_words(4, 2, 2, "experts").startswith("4x one process's (ep x dp = 4): summed over the dp group")


def test_the_recorder_keeps_an_all_to_all_singles_splits():
    from lab_src.comm.collectives import split_record
    x = torch.zeros(7, 3, dtype=torch.float64)
    rec = split_record({"input": x, "output": torch.zeros(5, 3, dtype=torch.float64), "input_split_sizes": [4, 3],
                        "output_split_sizes": [4, 1]}, (2, 3))
    assert rec == {"in": [4, 3], "out": [4, 1], "row_bytes": 24, "integer": False, "members": [2, 3]}
    counts = split_record({"input": torch.zeros(2, 2, dtype=torch.long), "output": torch.zeros(2, 2, dtype=torch.long)},
                          (0, 1))
    assert counts["in"] == [1, 1] and counts["integer"] and counts["row_bytes"] == 16
    # a rank that sends no row still says how wide a row is (what tells tokens from counts)
    empty = split_record({"input": torch.zeros(0, 3, dtype=torch.float64), "output": torch.zeros(2, 3,
                          dtype=torch.float64), "input_split_sizes": [0, 0], "output_split_sizes": [2, 0]}, (0, 1))
    assert empty["row_bytes"] == 24 and empty["in"] == [0, 0]


def test_the_figures():
    from lab_src.checks.q25_dispatch import example_figure
    from lab_src.topics.experts.figure import example_routing
    r = example_routing()
    assert sum(map(sum, r["sent"])) + sum(r["dropped"]) == 4 * 64 * 2
    assert all(sum(load) <= r["capacity"] * 4 for load in r["load"])
    assert len(example_figure().axes) == 3


def test_reference_passes_the_visible_check(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q25")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join(capsys.readouterr().out.split())
    assert report.ok and "q25: all checks passed" in out, out
    # per rank: 2 counts exchanges, 4 all-to-alls of tokens forward and 4 backward; the bytes sent to other ranks
    # forward, what the routing needs, backward; dropped
    assert "0 0,0 [0, 1] 2 4 4 6,528 6,528 6,528 13" in out and "1 0,1 [2, 3] 2 4 4 6,528 6,528 6,528 9" in out
    assert "3 1,1 [2, 3] 2 4 4 8,192 8,192 8,192 0" in out
    assert "forward_bytes 393,216 right" in out and "undivided_factor 8 right" in out
    from lab_src.checks.q25_dispatch import traffic_figure
    assert traffic_figure(report) is not None
    # the timeline: every collective of each rank, named per step and phase; its legend names the two kinds drawn
    from lab_src.topics.experts.figure import moe_view
    from lab_src.views.saved import draw
    view = moe_view(report.run.outcomes[0])
    assert [w for w, _ in view["sections"]][:3] == ["step 0: fwd", "bwd", "sync"]
    os.environ["NBGRADER_EXECUTION"] = "autograde"        # the static figure, as while autograding
    try:
        fig = draw(view, "q25")
    finally:
        del os.environ["NBGRADER_EXECUTION"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["all-reduce (torch.distributed)",
                                                                  "all-to-all (torch.distributed)"]


def test_the_visible_check_holds_a_wrong_route_to_the_rule_and_judges_the_rest_by_it(in_tmp, no_leftovers, capsys):
    """The student package has no rule: a route that takes the capacity token by token is named by the properties
    its routing breaks, and dispatch, combine and the gradients, right for the routing it made, are judged right."""
    from lab_src.checks import check
    ref = {k: str(v) for k, v in __import__("grader.reference", fromlist=["x"]).reference_sources().items()}
    path = in_tmp / "q25_wrong.py"
    path.write_text(answer("q25_capacity_token_major"))
    (in_tmp / "map.json").write_text(json.dumps({**ref, "q25": str(path)}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q25")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join((capsys.readouterr().out + str(report)).split())
    assert not report.ok and "layer 0: route took the capacity token by token" in out, out
    assert "1 problem" in out, out
    # the case with a capacity: outputs, gradients and the curve as one process routed as the answer routes, the
    # all-to-alls right for that routing, the routing wrong
    first = out.split("capacity 1.0 (drops)")[-1].split("ep = 2 x dp = 2")[0]
    assert first.count("as one process") == 3 and "their bytes: right" in first, first
    assert "how many and which: wrong (above)" in first, first


# name: (the answer, its fraction of the points, what its feedback must say); parts: forward, gradients, training,
# traffic, routing (5 cases each), prediction (3 figures), a sixth each
MISTAKES = {
    "reference": (None, 1.0, "28 of 28 hidden checks passed"),
    "q25_counts_not_exchanged": (answer("q25_counts_not_exchanged"), 0.8333,
                                 "0 all-to-alls of counts (integers) in the forward of 2 MoE layers"),
    "q25_combine_unweighted": (answer("q25_combine_unweighted"), 0.5,
                               "combine returns the experts' outputs summed without the router's weights"),
    # the 3 cases with a capacity: forward, gradients, training, routing
    "q25_capacity_token_major": (answer("q25_capacity_token_major"), 0.6, "route took the capacity token by token"),
    "q25_grads_not_divided": (answer("q25_grads_not_divided"), 0.6667,
                              "the experts' gradients are 2x one process's (ep = 2): not divided by the expert"),
    "q25_divided_twice": (answer("q25_divided_twice"), 0.6667,
                          ("the experts' gradients are 1/2 of one process's (ep = 2): divided by the "
                           "expert-parallel size twice")),
    "q25_wrong_order": (answer("q25_wrong_order"), 0.5, "combine puts the right outputs in the wrong rows"),
    # values right; the tokens' all-to-alls not recorded: the traffic part in every case
    "q25_functional_collectives": (answer("q25_functional_collectives"), 0.8333,
                                   "torch's functional collectives (all_to_all_single_autograd) are not recorded"),
    "q25_not_divided_local_rows": (answer("q25_not_divided_local_rows"), 0.5556,
                                   "that counts the rows a rank sends itself too"),
}

# written otherwise, valid: every point (only behaviour is judged)
VALID = {
    # the capacity without a loop: each assignment's place in its expert's queue, choice-major, by a cumulative sum
    "vectorized_route": [("""        taken = [0] * E
        for j in range(k):                       # every first choice, then every second choice
            for t in range(x.shape[0]):
                e = int(experts[t, j])
                if taken[e] < cap:
                    taken[e] += 1
                else:
                    keep[t, j] = False""",
                          """        onehot = torch.nn.functional.one_hot(experts.t().reshape(-1), E)
        place = (onehot.cumsum(0) * onehot).sum(-1) - 1
        keep = (place < cap).reshape(k, -1).t()""")],
    # one flat buffer per group, divided before the sum
    "flat_sync": [("""    world = groups.ep_size * groups.dp_size
    for p in dense:                  # every rank's own tokens: the mean over all ranks
        dist.all_reduce(p.grad, group=groups.world)
        p.grad /= world
    for p in experts:                # the all-to-all's backward summed the ep ranks' terms: divide, and average over dp
        dist.all_reduce(p.grad, group=groups.dp)
        p.grad /= groups.ep_size * groups.dp_size""",
                   """    world = groups.ep_size * groups.dp_size
    for params, group in ((dense, groups.world), (experts, groups.dp)):
        flat = torch.cat([p.grad.reshape(-1) for p in params]) / world
        dist.all_reduce(flat, group=group)
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))""")],
}


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q25"]).read_text()
    texts = {name: text if text is not None else right for name, (text, _, _) in MISTAKES.items()}
    for name, edits in VALID.items():
        texts[name] = right
        for old, new in edits:
            assert old in texts[name], (name, old)
            texts[name] = texts[name].replace(old, new)
    graded = grade_answers("q25", texts, reference, tmp_path)
    wrong = []
    for name, (_, fraction, says) in MISTAKES.items():
        got, lines = graded[name]
        if got != pytest.approx(fraction, abs=1e-4) or says not in " ".join("\n".join(lines).split()):
            wrong.append((name, got, lines))
    wrong += [(name, graded[name][0], graded[name][1]) for name in VALID if graded[name][0] != 1.0]
    assert not wrong, wrong
