"""CPU stand-ins the benchmark-engine tests share: a named schedule, a case whose launcher
writes its float32 reference (exactly right), a runtime whose lookup answers with a fixed row,
and a timing function that runs each contender once."""

from __future__ import annotations

import dataclasses

import tiledattention


@dataclasses.dataclass(frozen=True)
class NamedSchedule:
    name: str

    def describe(self) -> str:
        return self.name

    @classmethod
    def from_dict(cls, data):
        return cls(**data)


class ReferenceCase(tiledattention.Case):
    """A case built from ``inputs`` (an object with the inputs, ``reference`` and ``q``; its
    attributes are taken over) whose launcher copies the reference into ``out``;
    ``no_baselines``: the reason the engine must not ask it for torch baselines."""

    def __init__(self, inputs, no_baselines: str):
        import torch

        self.__dict__.update(vars(inputs))
        if not hasattr(self, "out"):
            self.out = torch.empty_like(self.q)
        self.no_baselines = no_baselines

    def launcher(self, schedule):
        return lambda: self.out.copy_(self.reference)

    def error(self, run):
        self.out.fill_(float("nan"))
        run()
        return float((self.out.float() - self.reference).norm() / self.reference.norm())

    def baselines(self):
        raise AssertionError(self.no_baselines)


class FixedRuntime:
    """A runtime whose lookup answers every problem with the schedule "tuned" from
    ``source``."""

    def __init__(self, source: str = "shipped") -> None:
        self.source = source

    def resolution(self, family, problem, device_index):
        return tiledattention.Resolution(schedule=NamedSchedule("tuned"), source=self.source,
                                         detail="row", family=family.name)


def run_once_timing(fn, **kwargs):
    """A ``time_fn`` that runs ``fn`` once and reports 2 ms."""
    from tuner.measure import Timing

    fn()
    return Timing(median_ms=2.0, spread_ms=0.1, mean_ms=2.0, min_ms=1.9, samples=5)

