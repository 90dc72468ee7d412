"""``tiledtune aot``: compile, for each architecture named, the kernels that the lookup hands
out on a machine with only the shipped table, into one cubin bundle per architecture.

The problems: every row of the shipped tables (its own problem, looked up for each
architecture: its row where the row's architecture is the target, else what the lookup
answers there, normally the default) and the problems named on the command line, each also
at the other batch and key-length patterns (:func:`launch_patterns`). For each,
the schedule is the runtime lookup's answer with the shipped table and no user database
(:func:`tuner.lookup.runtime_resolution`, looked up for the family's plan problem), and the
family's compile-only build of it runs under :func:`~tiledattention.core._compile.capturing`,
which records every kernel it compiles. The images are kept once per (kernel, constants) and
architecture, without the PTX text their debug sections carry (``without_ptx_text``: the
same code in a smaller wheel), and written by :func:`~tiledattention.core._bundles.write_bundle`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

__all__ = ["Job", "BuildReport", "PRESETS", "launch_patterns", "jobs_for", "build_bundles",
           "images_of", "model_calls", "LENGTHS"]

#: ``tiledtune aot --model``'s default prompt and cache lengths: a short prompt (one key tile,
#: unaligned) and the powers of two from 128 (with :func:`launch_patterns`' one key more)
LENGTHS = (100, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
#: the page size a ragged bucket's page copy is shipped for (the copy's tiles are the same for
#: every page of 16 keys or more where a page row of the heads holds 512 elements or more)
SMALL_PAGE = 16


@dataclass(frozen=True)
class Job:
    """One compile: ``family``'s schedule for ``problem`` (a JSON dict) on ``arch``."""

    family: str
    problem: tuple  # sorted (field, value) pairs of the problem's dict
    arch: str

    def describe(self) -> str:
        return f"{self.family} {dict(self.problem)} on {self.arch}"


