"""The benchmark grid of ``tiledtune bench``: which attention problems and contenders to time.
The points are problems of the forward family (``tiledattention.forward.Problem``).

The grid holds the number of tokens (``B·S``) and the hidden size (``H·D``) fixed, as a model
layer does, and varies the sequence length and head dim: ``B = tokens // S``, ``H = hidden // D``.
Everything here is pure (no GPU, no torch): flag values are parsed and validated into a frozen
:class:`BenchGrid`, and a bad value raises :class:`BenchConfigError` naming the flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from tiledattention.forward import DTYPES, SUPPORTED_HEAD_DIMS, Problem

__all__ = [
    "BenchConfigError", "BenchGrid", "BenchPoint", "CONTENDERS", "DEFAULT_GRID", "QUICK_GRID",
    "TIMING_DEFAULTS", "QUICK_TIMING", "build_grid", "parse_causal", "parse_contenders",
    "parse_dtypes", "parse_int_list", "parse_positive_float", "parse_positive_int",
    "point_gbps", "point_tflops", "problem_bytes",
]

#: Every contender ``tiledtune bench`` knows, in the order tables and plots show them.
CONTENDERS = (
    "tiledattention",  # the schedule the runtime looks up
    "tiledattention-default",  # FORWARD.default_schedule (what an untuned GPU gets)
    "torch-auto",  # F.scaled_dot_product_attention, torch picks the backend
    "torch-flash",
    "torch-cudnn",
    "torch-efficient",
    "torch-math",
    "eager",  # matmul - softmax - matmul in the input dtype
)


class BenchConfigError(ValueError):
    """A ``tiledtune bench`` option has an impossible value (the message names the flag)."""


@dataclass(frozen=True, kw_only=True)
class BenchPoint:
    """One attention problem of the grid (self-attention: ``S_q = S_k``, ``H_q = H_kv``)."""

    batch: int
    heads: int
    seqlen: int
    head_dim: int
    dtype: str
    causal: bool

    @property
    def problem(self) -> Problem:
        return Problem(batch=self.batch, heads_q=self.heads, heads_kv=self.heads,
                       seqlen_q=self.seqlen, seqlen_k=self.seqlen, head_dim=self.head_dim,
                       dtype=self.dtype, causal=self.causal)

    @property
    def flops(self) -> float:
        return self.problem.flops

    def describe(self) -> str:
        return self.problem.describe()

    def result_fields(self) -> dict:
        """The point's fields of a ``BenchResult``."""
        return dict(batch=self.batch, heads=self.heads, seqlen=self.seqlen,
                    head_dim=self.head_dim, dtype=self.dtype, causal=self.causal)


def _problem_of(point) -> Problem:
    """A grid point's problem (any point with a ``problem``), or the problem itself."""
    return point if isinstance(point, Problem) else point.problem


def point_tflops(point, median_ms: float) -> float:
    """TFLOP/s of one call taking ``median_ms``: ``Problem.flops`` (4·B·H·S_q·S_k·D, only the
    unmasked part when causal) per second, over 1e12. ``point``: a grid point or a Problem."""
    if not median_ms > 0:
        raise ValueError(f"median_ms must be positive; got {median_ms}")
    return _problem_of(point).flops / (median_ms * 1e-3) / 1e12


def problem_bytes(problem: Problem) -> int:
    """Bytes one call must move at least: Q and K and V read, the output written, each once,
    in the input dtype (2 bytes an element): ``2·(2·B·H_q·S_q·D + 2·B·H_kv·S_k·D)``."""
    q_and_out = 2 * problem.batch * problem.heads_q * problem.seqlen_q * problem.head_dim
    k_and_v = 2 * problem.batch * problem.heads_kv * problem.seqlen_k * problem.head_dim
    return 2 * (q_and_out + k_and_v)


