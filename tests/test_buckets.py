"""The bucket plan of q20's reducer (topics/data_parallel/buckets.py): the three properties the judge reads a plan by
(`plan_problems`) accept the rule's plan, here made by a greedy oracle of the test's own, and name each realistic
wrong plan: forward order, a bucket over the cap, a bucket closed early, a frozen parameter, a missing one."""
from __future__ import annotations

from lab_src.topics.data_parallel.buckets import bucket_bytes, mlp_params, plan_problems
from lab_src.topics.data_parallel.records import SEED_LAYERS, SEED_MLP

MLP = [(name, nbytes, True) for name, nbytes in mlp_params(SEED_MLP)]
REVERSED = [name for name, *_ in reversed(MLP)]


def greedy(params, cap):
    """The contract's rule, written as a student would: the oracle the properties are tested against."""
    buckets, current, size = [], [], 0
    for name, nbytes, trainable in reversed(params):
        if not trainable:
            continue
        if current and size + nbytes > cap:
            buckets.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    return buckets + ([current] if current else [])


def test_the_seeds_mlp_has_the_seeds_four_gradient_sizes():
    by_layer = {}
    for name, nbytes, _ in MLP:
        by_layer[name.split(".")[0]] = by_layer.get(name.split(".")[0], 0) + nbytes
    assert by_layer == {k: 4 * v for k, v in SEED_LAYERS.items()} == \
        {"fc1": 803840, "fc2": 131584, "fc3": 33024, "fc4": 2600}


def test_the_rules_plans_have_the_properties_under_the_issues_caps():
    assert greedy(MLP, 1 << 20) == [REVERSED] and bucket_bytes(MLP, [REVERSED]) == [971048]
    assert greedy(MLP, 1 << 19) == [REVERSED[:-1], ["fc1.weight"]]
    assert bucket_bytes(MLP, greedy(MLP, 1 << 19)) == [168232, 802816]
    assert greedy(MLP, 1 << 16) == [REVERSED[:5], ["fc2.weight"], ["fc1.bias"], ["fc1.weight"]]
    for cap in (1, 40, 2600, 40_000, 1 << 16, 1 << 19, 1 << 20, 1 << 30):
        assert plan_problems(MLP, greedy(MLP, cap), cap) == [], cap


def test_forward_order_is_named():
    plan = [list(reversed(b)) for b in reversed(greedy(MLP, 1 << 20))]
    assert "follow the declaration order" in plan_problems(MLP, plan, 1 << 20)[0]
    swapped = [REVERSED[1:2] + REVERSED[:1] + REVERSED[2:]]
    assert "parameter 1 of your buckets is fc4.weight" in plan_problems(MLP, swapped, 1 << 20)[0]


def test_a_bucket_over_the_cap_and_a_bucket_closed_early_are_named():
    over = [REVERSED]                                  # one bucket under 512 KiB: fc1's weight should go alone
    assert "over the cap of 524,288 B" in plan_problems(MLP, over, 1 << 19)[0]
    early = [[n] for n in REVERSED]                    # every parameter alone under 1 MiB
    assert "still fit under the cap" in plan_problems(MLP, early, 1 << 20)[0]


def test_frozen_missing_unknown_and_repeated_parameters_are_named():
    frozen = [(name, nbytes, not name.startswith("fc2")) for name, nbytes, _ in MLP]
    assert plan_problems(frozen, greedy(frozen, 1 << 20), 1 << 20) == []
    assert "fc2.bias is frozen" in plan_problems(frozen, [REVERSED], 1 << 20)[0]
    assert "in no bucket" in plan_problems(MLP, [REVERSED[:-1]], 1 << 20)[0]
    assert "in more than one bucket" in plan_problems(MLP, [REVERSED, ["fc4.bias"]], 1 << 20)[0]
    assert "not a parameter" in plan_problems(MLP, [["fc9.weight"]], 1 << 20)[0]
    assert "list of non-empty lists" in plan_problems(MLP, "fc1", 1 << 20)[0]
