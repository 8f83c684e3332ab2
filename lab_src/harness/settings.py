"""A case's settings, typed per kind: the numbers its ranks run on and its judge reads, declared once with their defaults.

    @dataclass(frozen=True)
    class BucketsSettings(Settings):       # in the topic's records.py, beside the kind's record
        cap: int
        steps: int = 3

    Kind("kind_buckets", ..., settings="records:BucketsSettings")     # the kind's declaration names it
    s = settings_of(case)                  # rank side and parent side alike: BucketsSettings(cap=..., steps=3)

A case still carries its settings as a plain dict (`Case.settings`: it travels as JSON in the launch's spec), and
`settings_of` reads it as the kind's class: a setting the class does not declare, or a required one missing, raises
naming the kind and what it declares, so that a misspelt key cannot fall back to a default on one side only. A kind
that declares no class takes no settings. Torch-free: the trusted grader reads them too.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """The settings of a kind that takes none; each kind's class adds its fields."""

    @classmethod
    def of(cls, plain: dict | None, kind: str = "") -> "Settings":
        plain = dict(plain or {})
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(plain) - set(names))
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in plain
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if unknown or missing:
            said = ", ".join(names) if names else "none"
            raise TypeError(f"a case of kind {kind or '?'!r} " + (f"has no setting {', '.join(unknown)}" if unknown else
                            f"needs the setting {', '.join(missing)}") + f": its settings ({cls.__name__}) are {said}")
        return cls(**plain)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def degrees(self, case) -> dict[str, int]:
        """The case's ranks as named dimensions (comm/mesh.py `Mesh`): the one place a kind says how its ranks are
        laid out. By default one pipeline of the case's ranks."""
        return {"pp": case.stages}


def degrees_of(case) -> dict[str, int]:
    """The named degrees of a case, checked: whole numbers whose product is the case's ranks."""
    dims = settings_of(case).degrees(case)
    product = 1
    for v in dims.values():
        product *= v
    if product != case.stages:
        raise ValueError(f"case {case.label!r} (kind {case.kind!r}) runs on {case.stages} ranks, but its degrees {dims} "
                         f"make {product}")
    return dims


@dataclass(frozen=True)
class GridSettings(Settings):
    """A data x pipeline grid of all the case's ranks (comm/grid.py): its degrees are the configuration's."""

    def degrees(self, case) -> dict[str, int]:
        return {"dp": case.config.dp_size, "pp": case.config.num_stages}


@dataclass(frozen=True)
class PerturbSettings(Settings):
    """A pipelined step's case (the core's `pipeline` kind, q15's `interleaved`)."""
    perturb: bool = False       # rank 0 changes its stage's embedding once built, by an amount drawn outside the ranks


def settings_class(kind: str) -> type[Settings]:
    """The settings class a case kind's declaration names (harness/kinds), or `Settings` (none)."""
    from lab_src.harness.kinds import declared_class
    return declared_class(kind, "settings", Settings)


def settings_of(case) -> Settings:
    """A case's settings, read as its kind's class."""
    return settings_class(case.kind).of(case.settings, case.kind)
