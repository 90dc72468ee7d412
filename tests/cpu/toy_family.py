"""A minimal second kernel family, registered on import: everything the tuner, the database, the
exporters and the lookup need, and nothing that touches a GPU. ``test_families.py`` drives it
through the whole tool without any change outside this module.

(It is a module of its own, not a fixture, because the simulated executor runs in a spawned
process that unpickles the family by its module and must find it registered there too.)"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any, Mapping

import search_spaces
import tiledattention
from tiledattention import CompileError


def _checked(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    if not isinstance(data, Mapping) or set(data) - names - {"format"}:
        raise ValueError(f"{cls.__name__} takes the fields {sorted(names)}; got {data!r}")
    return {k: v for k, v in data.items() if k != "format"}


@dataclass(frozen=True, kw_only=True)
class ToyProblem:
    n: int
    dtype: str

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be a positive int; got {self.n!r}")
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"dtype must be bf16 or fp16; got {self.dtype!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ToyProblem":
        return cls(**_checked(cls, data))

    def describe(self) -> str:
        return f"n={self.n} {self.dtype}"


@dataclass(frozen=True, kw_only=True)
class ToySchedule:
    block: int = 64
    unroll: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"format": 1, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ToySchedule":
        return cls(**_checked(cls, data))

    @property
    def key(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def replace(self, **changes: Any) -> "ToySchedule":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        return f"block{self.block} x{self.unroll}"


class ToyFamily(tiledattention.Family):
    name = "toy"
    problem_type = ToyProblem
    schedule_type = ToySchedule
    template_modules = (__name__,)
    bucket_fields = ("dtype",)
    distance_terms = ((("n",), 1.0),)

    def default_schedule(self, arch: str, problem: ToyProblem) -> ToySchedule:
        return ToySchedule(block=64 if arch == "sm_90" else 32)

    def flops(self, problem: ToyProblem) -> float:
        return 2.0e9 * problem.n

    def compile(self, problem: ToyProblem, schedule: ToySchedule, arch: str):
        raise CompileError("the toy family has no kernel to compile")

    def case(self, problem: ToyProblem, device_index: int):
        raise CompileError("the toy family has no GPU case")

    def tolerance(self, problem: ToyProblem) -> float:
        return 0.0


def _space(arch: str) -> search_spaces.SearchSpace:
    return search_spaces.SearchSpace(arch, {"block": (32, 64, 128), "unroll": (1, 2, 4)},
                                     ToySchedule())


TOY = tiledattention.register_family(ToyFamily())
TOY_SPACE = search_spaces.register_space(search_spaces.FamilySpace("toy", {"full": _space}))