def point_gbps(point, median_ms: float) -> float:
    """GB/s (1e9 bytes a second) of one call taking ``median_ms``: :func:`problem_bytes` per
    second. ``point``: a grid point or a Problem."""
    if not median_ms > 0:
        raise ValueError(f"median_ms must be positive; got {median_ms}")
    return problem_bytes(_problem_of(point)) / (median_ms * 1e-3) / 1e9


@dataclass(frozen=True, kw_only=True)
class BenchGrid:
    tokens: int
    hidden: int
    head_dims: tuple[int, ...]
    seqlens: tuple[int, ...]
    dtypes: tuple[str, ...]
    causal: tuple[bool, ...]
    contenders: tuple[str, ...]

    def points(self) -> list[BenchPoint]:
        """Points ordered dtype, mask, head dim, sequence length (the order of the tables)."""
        return [
            BenchPoint(batch=self.tokens // s, heads=self.hidden // d, seqlen=s, head_dim=d,
                       dtype=dtype, causal=causal)
            for dtype in self.dtypes for causal in self.causal
            for d in self.head_dims for s in self.seqlens
        ]


@dataclass(frozen=True, kw_only=True)
class _GridDefaults:
    tokens: int
    hidden: int
    head_dims: tuple[int, ...]
    seqlens: tuple[int, ...]
    dtypes: tuple[str, ...]
    causal: tuple[bool, ...]


DEFAULT_GRID = _GridDefaults(tokens=16384, hidden=2048, head_dims=(64, 128, 256),
                             seqlens=(512, 1024, 2048, 4096, 8192, 16384),
                             dtypes=("bf16", "fp16"), causal=(False, True))
#: ``--quick``: a smoke-sized grid (flags given explicitly still win).
QUICK_GRID = _GridDefaults(tokens=16384, hidden=2048, head_dims=(64, 128),
                           seqlens=(1024, 4096), dtypes=("bf16",), causal=(False, True))

#: ``time_cuda`` keyword defaults behind ``--samples`` and friends; ``--quick`` loosens them.
TIMING_DEFAULTS = dict(warmup_ms=30.0, min_samples=10, max_samples=200, max_seconds=2.0,
                       rel_precision=0.01)
QUICK_TIMING = dict(warmup_ms=10.0, min_samples=5, max_samples=50, max_seconds=0.5,
                    rel_precision=0.03)


# -- flag parsing --------------------------------------------------------------------------------

def _items(flag: str, text: str) -> list[str]:
    if not isinstance(text, str) or not text.strip():
        raise BenchConfigError(f"{flag} needs a comma-separated list; got {text!r}")
    items = [item.strip() for item in text.split(",")]
    if any(not item for item in items):
        raise BenchConfigError(f"{flag} has an empty item in {text!r}; write e.g. 'a,b'")
    if len(set(items)) != len(items):
        raise BenchConfigError(f"{flag} lists a value twice: {text!r}")
    return items


def parse_positive_int(flag: str, text: str | int) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise BenchConfigError(f"{flag} must be a positive integer; got {text!r}") from None
    if value < 1 or str(text).strip() not in (str(value), f"+{value}"):
        raise BenchConfigError(f"{flag} must be a positive integer; got {text!r}")
    return value


