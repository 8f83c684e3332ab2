"""The bucket plan of q20's reducer (topics/data_parallel/buckets.py): the seed's MLP under the caps the issue
names, the order a backward finishes gradients in, a tensor over the cap alone, frozen parameters skipped."""
from __future__ import annotations

import pytest

from lab_src.topics.data_parallel.buckets import bucket_bytes, mlp_params, plan_buckets
from lab_src.topics.data_parallel.records import SEED_LAYERS, SEED_MLP

MLP = mlp_params(SEED_MLP)
REVERSED = [name for name, _ in reversed(MLP)]


def test_the_seeds_mlp_has_the_seeds_four_gradient_sizes():
    by_layer = {}
    for name, nbytes in MLP:
        by_layer[name.split(".")[0]] = by_layer.get(name.split(".")[0], 0) + nbytes
    assert by_layer == {k: 4 * v for k, v in SEED_LAYERS.items()} == \
        {"fc1": 803840, "fc2": 131584, "fc3": 33024, "fc4": 2600}


def test_one_mib_is_one_bucket_in_the_order_a_backward_ends():
    assert plan_buckets(MLP, 1 << 20) == [REVERSED]
    assert bucket_bytes(MLP, plan_buckets(MLP, 1 << 20)) == [971048]


def test_half_a_mib_splits_fc1s_weight_from_its_bias():
    plan = plan_buckets(MLP, 1 << 19)
    assert plan == [REVERSED[:-1], ["fc1.weight"]]
    assert bucket_bytes(MLP, plan) == [168232, 802816]


def test_a_small_cap_closes_a_bucket_before_it_overflows_and_a_large_tensor_goes_alone():
    plan = plan_buckets(MLP, 40_000)
    # 40 + 2,560 + 256 + 32,768 + 512 = 36,136 bytes fit; fc2's weight (131,072) would not, and is over the cap
    assert plan == [["fc4.bias", "fc4.weight", "fc3.bias", "fc3.weight", "fc2.bias"], ["fc2.weight"],
                    ["fc1.bias"], ["fc1.weight"]]
    assert all(b <= 40_000 for b, names in zip(bucket_bytes(MLP, plan), plan) if len(names) > 1)
    assert [n for bucket in plan for n in bucket] == REVERSED        # every parameter once, in backward order


def test_frozen_parameters_are_skipped():
    frozen = [(name, nbytes, not name.startswith("fc2")) for name, nbytes in MLP]
    plan = plan_buckets(frozen, 1 << 20)
    assert plan == [[n for n in REVERSED if not n.startswith("fc2")]]


def test_a_cap_must_be_positive():
    with pytest.raises(ValueError, match="above 0"):
        plan_buckets(MLP, 0)
