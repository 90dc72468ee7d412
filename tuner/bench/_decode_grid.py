"""The decode grid of ``tiledtune bench --kernel decode``: which decode-shaped attention problems
and which contenders to time.

A point is ``(B, H_q, H_kv, S_q, S_k, D, dtype, mask)`` with the mask ``none``, ``top-left``
(torch's ``is_causal``) or ``bottom-right`` (torch's ``causal_lower_right``: the queries are the
last ``S_q`` of the ``S_k`` positions, as in speculative decoding). The default grid is a union
of *groups*, each a cross product of batch sizes, query lengths, key lengths and masks, at every
head configuration, head dim and dtype:

- one sequence decoding (``B = 1, S_q = 1``) over eight K/V lengths, 4k to 128k, two of them
  not powers of two (30000, 100000);
- a batch decoding (``B`` 8 and 32, ``S_q = 1``) at ``S_k`` 2048 and 8192;
- a verification step of 16 draft tokens (``B = 8, S_q = 16, S_k = 8192``, bottom-right).

``--batch``, ``--seqlens-q``, ``--seqlens-k`` and ``--masks`` replace that axis in every group;
points that are one problem (``Problem``'s canonical form: bottom-right with ``S_q = 1`` masks
nothing) are measured once. Everything here is pure (no GPU, no torch); a bad value raises
:class:`BenchConfigError` naming the flag.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from tiledattention import Problem, UnsupportedProblemError
from tiledattention.forward import SUPPORTED_HEAD_DIMS

from ._grid import BenchConfigError, _items, parse_dtypes, parse_int_list

__all__ = [
    "DECODE_CONTENDERS", "DECODE_GROUPS", "DECODE_INTERLEAVE", "DecodeGrid", "DecodeGroup",
    "DecodePoint", "MASKS", "QUICK_DECODE_GROUPS", "QUICK_DECODE_INTERLEAVE",
    "build_decode_grid", "parse_heads", "parse_masks",
]

#: The decode grid's contenders, in the order tables and plots show them.
DECODE_CONTENDERS = (
    "tiledattention",  # tiledattention.sdpa: dispatch between the families, then the lookup
    "tiledattention-default",  # DECODE.default_schedule passed explicitly
    "tiledattention-forward",  # the forward family's looked-up schedule passed explicitly
    "torch-cudnn",
    "torch-flash",
    "torch-efficient",
)
#: Mask names, in table order: no mask, top-left causal, bottom-right causal.
MASKS = ("none", "top-left", "bottom-right")
_MASK_WORDS = {"none": "none", "no": "none", "full": "none",
               "top-left": "top-left", "top_left": "top-left", "causal": "top-left",
               "yes": "top-left",
               "bottom-right": "bottom-right", "bottom_right": "bottom-right",
               "br": "bottom-right"}
#: Rounds of interleaved timing per point unless ``--interleave`` says otherwise: the decode
#: kernels run for microseconds on a shared machine, so contenders are always timed side by side.
DECODE_INTERLEAVE = 30
QUICK_DECODE_INTERLEAVE = 10


@dataclass(frozen=True, kw_only=True)
class DecodePoint:
    """One problem of the decode grid, in canonical form (see :meth:`of`)."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str
    mask: str

    def __post_init__(self) -> None:
        if self.mask not in MASKS:
            raise ValueError(f"mask must be one of {MASKS}; got {self.mask!r}")

    @classmethod
    def of(cls, problem: Problem) -> "DecodePoint":
        """The point of ``problem`` (its mask as ``Problem`` canonicalised it)."""
        mask = ("bottom-right" if problem.bottom_right else "top-left") if problem.causal \
            else "none"
        return cls(batch=problem.batch, heads_q=problem.heads_q, heads_kv=problem.heads_kv,
                   seqlen_q=problem.seqlen_q, seqlen_k=problem.seqlen_k,
                   head_dim=problem.head_dim, dtype=problem.dtype, mask=mask)

    @property
    def problem(self) -> Problem:
        return Problem(batch=self.batch, heads_q=self.heads_q, heads_kv=self.heads_kv,
                       seqlen_q=self.seqlen_q, seqlen_k=self.seqlen_k, head_dim=self.head_dim,
                       dtype=self.dtype, causal=self.mask != "none",
                       bottom_right=self.mask == "bottom-right")

    @property
    def causal_arg(self) -> bool | str:
        """``causal=`` of ``tiledattention.sdpa`` for this mask."""
        return {"none": False, "top-left": True, "bottom-right": "bottom_right"}[self.mask]

    @property
    def flops(self) -> float:
        return self.problem.flops

    def describe(self) -> str:
        return (f"B{self.batch} H{self.heads_q}/{self.heads_kv} S_q{self.seqlen_q} "
                f"S_k{self.seqlen_k} D{self.head_dim} {self.dtype} {self.mask}")

    def result_fields(self) -> dict:
        """The point's fields of a ``BenchResult`` (``heads`` = H_q, ``seqlen`` = S_k)."""
        return dict(kernel="decode", batch=self.batch, heads=self.heads_q,
                    heads_kv=self.heads_kv, seqlen_q=self.seqlen_q, seqlen=self.seqlen_k,
                    head_dim=self.head_dim, dtype=self.dtype, causal=self.mask != "none",
                    bottom_right=self.mask == "bottom-right")