@dataclass
class BuildReport:
    """What a build wrote: per architecture its file, image count and bytes; failed jobs."""

    bundles: dict[str, tuple[Path, int, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    jobs: int = 0


#: ``tiledtune warm --preset``: (query heads, K/V heads, head dim) of common models
PRESETS = {
    "llama-3-8b": (32, 8, 128), "llama-3-70b": (64, 8, 128), "mistral-7b": (32, 8, 128),
    "qwen2.5-7b": (28, 4, 128), "qwen2.5-72b": (64, 8, 128), "phi-3-mini": (32, 32, 96),
}


def model_calls(heads_q: int, heads_kv: int, head_dim: int, *, dtypes: Sequence[str],
                batches: Sequence[int], lengths: Sequence[int],
                training: bool) -> list[tuple[str, Any]]:
    """``(operation, problem)`` of a model's calls: at each batch size, dtype and length ``L``
    a causal prefill of ``L`` tokens and a decode step (one query row over ``L`` keys); with
    ``training`` also the forward and backward of a training call of ``L`` tokens."""
    from tiledattention import Problem

    calls = []
    for dtype in dtypes:
        for batch in batches:
            for n in lengths:
                shape = dict(batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                             head_dim=head_dim, dtype=dtype)
                prefill = Problem(**shape, seqlen_q=n, seqlen_k=n, causal=True)
                calls += [("sdpa", prefill),
                          ("sdpa", Problem(**shape, seqlen_q=1, seqlen_k=n, causal=False))]
                if training:
                    calls += [("sdpa_with_lse", prefill), ("sdpa_backward", prefill)]
    return calls


def jobs_for(archs: Sequence[str], problems: Iterable[tuple[str, Any]],
             shipped: bool = True, calls: Iterable[tuple[str, Any]] = ()) -> list[Job]:
    """The jobs, on every architecture of ``archs``: each of ``problems`` (``(family name,
    problem)``), with ``shipped`` each shipped row's problem, and each of ``calls``
    (``(operation, problem)``, :func:`model_calls`) with the family the dispatch picks for it
    on that architecture."""
    from tiledattention import ARCHITECTURES, choose_family, shipped_table

    named = list(problems)
    if shipped:
        for arch in ARCHITECTURES:
            table = shipped_table(arch)
            if table is not None:
                named += [(row.family, row.problem) for row in table.rows()]
    jobs = [Job(family, tuple(sorted(each.to_dict().items())), arch)
            for family, problem in named for each in launch_patterns(problem) for arch in archs]
    jobs += [Job(choose_family(arch, each, operation).name,
                 tuple(sorted(each.to_dict().items())), arch)
             for operation, problem in calls for each in launch_patterns(problem)
             for arch in archs]
    return list(dict.fromkeys(jobs))


def launch_patterns(problem: Any) -> list:
    """``problem`` and its variants whose launches compile differently: both batch patterns
    (batch 1 is compiled in as a constant, ``ct.launch``'s signature; the image of batch 2
    serves every batch of more than one) and, unless packed, both key-length patterns (a key
    count that is a multiple of the key tile is compiled in: the forward's ``EVEN_K``): one
    key more where the count is a multiple of 32 (every key tile's multiple could be), the
    count rounded up to a multiple of 256 where it is not one (square problems stay
    square)."""
    lengths = [problem.seqlen_k]
    if not problem.ragged and problem.seqlen_k > 1:
        k = problem.seqlen_k
        lengths += [k + 1] if k % 32 == 0 else []
        lengths += [-(-k // 256) * 256] if k % 256 else []
    found = []
    for batch in (problem.batch, 1 if problem.batch > 1 else 2):
        for k in lengths:
            q = k if problem.seqlen_q == problem.seqlen_k else problem.seqlen_q
            found.append(dataclasses.replace(problem, batch=batch, seqlen_q=q, seqlen_k=k))
    return found


def images_of(job: Job) -> list[dict]:
    """Compile ``job`` (the lookup's schedule for it) and return its images (JSON-ready dicts
    with the cubin bytes). Runs in a worker process."""
    from tiledattention import get_family
    from tiledattention.tooling import (capturing, compile_mixed_tables, compile_page_copy,
                                        compile_ragged_clear, kernel_name,
                                        kernel_symbol, module_identity, param_specs,
                                        without_ptx_text)

    from ..lookup import STUDY_DEVICE, runtime_resolution, shipped_rows

    family = get_family(job.family)
    problem = family.problem_type.from_dict(dict(job.problem))
    rows = shipped_rows(family, job.arch)
    # the study's device (an H100) and one of no name: a family whose defaults take the
    # device's name (decode) answers some problems on the two apart
    schedules = []
    for name in (STUDY_DEVICE["name"], ""):
        schedule = runtime_resolution(family, problem, rows, job.arch, name).schedule
        if schedule not in schedules:
            schedules.append(schedule)
    with capturing() as builds:
        for schedule in schedules:
            family.compile_launchable(problem, schedule, job.arch)
        if getattr(problem, "ragged", False):  # a packed forward's clear of uncovered rows
            compile_ragged_clear(problem, job.arch)
            # the copy a paged call of the bucket makes first where its kernels read no page
            # smaller than a key tile in place (pages of 16 keys: the smallest they take)
            paged = dataclasses.replace(problem, page_size=SMALL_PAGE)
            if family.reads_pages and not all(family.reads_pages_with(paged, s)
                                              for s in schedules):
                compile_page_copy(paged, job.arch)
            if family.reads_pages:  # a mixed step's index tables (int32 or int64 offsets)
                for offsets in ("int32", "int64"):
                    compile_mixed_tables(problem.batch, job.arch, offsets)
    images = []
    for kernel, args, _, cubin in builds:
        # the family's template, and a helper kernel's own module (the work table, the clear)
        modules = list(dict.fromkeys(family.template_modules
                                     + (kernel._annotated_function.pyfunc.__module__,)))
        images.append({"kernel": kernel_name(kernel), "modules": modules,
                       "identity": module_identity(*modules),
                       "params": param_specs(kernel, args), "symbol": kernel_symbol(cubin),
                       "family": family.name, "cubin": without_ptx_text(cubin)})
    return images


def _run(job: Job) -> tuple[Job, list[dict] | str]:
    try:
        return job, images_of(job)
    except Exception as exc:  # a job that does not compile is reported, the others go on
        return job, f"{type(exc).__name__}: {exc}"


def _key(image: dict) -> tuple:
    return (image["kernel"], json.dumps(image["params"], sort_keys=True))


def build_bundles(jobs: Sequence[Job], out_dir: Path, *, processes: int = 1,
                  progress: Callable[[Job, str | None], None] | None = None,
                  tag: str = "") -> BuildReport:
    """Run ``jobs`` in ``processes`` worker processes and write ``cubins-<arch>.zip`` (with a
    ``tag``, ``cubins-<arch>-<tag>.zip``) into ``out_dir`` for each architecture with images
    (an image compiled twice is kept once)."""
    from tiledattention.tooling import toolchain_versions, write_bundle

    report = BuildReport(jobs=len(jobs))
    by_arch: dict[str, dict[tuple, dict]] = {}
    results: Iterable[tuple[Job, Any]]
    if processes > 1 and len(jobs) > 1:
        pool = ProcessPoolExecutor(max_workers=processes)
        results = pool.map(_run, jobs)
    else:
        pool = None
        results = map(_run, jobs)
    try:
        for job, images in results:
            if isinstance(images, str):
                report.failures.append(f"{job.describe()}: {images}")
            else:
                kept = by_arch.setdefault(job.arch, {})
                for image in images:
                    kept.setdefault(_key(image), image)
            if progress is not None:
                progress(job, images if isinstance(images, str) else None)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    for arch, images in sorted(by_arch.items()):
        path = out_dir / f"cubins-{arch}{'-' + tag if tag else ''}.zip"
        count = write_bundle(path, arch, images.values(), toolchain_versions())
        report.bundles[arch] = (path, count, os.path.getsize(path))
    return report
