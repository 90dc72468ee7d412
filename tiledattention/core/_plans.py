"""What every family's launch plan shares: the :class:`Plan` interface ``sdpa`` runs, the torch
functions a warm call needs (bound once, on the first torch call, so that ``import
tiledattention`` never imports torch and a warm call runs no import statement), and the byte
arithmetic of the ``out=`` overlap checks.

Torch calls launch on ``torch._C._cuda_getCurrentRawStream(device)``, an int that ``ct.launch``
takes as a raw ``CUstream`` (cuTile's ``parse_stream`` accepts ``int``; it is what
``torch.cuda.current_stream(device).cuda_stream`` holds, without building a ``Stream`` object),
read on every call, so a caller may switch streams between calls.
"""

from __future__ import annotations

import abc
from typing import Any

from ._call import Call

__all__ = ["Plan", "bind_torch", "kept_plan", "layouts", "warm_key", "span", "reach",
           "clear_of", "contiguous_like", "out_spans"]

# torch's functions the warm path calls (``bind_torch``); a test may bind its own
# ``raw_stream``, ``current_device`` and ``capturing`` first
raw_stream: Any = None  # device index -> torch's current stream there, as an int (CUstream)
empty_like: Any = None
empty: Any = None
float32: Any = None
contiguous_format: Any = None
current_device: Any = None  # () -> the current CUDA device's index
capturing: Any = None  # () -> whether the current device's current stream is capturing
grad_enabled: Any = None  # () -> whether grad mode is on


def bind_torch() -> None:
    """Bind the torch functions the warm path calls (once)."""
    global raw_stream, empty_like, empty, float32, contiguous_format, current_device, capturing
    global grad_enabled
    if empty_like is not None:
        return
    import torch

    if raw_stream is None:
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None:  # a torch without it: the Stream object's handle, the same int
            def raw(device: int) -> int:
                return torch.cuda.current_stream(device).cuda_stream
        raw_stream = raw
    if current_device is None:
        current_device = torch.cuda.current_device
    if capturing is None:
        capturing = torch.cuda.is_current_stream_capturing
    empty, float32, contiguous_format = torch.empty, torch.float32, torch.contiguous_format
    grad_enabled = torch.is_grad_enabled
    empty_like = torch.empty_like


def layouts(*arrays: Any) -> tuple:
    """The shapes, strides, dtypes and devices of torch tensors: their part of a warm-path key
    (raises ``AttributeError`` for arrays of another kind)."""
    return tuple([(x.shape, x.stride(), x.dtype, x.get_device()) for x in arrays])


def warm_key(tag: str, arrays: tuple, *values: Any) -> tuple:
    """The key of a call that repeats an earlier one's signature, for a warm path outside
    ``sdpa``'s (a ranged or paged call): ``tag``, the torch ``arrays``' layouts and
    ``requires_grad``, grad mode, and each of ``values`` with its type (``True == 1`` and
    ``64 == 64.0`` hash alike, and a first call may reject one of them; a tuple, a window,
    with its items' types). Raises ``AttributeError`` / ``TypeError`` for arguments that cannot
    have one (not torch tensors, an unhashable value)."""
    bind_torch()
    typed = []
    for value in values:
        typed += (value, tuple(map(type, value)) if isinstance(value, tuple) else type(value))
    return (tag, layouts(*arrays), tuple([x.requires_grad for x in arrays]), grad_enabled(),
            *typed)


def kept_plan(runtime: Any, tag: str, family: Any, shape: Any, device: int, scale: Any,
              causal: Any, q: Any, k: Any, v: Any) -> "Plan":
    """``family``'s torch plan for ``shape``, kept in ``runtime`` under ``tag``, the shape, the
    device, the call's scale and alignment and the arrays' strides (what a call outside
    ``sdpa``'s warm path, such as a ranged or paged one, reuses): looked up for the family's
    plan problem on the first call, found on the next ones."""
    bind_torch()
    key = (tag, family.name, shape, device, scale, causal, q.stride(), k.stride(), v.stride())
    plan = runtime.plan(key)
    if plan is None:
        schedule = runtime.resolution(family, family.plan_problem(shape), device).schedule
        call = Call.of(shape, scale, causal)
        plan = family.plan(call, schedule, device).for_torch(q, None, k, v)
        runtime.keep_plan(key, plan)
    return plan