@dataclass(frozen=True)
class DecodeGroup:
    """A cross product of batch sizes, query lengths, key lengths and masks."""

    batches: tuple[int, ...]
    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]
    masks: tuple[str, ...]


DECODE_GROUPS = (
    DecodeGroup((1,), (1,), (4096, 8192, 16384, 30000, 32768, 65536, 100000, 131072),
                ("none",)),
    DecodeGroup((8, 32), (1,), (2048, 8192), ("none",)),
    DecodeGroup((8,), (16,), (8192,), ("bottom-right",)),
)
#: ``--quick``: one point of each group's kind (flags given explicitly still win).
QUICK_DECODE_GROUPS = (
    DecodeGroup((1,), (1,), (4096, 32768), ("none",)),
    DecodeGroup((8,), (1,), (8192,), ("none",)),
    DecodeGroup((8,), (16,), (8192,), ("bottom-right",)),
)
DEFAULT_HEADS = ((32, 8),)
DEFAULT_HEAD_DIMS = (128,)
DEFAULT_DTYPES = ("bf16",)


@dataclass(frozen=True, kw_only=True)
class DecodeGrid:
    groups: tuple[DecodeGroup, ...]
    heads: tuple[tuple[int, int], ...]  # (H_q, H_kv) pairs
    head_dims: tuple[int, ...]
    dtypes: tuple[str, ...]
    contenders: tuple[str, ...]

    def points(self) -> list[DecodePoint]:
        """Points ordered dtype, group, heads, head dim, B, S_q, mask, S_k; each problem once."""
        seen: dict[DecodePoint, None] = {}
        for dtype in self.dtypes:
            for group in self.groups:
                for hq, hkv in self.heads:
                    for d in self.head_dims:
                        for b in group.batches:
                            for sq in group.seqlens_q:
                                for mask in group.masks:
                                    for sk in group.seqlens_k:
                                        seen.setdefault(_point(b, hq, hkv, sq, sk, d, dtype,
                                                               mask))
        return list(seen)


def _point(b: int, hq: int, hkv: int, sq: int, sk: int, d: int, dtype: str,
           mask: str) -> DecodePoint:
    if mask == "bottom-right" and sq > sk:
        raise BenchConfigError(f"--seqlens-q: S_q {sq} > S_k {sk} with a bottom-right mask "
                               f"leaves query rows without any key; pick S_q <= S_k "
                               f"(--seqlens-k) or another mask (--masks)")
    try:
        problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk,
                          head_dim=d, dtype=dtype, causal=mask != "none",
                          bottom_right=mask == "bottom-right")
    except UnsupportedProblemError as exc:
        raise BenchConfigError(f"--batch/--heads/--seqlens-q/--seqlens-k: B={b} H={hq}/{hkv} "
                               f"S_q={sq} S_k={sk} D={d} is not a problem the kernels take: "
                               f"{exc}") from None
    return DecodePoint.of(problem)


# -- flag parsing --------------------------------------------------------------------------------