def parse_positive_float(flag: str, text: str | float) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise BenchConfigError(f"{flag} must be a positive number; got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise BenchConfigError(f"{flag} must be a finite positive number; got {text!r}")
    return value


def parse_int_list(flag: str, text: str) -> tuple[int, ...]:
    return tuple(parse_positive_int(flag, item) for item in _items(flag, text))


def parse_dtypes(text: str, flag: str = "--dtypes") -> tuple[str, ...]:
    items = tuple(item.lower() for item in _items(flag, text))
    bad = [item for item in items if item not in DTYPES]
    if bad:
        raise BenchConfigError(f"{flag}: unknown dtype {bad[0]!r}; expected a comma-separated "
                               f"subset of {','.join(DTYPES)}")
    return items


_CAUSAL_WORDS = {"yes": True, "no": False, "causal": True, "full": False}


def parse_causal(text: str, flag: str = "--causal") -> tuple[bool, ...]:
    items = [item.lower() for item in _items(flag, text)]
    bad = [item for item in items if item not in _CAUSAL_WORDS]
    if bad:
        raise BenchConfigError(f"{flag}: unknown value {bad[0]!r}; expected yes, no or yes,no")
    values = tuple(_CAUSAL_WORDS[item] for item in items)
    if len(set(values)) != len(values):
        raise BenchConfigError(f"{flag} lists a mask twice: {text!r}")
    return values


def parse_contenders(text: str, flag: str = "--contenders") -> tuple[str, ...]:
    if isinstance(text, str) and text.strip().lower() == "all":
        return CONTENDERS
    items = _items(flag, text)
    bad = [item for item in items if item not in CONTENDERS]
    if bad:
        raise BenchConfigError(f"{flag}: unknown contender {bad[0]!r}; known: "
                               f"{', '.join(CONTENDERS)} (or 'all')")
    return tuple(name for name in CONTENDERS if name in items)  # canonical order


# -- the grid ------------------------------------------------------------------------------------

def build_grid(*, tokens: int | str | None = None, hidden: int | str | None = None,
               head_dims: str | Sequence[int] | None = None,
               seqlens: str | Sequence[int] | None = None,
               dtypes: str | Sequence[str] | None = None,
               causal: str | Sequence[bool] | None = None,
               contenders: str | Sequence[str] | None = None,
               quick: bool = False) -> BenchGrid:
    """Validate flag values (strings as typed, or already-parsed sequences; ``None``: default)
    into a :class:`BenchGrid`. Raises :class:`BenchConfigError` naming the offending flag."""
    base = QUICK_GRID if quick else DEFAULT_GRID
    tokens_v = base.tokens if tokens is None else parse_positive_int("--tokens", tokens)
    hidden_v = base.hidden if hidden is None else parse_positive_int("--hidden", hidden)
    dims = _ints("--head-dims", head_dims, base.head_dims)
    lens = _ints("--seqlens", seqlens, base.seqlens)
    dtypes_v = (base.dtypes if dtypes is None
                else parse_dtypes(dtypes if isinstance(dtypes, str) else ",".join(dtypes)))
    if causal is None:
        causal_v = base.causal
    elif isinstance(causal, str):
        causal_v = parse_causal(causal)
    else:
        causal_v = tuple(bool(c) for c in causal)
        if not causal_v or len(set(causal_v)) != len(causal_v):
            raise BenchConfigError(f"--causal needs yes, no or both, once each; got {causal!r}")
    if contenders is None:
        contenders_v = CONTENDERS
    else:
        contenders_v = parse_contenders(contenders if isinstance(contenders, str)
                                        else ",".join(contenders))

    for d in dims:
        if d not in SUPPORTED_HEAD_DIMS:
            raise BenchConfigError(f"--head-dims: {d} is not supported; head dims must be "
                                   f"multiples of 8 in 32..256")
        if hidden_v % d:
            raise BenchConfigError(f"--head-dims: {d} does not divide --hidden {hidden_v} "
                                   f"(H = hidden // D must be exact); pick head dims that "
                                   f"divide {hidden_v} or change --hidden")
    for s in lens:
        if tokens_v % s:
            raise BenchConfigError(f"--seqlens: {s} does not divide --tokens {tokens_v} "
                                   f"(B = tokens // S must be exact); pick sequence lengths "
                                   f"that divide {tokens_v} or change --tokens")
    return BenchGrid(tokens=tokens_v, hidden=hidden_v, head_dims=dims, seqlens=lens,
                     dtypes=dtypes_v, causal=causal_v, contenders=contenders_v)


def _ints(flag: str, value: str | Iterable[int] | None, default: tuple[int, ...]
          ) -> tuple[int, ...]:
    if value is None:
        return default
    if isinstance(value, str):
        return parse_int_list(flag, value)
    return parse_int_list(flag, ",".join(str(v) for v in value))
