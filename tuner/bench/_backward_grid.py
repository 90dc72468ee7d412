"""The backward grid of ``tiledtune bench --kernel backward``: which attention problems and
contenders to time for the backward pass (and the forward + backward step).

Like the forward grid, a point is self-attention ``(B, H, S, D, dtype, causal)`` with the number
of tokens ``B·S`` and the hidden size ``H·D`` held fixed (``B = tokens // S``, ``H = hidden //
D``); the default is issue 17's grid: bf16 and fp16, D in {64, 128, 256}, S in {1k, 4k, 16k},
causal (top-left, torch's ``is_causal``) and not, ``B·S = 16k``, ``H·D = 2048``: 36 points. The
flags are the forward grid's (``--seqlens``, ``--causal``, ``--tokens``, ``--hidden``,
``--head-dims``, ``--dtypes``, ``--contenders``, ``--quick``). Everything here is pure (no GPU,
no torch); a bad value raises :class:`BenchConfigError` naming the flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ._grid import BenchConfigError, BenchPoint, _items, build_grid

__all__ = ["BACKWARD_CONTENDERS", "BACKWARD_INTERLEAVE", "BACKWARD_PHASES", "BackwardGrid",
           "BackwardPoint", "QUICK_BACKWARD_INTERLEAVE", "build_backward_grid"]

#: The backward grid's contenders, in the order tables and plots show them.
BACKWARD_CONTENDERS = (
    "tiledattention",  # the backward family's looked-up schedule: what sdpa_backward runs
    "tiledattention-default",  # BACKWARD.default_schedule, timed only where it differs
    "torch-cudnn",
    "torch-flash",
    "torch-efficient",
)
#: What is timed per contender and point: the backward alone (the forward ran before, outside
#: the timed region), and one forward + backward step.
BACKWARD_PHASES = ("backward", "forward+backward")
#: Rounds of interleaved timing per point unless ``--interleave`` says otherwise.
BACKWARD_INTERLEAVE = 30
QUICK_BACKWARD_INTERLEAVE = 10

_DEFAULTS = dict(tokens=16384, hidden=2048, head_dims=(64, 128, 256),
                 seqlens=(1024, 4096, 16384), dtypes=("bf16", "fp16"), causal=(False, True))
_QUICK = dict(tokens=16384, hidden=2048, head_dims=(64, 128), seqlens=(1024, 4096),
              dtypes=("bf16",), causal=(False, True))


@dataclass(frozen=True, kw_only=True)
class BackwardPoint(BenchPoint):
    """One problem of the backward grid (self-attention, top-left causal or none)."""

    def result_fields(self) -> dict:
        return dict(super().result_fields(), kernel="backward")


@dataclass(frozen=True, kw_only=True)
class BackwardGrid:
    tokens: int
    hidden: int
    head_dims: tuple[int, ...]
    seqlens: tuple[int, ...]
    dtypes: tuple[str, ...]
    causal: tuple[bool, ...]
    contenders: tuple[str, ...]

    def points(self) -> list[BackwardPoint]:
        """Points ordered dtype, mask, head dim, sequence length (the forward grid's order)."""
        return [BackwardPoint(batch=self.tokens // s, heads=self.hidden // d, seqlen=s,
                              head_dim=d, dtype=dtype, causal=causal)
                for dtype in self.dtypes for causal in self.causal
                for d in self.head_dims for s in self.seqlens]


def _text(value: str | Sequence | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return ",".join(str(v) for v in value)


def _contenders(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return BACKWARD_CONTENDERS
    text = _text(value)
    if text.strip().lower() == "all":
        return BACKWARD_CONTENDERS
    items = _items("--contenders", text)
    bad = [item for item in items if item not in BACKWARD_CONTENDERS]
    if bad:
        raise BenchConfigError(f"--contenders: unknown contender {bad[0]!r} for --kernel "
                               f"backward; known: {', '.join(BACKWARD_CONTENDERS)} (or 'all')")
    return tuple(name for name in BACKWARD_CONTENDERS if name in items)


def build_backward_grid(*, tokens: int | str | None = None, hidden: int | str | None = None,
                        head_dims: str | Sequence[int] | None = None,
                        seqlens: str | Sequence[int] | None = None,
                        dtypes: str | Sequence[str] | None = None,
                        causal: str | Sequence[bool] | None = None,
                        contenders: str | Sequence[str] | None = None,
                        quick: bool = False) -> BackwardGrid:
    """Validate flag values (strings as typed, or parsed sequences; ``None``: the default) into
    a :class:`BackwardGrid`, with the forward grid's parsing and checks (head dims that divide
    ``hidden``, sequence lengths that divide ``tokens``)."""
    base = _QUICK if quick else _DEFAULTS
    forward = build_grid(
        tokens=base["tokens"] if tokens is None else tokens,
        hidden=base["hidden"] if hidden is None else hidden,
        head_dims=base["head_dims"] if head_dims is None else head_dims,
        seqlens=base["seqlens"] if seqlens is None else seqlens,
        dtypes=base["dtypes"] if dtypes is None else dtypes,
        causal=base["causal"] if causal is None else causal,
        contenders="tiledattention")  # the forward grid's names; ours are checked below
    return BackwardGrid(tokens=forward.tokens, hidden=forward.hidden,
                        head_dims=forward.head_dims, seqlens=forward.seqlens,
                        dtypes=forward.dtypes, causal=forward.causal,
                        contenders=_contenders(contenders))