def parse_heads(text: str, flag: str = "--heads") -> tuple[tuple[int, int], ...]:
    """``H_q/H_kv`` pairs (``H`` alone: as many K/V heads), comma-separated."""
    pairs = []
    for item in _items(flag, text):
        parts = item.split("/")
        if len(parts) > 2:
            raise BenchConfigError(f"{flag}: {item!r} is not H_q/H_kv (e.g. 32/8)")
        hq = parse_int_list(flag, parts[0])[0] if parts[0].strip() else None
        hkv = parse_int_list(flag, parts[-1])[0] if parts[-1].strip() else None
        if hq is None or hkv is None:
            raise BenchConfigError(f"{flag}: {item!r} is not H_q/H_kv (e.g. 32/8)")
        if hq % hkv:
            raise BenchConfigError(f"{flag}: in {item!r} H_q ({hq}) must be a multiple of "
                                   f"H_kv ({hkv})")
        pairs.append((hq, hkv))
    if len(set(pairs)) != len(pairs):
        raise BenchConfigError(f"{flag} lists a head configuration twice: {text!r}")
    return tuple(pairs)


def parse_masks(text: str, flag: str = "--masks") -> tuple[str, ...]:
    items = [item.lower() for item in _items(flag, text)]
    bad = [item for item in items if item not in _MASK_WORDS]
    if bad:
        raise BenchConfigError(f"{flag}: unknown mask {bad[0]!r}; expected a comma-separated "
                               f"subset of {','.join(MASKS)}")
    masks = tuple(_MASK_WORDS[item] for item in items)
    if len(set(masks)) != len(masks):
        raise BenchConfigError(f"{flag} lists a mask twice: {text!r}")
    return tuple(m for m in MASKS if m in masks)


def _as_text(value: str | Sequence) -> str:
    if isinstance(value, str):
        return value
    return ",".join(f"{v[0]}/{v[1]}" if isinstance(v, tuple) else str(v) for v in value)


def build_decode_grid(*, batches: str | Sequence[int] | None = None,
                      seqlens_q: str | Sequence[int] | None = None,
                      seqlens_k: str | Sequence[int] | None = None,
                      masks: str | Sequence[str] | None = None,
                      heads: str | Sequence[tuple[int, int]] | None = None,
                      head_dims: str | Sequence[int] | None = None,
                      dtypes: str | Sequence[str] | None = None,
                      contenders: str | Sequence[str] | None = None,
                      quick: bool = False) -> DecodeGrid:
    """Validate flag values (strings as typed, or parsed sequences; ``None``: the default) into
    a :class:`DecodeGrid`; every point is built, so a bad combination is reported here."""
    groups = QUICK_DECODE_GROUPS if quick else DECODE_GROUPS
    overrides = {}
    for field, flag, value, parse in (("batches", "--batch", batches, parse_int_list),
                                      ("seqlens_q", "--seqlens-q", seqlens_q, parse_int_list),
                                      ("seqlens_k", "--seqlens-k", seqlens_k, parse_int_list),
                                      ("masks", "--masks", masks, None)):
        if value is not None:
            text = _as_text(value)
            overrides[field] = (parse_masks(text, flag) if parse is None
                                else parse(flag, text))
    groups = tuple(replace(group, **overrides) for group in groups)
    heads_v = DEFAULT_HEADS if heads is None else parse_heads(_as_text(heads))
    dims = (DEFAULT_HEAD_DIMS if head_dims is None
            else parse_int_list("--head-dims", _as_text(head_dims)))
    for d in dims:
        if d not in SUPPORTED_HEAD_DIMS:
            raise BenchConfigError(f"--head-dims: {d} is not supported; head dims must be "
                                   f"multiples of 8 in 32..256")
    dtypes_v = DEFAULT_DTYPES if dtypes is None else parse_dtypes(_as_text(dtypes))
    contenders_v = DECODE_CONTENDERS if contenders is None else _decode_contenders(contenders)
    grid = DecodeGrid(groups=groups, heads=heads_v, head_dims=dims, dtypes=dtypes_v,
                      contenders=contenders_v)
    grid.points()  # raises BenchConfigError for a combination that is no problem
    return grid


def _decode_contenders(value: str | Sequence[str]) -> tuple[str, ...]:
    text = _as_text(value)
    if text.strip().lower() == "all":
        return DECODE_CONTENDERS
    items = _items("--contenders", text)
    bad = [item for item in items if item not in DECODE_CONTENDERS]
    if bad:
        raise BenchConfigError(f"--contenders: unknown contender {bad[0]!r} for --kernel "
                               f"decode; known: {', '.join(DECODE_CONTENDERS)} (or 'all')")
    return tuple(name for name in DECODE_CONTENDERS if name in items)
