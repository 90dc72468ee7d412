"""Running a whole ``tiledtune bench`` grid: the rows' environment (device, versions, clocks),
the matrix-product and copy ceilings, and :func:`run_grid` over every point of any grid."""

from __future__ import annotations

import dataclasses
import subprocess
from typing import Any, Callable, Mapping

from ._contenders import make_contenders
from ._measure import BenchSettings, _release, measure_point
from ._report import COPY_BYTES, MATMUL_SIZE, BenchResult

__all__ = ["copy_gbps", "environment", "gpu_clocks", "matmul_tflops", "run_grid"]


def matmul_tflops(settings: BenchSettings, n: int = MATMUL_SIZE) -> float:
    """The bf16 matrix-product rate (``n``³, ``torch.matmul`` into a preallocated output): the
    ceiling attention's TFLOP/s is read against, measured like every contender."""
    import torch

    timing = _time_matmul(settings, n)
    _release(torch.device("cuda", settings.device))  # the operands are gone by now
    return 2 * n ** 3 / (timing.median_ms * 1e-3) / 1e12


def _time_matmul(settings: BenchSettings, n: int):
    import torch

    from ..measure import time_cuda

    gen = torch.Generator(device="cuda").manual_seed(settings.seed)
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    return time_cuda(lambda: torch.matmul(a, b, out=c), **settings.timing_kwargs())


def copy_gbps(settings: BenchSettings, nbytes: int = COPY_BYTES) -> float:
    """The device-to-device copy rate (``dst.copy_(src)`` of ``nbytes``), in GB/s (1e9 bytes a
    second) of bytes read plus bytes written: the ceiling a memory-bound kernel's GB/s is read
    against. Timed like the contenders: interleaved rounds with ``settings.interleave`` (one
    contender), else ``time_cuda``; the L2 is flushed before every sample either way."""
    import torch

    timing = _time_copy(settings, nbytes)
    _release(torch.device("cuda", settings.device))  # the buffers are gone by now
    return 2 * nbytes / (timing.median_ms * 1e-3) / 1e9


def _time_copy(settings: BenchSettings, nbytes: int):
    import torch

    from ..measure import time_cuda, time_interleaved

    src = torch.ones(nbytes // 4, dtype=torch.int32, device=torch.device("cuda", settings.device))
    dst = torch.empty_like(src)
    fn = lambda: dst.copy_(src)  # noqa: E731
    if settings.interleave:
        return time_interleaved({"copy": fn}, rounds=settings.interleave)["copy"]
    return time_cuda(fn, **settings.timing_kwargs())


def gpu_clocks(device: int) -> tuple[str, str]:
    """(SM clock, memory clock) as ``nvidia-smi`` reports them; ``("", "")`` when it cannot."""
    try:
        proc = subprocess.run(
            ["nvidia-smi", "-i", str(device), "--query-gpu=clocks.sm,clocks.mem",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "", ""
    parts = [p.strip() for p in proc.stdout.strip().splitlines()[0].split(",")] \
        if proc.returncode == 0 and proc.stdout.strip() else []
    return (parts[0], parts[1]) if len(parts) == 2 else ("", "")


def environment(device: int) -> dict[str, str]:
    """Device and version fields every row carries."""
    from tiledattention import FORWARD, current_provenance, device_info

    info = device_info(device)
    prov = current_provenance(FORWARD)
    return dict(device=info.name, arch=info.arch, driver=prov.driver, torch_version=prov.torch,
                cuda_tile_version=prov.cuda_tile)


def run_grid(grid: Any, settings: BenchSettings, *, contenders: Mapping[str, Any]
             | None = None, progress: Any = None,
             measure: Callable[..., list[BenchResult]] | None = None) -> list[BenchResult]:
    """Measure every point of ``grid`` (a ``BenchGrid``, ``DecodeGrid`` or ``BackwardGrid``:
    its ``points()`` and ``contenders`` names, looked up in ``contenders``, default the forward
    grid's table) with ``measure`` (default ``measure_point``; the backward grid's is
    ``measure_backward_point``); ``progress`` (a rich ``Progress``) is advanced per contender
    when given."""
    table = contenders if contenders is not None else make_contenders()
    measure = measure or measure_point
    chosen = [table[name] for name in grid.contenders]
    env = environment(settings.device)
    points = grid.points()
    task = None
    if progress is not None:
        task = progress.add_task("bench", total=len(points) * len(chosen))
    results: list[BenchResult] = []
    for point in points:
        def on_contender(name: str, point=point) -> None:
            if progress is not None:
                progress.update(task, description=f"{point.describe()} · {name}")
        point_results = measure(point, chosen, settings, env=env,
                                on_contender=_advancing(on_contender, progress, task))
        sm, mem = gpu_clocks(settings.device)  # right after timing, while clocks are up
        results += [_with_clocks(r, sm, mem) for r in point_results]
        if progress is not None:
            progress.advance(task)
    return results


def _advancing(callback: Callable[[str], None], progress: Any, task: Any
               ) -> Callable[[str], None]:
    """Advance the bar when the next contender starts (the last one advances at point end)."""
    started = [0]

    def on_contender(name: str) -> None:
        if started[0] and progress is not None:
            progress.advance(task)
        started[0] += 1
        callback(name)
    return on_contender


def _with_clocks(result: BenchResult, sm: str, mem: str) -> BenchResult:
    return dataclasses.replace(result, sm_clock=sm, mem_clock=mem)
