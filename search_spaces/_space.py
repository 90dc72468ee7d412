"""What every family's search space shares: the candidate values per schedule field, the
architecture limits static feasibility checks use, and the registry of families' spaces."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterator, Mapping

from tiledattention import InputTypeError, InputValueError, UnknownFamilyError
from tiledattention.tooling import check_arch, generation

__all__ = ["ArchLimits", "arch_limits", "smem_infeasibility", "SearchSpace", "FamilySpace",
           "register_space", "unregister_space", "family_space", "space_for"]


@dataclass(frozen=True)
class ArchLimits:
    """What static feasibility checks need to know about an architecture."""

    generation: str
    smem_per_sm: int  # bytes of shared memory a CTA may use, per SM
    max_num_ctas: int  # largest cluster worth searching


_SMEM_KIB = {"sm_80": 163, "sm_87": 163, "sm_86": 99, "sm_88": 99, "sm_89": 99,
             "sm_120": 99, "sm_121": 99}


def arch_limits(arch: str) -> ArchLimits:
    gen = generation(arch)
    big = gen in ("hopper", "blackwell")
    return ArchLimits(gen, (227 if big else _SMEM_KIB[arch]) * 1024, 2 if big else 1)


def smem_infeasibility(arch: str, need: int) -> str | None:
    """Why a CTA needing ``need`` bytes of shared memory cannot run on ``arch``, or ``None``."""
    limit = arch_limits(arch).smem_per_sm
    if need > limit:
        return (f"shared memory: ~{need // 1024} KiB per CTA exceeds {limit // 1024} KiB per SM "
                f"on {arch}")
    return None


@dataclass(frozen=True)
class SearchSpace:
    """Candidate values per schedule field; fields not listed keep ``base``'s value.
    ``infeasibility(arch, problem, schedule)`` says why a point cannot work (static checks)."""

    arch: str
    choices: Mapping[str, tuple[Any, ...]]
    base: Any
    infeasibility: Callable[[str, Any, Any], str | None] = field(
        default=lambda arch, problem, schedule: None, compare=False)

    def __post_init__(self) -> None:
        known = {f.name for f in fields(self.base)}
        for name, values in self.choices.items():
            if name not in known:
                raise InputValueError(f"search space dimension {name!r} is not a field of "
                                      f"{type(self.base).__name__}")
            if not values:
                raise InputValueError(f"search space dimension {name!r} has no candidate values")

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.choices.values())

    def schedule(self, params: Mapping[str, Any]) -> Any:
        """The schedule of one point, given a value for each dimension."""
        return self.base.replace(**{name: params[name] for name in self.choices})

    def params(self, schedule: Any) -> dict[str, Any]:
        return {name: getattr(schedule, name) for name in self.choices}

    def contains(self, schedule: Any) -> bool:
        return all(getattr(schedule, n) in vals for n, vals in self.choices.items()) and all(
            getattr(schedule, f.name) == getattr(self.base, f.name)
            for f in fields(self.base) if f.name not in self.choices
        )

    def __iter__(self) -> Iterator[Any]:
        names = list(self.choices)
        for values in itertools.product(*(self.choices[n] for n in names)):
            yield self.schedule(dict(zip(names, values)))

    def feasible(self, problem: Any) -> list[Any]:
        return [s for s in self if self.infeasibility(self.arch, problem, s) is None]

    def without(self, *names: str) -> "SearchSpace":
        """The space with dimensions ``names`` fixed at ``base``'s values."""
        choices = {n: v for n, v in self.choices.items() if n not in names}
        return SearchSpace(self.arch, choices, self.base, self.infeasibility)


@dataclass(frozen=True)
class FamilySpace:
    """A kernel family's search spaces: ``spaces[name](arch)`` builds a named space (``"full"``
    is what the tuner searches), ``restrict(space, problem)`` drops dimensions that cannot
    matter for a problem, and ``model_ms(problem, schedule)`` (optional) is an analytic time
    model the simulated backend uses (a family without one gets a generic deterministic model).
    """

    family: str
    spaces: Mapping[str, Callable[[str], SearchSpace]]
    restrict: Callable[[SearchSpace, Any], SearchSpace] = lambda space, problem: space
    model_ms: Callable[[Any, Any], float] | None = None

    def space(self, arch: str, name: str = "full") -> SearchSpace:
        check_arch(arch)
        if name not in self.spaces:
            raise InputValueError(f"space must be one of {sorted(self.spaces)} for the "
                                  f"{self.family} kernel; got {name!r}")
        return self.spaces[name](arch)


_REGISTRY: dict[str, FamilySpace] = {}


def register_space(space: FamilySpace) -> FamilySpace:
    if not isinstance(space, FamilySpace):
        raise InputTypeError(f"register_space() takes a FamilySpace; got {type(space).__name__}")
    _REGISTRY[space.family] = space
    return space


def unregister_space(family: str) -> None:
    _REGISTRY.pop(family, None)


def family_space(family: str) -> FamilySpace:
    """The registered spaces of kernel family ``family``."""
    found = _REGISTRY.get(family)
    if found is None:
        raise UnknownFamilyError(f"no search space is registered for kernel {family!r}; known: "
                                 f"{sorted(_REGISTRY)}")
    return found


def space_for(family: str, arch: str, name: str = "full") -> SearchSpace:
    """The named search space of ``family`` on ``arch``."""
    return family_space(family).space(arch, name)
