"""CPU stand-ins the benchmark-engine tests share: a named schedule, a case whose launcher
writes its float32 reference (exact), a runtime whose lookup is one row, a timing
function that runs each contender once, and a paged case."""

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


def paged_case(problem, seed: int = 0):
    """``tiledattention.core._case.PagedCase`` on the CPU: the caches of ``paged_lengths`` in
    shuffled pages (NaN in the unused ones and past each length, -1 in unused table slots),
    ``seqused``, ``q`` and the float32 reference entry by entry."""
    import types

    import torch

    from tiledattention.core._reference import attention_reference
    from tuner.bench import _paged

    gen = torch.Generator().manual_seed(seed)
    page, hkv, d = problem.page_size, problem.heads_kv, problem.head_dim
    lengths = _paged.case_lengths(problem)
    need = [-(-n // page) for n in lengths]
    order = torch.randperm(sum(need) + 1, generator=gen)
    k_pages = torch.full((sum(need) + 1, page, hkv, d), float("nan")).bfloat16()
    v_pages = torch.full_like(k_pages, float("nan"))
    table = torch.full((problem.batch, max(need)), -1, dtype=torch.int32)
    q = torch.randn(problem.batch, problem.heads_q, problem.seqlen_q, d, generator=gen).bfloat16()
    reference = torch.empty(q.shape)
    used = 0
    for b, (n, pages) in enumerate(zip(lengths, need)):
        ids = order[used:used + pages]
        used += pages
        table[b, :pages] = ids.to(torch.int32)
        k, v = (torch.randn(n, hkv, d, generator=gen).bfloat16() for _ in range(2))
        for i in range(pages):
            rows = slice(i * page, min((i + 1) * page, n))
            k_pages[ids[i], :rows.stop - rows.start] = k[rows]
            v_pages[ids[i], :rows.stop - rows.start] = v[rows]
        one = dataclasses.replace(problem, batch=1, seqlen_k=n, ragged=False, page_size=0)
        reference[b] = attention_reference(q[b:b + 1], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], one)[0]
    return types.SimpleNamespace(problem=problem, q=q, k_pages=k_pages, v_pages=v_pages,
                                 table=table, seqused=torch.tensor(lengths, dtype=torch.int32),
                                 reference=reference, out=torch.empty_like(q))
