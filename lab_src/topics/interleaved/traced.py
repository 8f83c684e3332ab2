"""Cutting a model into pipeline stages by tracing it (torch.fx), at cut points a person names.

Q5 deals whole blocks out to stages, because the lab's model is a list of blocks and its stage class
builds exactly those. Tracing drops that assumption. `torch.fx.symbolic_trace` runs the model's forward
once on stand-in values and records every operation as a node of a graph, each node tagged with the
modules it ran in (`node.meta["nn_module_stack"]`). Naming where each stage begins is then enough:

    part = split_by_tracing(build_model(cfg), ["blocks.3", "blocks.6"])    # 3 stages
    part.stages[1]            # a GraphModule holding blocks 3-5, built by torch.fx's split_module
    part.blocks(1)            # [3, 4, 5]
    part.crossing(tokens)     # per cut, the shapes of the tensors that travel across it

Every node goes to the stage of the last cut point the forward has reached, and `split_module` builds
one GraphModule per stage whose inputs and outputs are exactly the values that cross a cut: one
activation between two blocks, two tensors if the cut falls inside a block's residual branch.

The stages share their parameters with the traced model (the same tensors, under names such as
``blocks_3_qkv.weight``); `param_names` maps them back to the model's own names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.fx import GraphModule, symbolic_trace
from torch.fx.passes.split_module import split_module


class CutPointError(ValueError):
    """A cut point that names no module of the model, or cut points in an order the forward never takes."""


@dataclass
class TracedPartition:
    model: nn.Module
    cut_points: list[str]
    graph: GraphModule                  # the whole model, traced
    split: GraphModule                  # calls submod_0, submod_1, ... in turn
    stages: list[GraphModule] = field(default_factory=list)

    def param_names(self, stage: int) -> list[str]:
        """The model's names of the parameters stage `stage` holds (the same tensors as the model's)."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        return sorted(names[id(p)] for p in self.stages[stage].parameters())

    def blocks(self, stage: int) -> list[int]:
        """The blocks that stage `stage` holds all or part of."""
        return sorted({int(m.group(1)) for n in self.param_names(stage) if (m := re.match(r"blocks\.(\d+)\.", n))})

    def pieces(self, stage: int) -> list[str]:
        """'embed', 'blocks.3', 'head', ...: the model's pieces that stage `stage` holds parameters of."""
        return sorted({".".join(n.split(".")[:2]) if n.startswith("blocks.") else n.split(".")[0]
                       for n in self.param_names(stage)}, key=_piece_order)

    def inputs(self, stage: int) -> list[str]:
        """The names of the values stage `stage` receives (its graph's placeholders)."""
        return [n.name for n in self.stages[stage].graph.nodes if n.op == "placeholder"]

    def crossing(self, example) -> list[list[tuple]]:
        """For each cut, the shapes of the tensors that travel across it, from running `example` through."""
        seen: list[list[tuple]] = [[] for _ in self.stages]
        hooks = [stage.register_forward_pre_hook(lambda mod, args, i=i: seen[i].extend(
                 tuple(a.shape) for a in args if isinstance(a, torch.Tensor))) for i, stage in enumerate(self.stages)]
        try:
            with torch.no_grad():
                self.split(example)
        finally:
            for h in hooks:
                h.remove()
        return seen[1:]


def _piece_order(name: str) -> tuple:
    return (0, 0) if name == "embed" else (2, 0) if name == "head" else (1, int(name.split(".")[1]))


def split_by_tracing(model: nn.Module, cut_points: list[str]) -> TracedPartition:
    """Trace `model` and cut it into len(cut_points) + 1 stages: stage i + 1 begins where the forward
    enters the module named `cut_points[i]` ("blocks.3", or a part of one, "blocks.3.mlp_norm")."""
    cut_points = [str(c) for c in cut_points]
    modules = dict(model.named_modules())
    unknown = [c for c in cut_points if c not in modules or c == ""]
    if unknown:
        tops = ", ".join(n for n, _ in model.named_children())
        raise CutPointError(f"no module named {unknown[0]!r} in the model: cut points are module names such as "
                            f"'blocks.3' (the model's parts: {tops}, each block's parts such as 'blocks.3.mlp_norm')")
    if len(set(cut_points)) != len(cut_points):
        raise CutPointError(f"a cut point appears twice in {cut_points}: that stage would be empty")
    graph = symbolic_trace(model)
    nodes = list(graph.graph.nodes)
    first_at = {}
    for i, node in enumerate(nodes):
        for c in cut_points:
            if c not in first_at and c in (node.meta.get("nn_module_stack") or {}):
                first_at[c] = i
    never = [c for c in cut_points if c not in first_at]
    if never:
        raise CutPointError(f"the forward never runs {never[0]!r}: a cut there would cut nothing")
    positions = [first_at[c] for c in cut_points]
    if positions != sorted(positions):
        raise CutPointError(f"cut points must come in the order the forward reaches them; {cut_points} does not "
                            f"(reached in the order {sorted(cut_points, key=first_at.get)})")
    if positions[0] <= next(i for i, n in enumerate(nodes) if n.op != "placeholder"):
        raise CutPointError(f"a cut at {cut_points[0]!r} leaves stage 0 nothing to do: the forward starts there")
    part_of = {}
    for i, node in enumerate(nodes):
        part_of[node] = sum(1 for at in positions if at <= i)
    split = split_module(graph, model, lambda node: part_of[node])
    stages = [getattr(split, f"submod_{i}") for i in range(len(cut_points) + 1)]
    return TracedPartition(model, cut_points, graph, split, stages)
