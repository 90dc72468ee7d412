"""tiledattention: a cuTile FlashAttention forward kernel whose schedule is tuned per GPU.

``sdpa(q, k, v, causal=False, scale=None)`` computes
``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)``
(with ``enable_gqa`` semantics for grouped-query inputs) using the best known schedule for the
shape on this GPU; ``explain`` says which schedule that is and why.
"""

from __future__ import annotations

from typing import Any

from ._compile import ARCHITECTURES, CompileResult
from ._lookup import Resolution, Resolver
from ._runtime import Runtime
from .forward import Problem, Schedule, compile_schedule, problem_from_arrays
from .errors import CompileError, ScheduleError, TiledAttentionError, UnsupportedProblemError

__all__ = [
    "ARCHITECTURES", "CompileError", "CompileResult", "Problem", "Resolution", "Runtime",
    "Schedule", "ScheduleError", "TiledAttentionError", "UnsupportedProblemError",
    "compile_schedule", "explain", "runtime", "sdpa", "use_database",
]

_default_runtime: Runtime | None = None


def _make_runtime(location: str | None) -> Runtime:
    import db
    import search_spaces

    from ._settings import database_location

    where = location if location is not None else database_location()
    resolver = Resolver(open_user=lambda: db.ScheduleDB.open_for_lookup(where),
                        open_shipped=lambda arch: db.shipped_table(arch),
                        default=search_spaces.default_schedule)
    return Runtime(resolver)


def runtime() -> Runtime:
    """The process's runtime (created on first use, reading ``TILEDATTN_DB``)."""
    global _default_runtime
    if _default_runtime is None:
        _default_runtime = _make_runtime(None)
    return _default_runtime


def use_database(location: str | None) -> None:
    """Look schedules up in ``location`` (a path or SQLAlchemy URL; ``None``: the default) from
    now on; forgets memoised lookups."""
    global _default_runtime
    _default_runtime = _make_runtime(location)


def sdpa(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None, *,
         schedule: Schedule | None = None) -> Any:
    """Scaled dot-product attention forward, ``[B, H, S, D]`` in and out.

    q: ``[B, H_q, S_q, D]``; k, v: ``[B, H_kv, S_k, D]`` with ``H_q % H_kv == 0`` (grouped-query
    attention without copies). bf16 or fp16 torch tensors on a CUDA device (launch on torch's
    current stream) or CuPy arrays (CuPy's current stream; returns a CuPy array). The last dim
    must be contiguous; other strides are free. ``causal`` masks top-left aligned, like torch's
    ``is_causal``. ``scale`` defaults to ``1/sqrt(D)``. ``schedule`` overrides the lookup.
    """
    return runtime().sdpa(q, k, v, causal, scale, schedule=schedule)


def explain(q: Any, k: Any, v: Any, causal: bool = False) -> Resolution:
    """The schedule ``sdpa(q, k, v, causal)`` would run, and which lookup step chose it."""
    problem, kind = problem_from_arrays(q, k, v, causal, None)
    device_index = q.device.index if kind == "torch" else q.device.id
    return runtime().resolution(problem, device_index)