class Plan(abc.ABC):
    """One family's launch of one call signature, prepared: kernels, grids, constant arguments.

    ``sdpa`` keeps a plan under ``Family.plan_key`` and runs it for every later torch call of
    that key (``run``); calls on CuPy arrays validate and build one each time (``run_cupy``).
    ``out_shape`` is the result's shape; ``for_torch`` returns the plan with what a warm torch
    call needs besides (whether ``torch.empty_like(q)`` is the result's layout, the byte spans
    the ``out=`` overlap check compares)."""

    __slots__ = ()
    out_shape: tuple[int, int, int, int]

    @abc.abstractmethod
    def for_torch(self, q: Any, out: Any, k: Any, v: Any) -> "Plan":
        """This plan completed for torch calls like this one (``out``: the caller's or
        ``None``)."""

    @abc.abstractmethod
    def run(self, runtime: Any, q: Any, k: Any, v: Any, device: int, out: Any) -> Any:
        """Launch on torch tensors whose key matched; the output, or ``None`` when something
        the key leaves out does not hold (the caller then validates, which says what).
        ``runtime`` keeps the scratch buffers a launch reuses between calls; ``None``: the call
        allocates its own (``sdpa(keep_scratch=False)``)."""

    @abc.abstractmethod
    def run_cupy(self, q: Any, k: Any, v: Any, out: Any, problem: Any) -> Any:
        """Launch on validated CuPy arrays (``out``: the caller's or ``None``) on CuPy's
        current stream; the output."""


def span(shape: Any, strides: Any) -> int:
    """Elements from a torch tensor's first element to its last, plus one (strides >= 0)."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def reach(shape: Any, strides: Any, tile_d: int) -> int:
    """The furthest element offset the kernels form in a ``[B, H, S, D]`` torch tensor of this
    layout (plus one): its last row's start plus the padded head dim it loads."""
    return ((shape[0] - 1) * strides[0] + (shape[1] - 1) * strides[1]
            + (shape[2] - 1) * strides[2] + tile_d)


def clear_of(out: Any, out_bytes: int, q: Any, q_bytes: int, k: Any, k_bytes: int, v: Any,
             v_bytes: int) -> bool:
    """Whether torch tensor ``out`` shares no byte with q, k or v (each spanning so many
    bytes from its first element)."""
    o = out.data_ptr()
    end = o + out_bytes
    p = q.data_ptr()
    if p < end and o < p + q_bytes:
        return False
    p = k.data_ptr()
    if p < end and o < p + k_bytes:
        return False
    p = v.data_ptr()
    return not (p < end and o < p + v_bytes)


def contiguous_like(q: Any) -> bool:
    """Whether q's strides are the contiguous ones (size-1 dims included, since
    ``torch.empty_like`` copies them): then ``empty_like(q)`` is a contiguous result."""
    shape, strides = tuple(q.shape), tuple(q.stride())
    contiguous, step = [], 1
    for n in reversed(shape):
        contiguous.append(step)
        step *= n
    return strides == tuple(reversed(contiguous))


def out_spans(q: Any, out: Any, k: Any = None, v: Any = None) -> tuple[int, ...] | None:
    """The byte spans an ``out=`` call's overlap check compares: q's, k's and v's (when given)
    and out's; ``None`` without ``out``."""
    if out is None:
        return None
    item = q.element_size()
    q_bytes = span(q.shape, q.stride()) * item
    out_bytes = span(out.shape, out.stride()) * item
    if k is None:
        return (q_bytes, out_bytes, item)
    return (q_bytes, span(k.shape, k.stride()) * item, span(v.shape, v.stride()) * item,
            out_bytes)
