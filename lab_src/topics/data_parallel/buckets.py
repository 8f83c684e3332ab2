"""Gradient buckets: which parameters' gradients travel together in one all-reduce (q20).

A data-parallel step that reduces each gradient on its own pays a ring's latency 2(n - 1) times per parameter;
one that waits for the whole model's gradients before reducing any overlaps nothing with the backward. Buckets sit
between the two: parameters are grouped, in the order a backward finishes their gradients (the reverse of the
order they are declared in: the last layer's first), into buckets of at most `cap` bytes, and each bucket is
all-reduced as soon as every gradient in it is final, while the backward goes on with earlier layers.

The rule (the contract's, lab_src/exercises.py `bucketed_step`):
- parameters in reverse declaration order; those that need no gradient (frozen) are skipped;
- a parameter joins the open bucket if the bucket stays within `cap` bytes; else the bucket is closed and a new
  one opened with it;
- a parameter larger than `cap` on its own travels alone, in a bucket of its own.

The judge never builds a plan of its own: it checks a plan against three properties that only the rule's plan
has (`plan_problems`): the buckets, read in order, are the trainable parameters in reverse declaration order;
no bucket of two or more parameters is over the cap; no bucket was closed while the next parameter still fit.

The seed's MLP (784-256-128-64-10, float32; 971,048 bytes of gradients) is one bucket under a 1 MiB cap; under
0.5 MiB, fc1's weight (802,816 bytes) goes alone and its bias joins the other layers' bucket.
"""
from __future__ import annotations


def bucket_bytes(params: list[tuple], buckets: list[list[str]]) -> list[int]:
    """The bytes of each bucket. `params`: (name, bytes[, requires_grad]) in declaration order."""
    sizes = {name: nbytes for name, nbytes, *_ in params}
    return [sum(sizes[name] for name in bucket) for bucket in buckets]


def mlp_params(sizes: tuple[int, ...], element: int = 4) -> list[tuple[str, int]]:
    """(name, bytes) of an MLP's parameters in declaration order: fc1.weight, fc1.bias, fc2.weight, ..."""
    out = []
    for i in range(len(sizes) - 1):
        out += [(f"fc{i + 1}.weight", sizes[i] * sizes[i + 1] * element), (f"fc{i + 1}.bias", sizes[i + 1] * element)]
    return out


def plan_problems(params: list[tuple], buckets, cap: int) -> list[str]:
    """What is wrong with `buckets` (lists of parameter names) as the plan of `params` ((name, bytes,
    requires_grad) in declaration order) under `cap` bytes, each problem in a sentence; [] for the rule's plan."""
    if not isinstance(buckets, (list, tuple)) or not all(
            isinstance(b, (list, tuple)) and b and all(isinstance(n, str) for n in b) for b in buckets):
        return [f"reducer.buckets must be a list of non-empty lists of parameter names (str), got "
                f"{str(buckets)[:120]}"]
    sizes = {name: nbytes for name, nbytes, *_ in params}
    trainable = [name for name, _, *rest in params if not rest or rest[0]]
    frozen = [name for name in sizes if name not in trainable]
    flat = [n for b in buckets for n in b]
    unknown = [n for n in flat if n not in sizes]
    if unknown:
        return [f"the buckets name {unknown[0]!r}, which is not a parameter of the stage (its names are those of "
                f"stage.named_parameters(): {', '.join(list(sizes)[:3])}, ...)"]
    problems = []
    held = [n for n in flat if n in frozen]
    if held:
        problems.append(f"{held[0]} is frozen (requires_grad False): it has no gradient to reduce, and a bucket "
                        f"that waits for it never launches; skip it")
    twice = sorted({n for n in flat if flat.count(n) > 1})
    if twice:
        problems.append(f"{twice[0]} is in more than one bucket: each gradient is reduced once")
    missing = [n for n in trainable if n not in flat]
    if missing:
        problems.append(f"{len(missing)} trainable parameters are in no bucket ({missing[0]}, ...): their gradients "
                        f"would never be averaged")
    if problems:
        return problems
    want = trainable[::-1]
    if flat != want:
        if flat == trainable:
            return [f"the buckets follow the declaration order (the forward's: {flat[0]} first). A backward "
                    f"finishes the last layer's gradients first ({want[0]}), so your first bucket waits for the "
                    f"whole backward and nothing overlaps: take the parameters in reverse"]
        i = next(i for i, (a, b) in enumerate(zip(flat, want)) if a != b)
        return [f"parameter {i + 1} of your buckets is {flat[i]}; in reverse declaration order (the order a "
                f"backward finishes gradients) it is {want[i]}"]
    for k, b in enumerate(buckets):
        size = sum(sizes[n] for n in b)
        if len(b) > 1 and size > cap:
            problems.append(f"bucket {k} holds {size:,} B in {len(b)} parameters, over the cap of {cap:,} B: only a "
                            f"single parameter larger than the cap may exceed it, alone")
        if k + 1 < len(buckets):
            nxt = buckets[k + 1][0]
            if size + sizes[nxt] == cap:
                problems.append(f"\"within cap_bytes\" read as strictly below the cap: bucket {k} ({size:,} B) was "
                                f"closed before {nxt} ({sizes[nxt]:,} B), which fills it to exactly the cap of "
                                f"{cap:,} B. A bucket may hold up to the cap itself (size <= cap_bytes): close it "
                                f"only when the next parameter would take it over the cap")
            elif size + sizes[nxt] <= cap:
                problems.append(f"bucket {k} ({size:,} B) was closed while the next parameter, {nxt} "
                                f"({sizes[nxt]:,} B), still fit under the cap of {cap:,} B: a bucket takes "
                                f"parameters until the next one would overflow it")
    return problems
