"""The attention problem a call describes, and the checks that turn bad input into clear errors.

``Problem`` is the key the schedule database, the tuner and the lookup share: architecture-free
shape, dtype and masking. Every attention family (forward, decode, backward) keys on it; it is
the core they share, and none of them owns it. ``problem_from_arrays`` validates torch tensors
or CuPy arrays and builds it; nothing here touches the GPU.

Order of the checks: every entry point checks its arguments' types, shapes, dtypes and values
(none of which needs a GPU) before it checks that the arrays are on a CUDA device
(:func:`check_cuda`), so a wrong argument is named even in a call on CPU tensors, and a call
that is right but for its device is told that.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping, Sequence

from ._dtypes import DTYPES, FP8_DTYPES, dtype_of
from ..kernel_core.numbers import head_slots
from ..errors import InputTypeError, InputValueError, UnsupportedProblemError

__all__ = ["Problem", "DTYPES", "SUPPORTED_HEAD_DIMS", "INDEX_LIMIT", "problem_from_arrays",
           "problem_of_arrays", "check_cuda",
           "padded_head_dim", "head_dim_parts", "head_slots", "packable", "TOP_LEFT",
           "BOTTOM_RIGHT", "causal_flags",
           "check_reach", "default_scale", "ROW_STAT_ALIGN", "row_stat_rows", "row_stat_shape",
           "variant_args",
           "sink_logits", "PAGE_ALIGN", "page_tile", "page_load_rows", "check_tensor",
           "check_attention_tensors"]

#: ``causal=`` values: top-left alignment (torch's ``is_causal``; ``True`` means this) and
#: bottom-right alignment (``torch.nn.attention.bias.causal_lower_right``: the queries are the
#: last ``S_q`` positions of the ``S_k`` keys).
TOP_LEFT = "top_left"
BOTTOM_RIGHT = "bottom_right"

#: Head dims the kernel supports: multiples of 8 (16-byte rows for TMA) from 32 to 256. A head dim
#: that is not a power of two is padded to the next one inside the kernel (zero-filled loads).
SUPPORTED_HEAD_DIMS = tuple(range(32, 257, 8))
#: Largest index the kernel can form. It is compiled with ``index_dtype=ct.int32`` (``_compile``;
#: ``ct.launch`` picks int32 for arrays that are not annotated ``ct.IndexedWithInt64``), so every
#: element offset into q, k, v and out must fit a signed 32-bit int. cuTile's launcher checks
#: each dim and stride on its own, not their products: a tensor of more than 2**31-1 elements
#: would launch and compute wrapped offsets.
INDEX_LIMIT = 2**31 - 1
_DIMS = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim")


def padded_head_dim(head_dim: int) -> int:
    return 1 << (head_dim - 1).bit_length()


#: Row statistics (the log-sum-exp and delta) are stored ``[B, H_q, S]`` with ``S`` rounded up to
#: this many entries, so every row of them starts 128-byte aligned; the kernels see a
#: ``[B, H_q, S_q]`` view.
ROW_STAT_ALIGN = 32


def row_stat_rows(rows: int) -> int:
    """``rows`` rounded up to ``ROW_STAT_ALIGN``: the storage length of a per-row statistic's
    rows (16-byte aligned for the kernels' loads)."""
    return -(-rows // ROW_STAT_ALIGN) * ROW_STAT_ALIGN


def row_stat_shape(problem: "Problem") -> tuple[int, int, int]:
    """The storage shape of a float32 per-row statistic (log-sum-exp, delta) of ``problem``."""
    return (problem.batch, problem.heads_q, row_stat_rows(problem.seqlen_q))


def default_scale(problem: "Problem") -> float:
    """The softmax scale when the caller gives none: ``1 / sqrt(D)``."""
    return 1.0 / math.sqrt(problem.head_dim)


def packable(problem: "Problem", tile_m: int, *, idle_slots: bool = False) -> bool:
    """Whether a tile of ``tile_m`` rows can hold every query head of one of ``problem``'s
    K/V groups (FlashAttention's pack-GQA, in the forward and the backward's dQ kernel): a
    group of more than one head, a power of two, at most ``tile_m`` (tile shapes are powers of
    two, and a tile's heads must be one group's). With ``idle_slots`` (the forward) a group of
    any size packs into :func:`head_slots` of it, at most ``tile_m``: the slots past the group
    are computed and never stored."""
    group = problem.group_size
    slots = head_slots(group)
    if not idle_slots and slots != group:
        return False
    return 1 < group and slots <= tile_m


def head_dim_parts(head_dim: int, split: bool) -> tuple[int, int]:
    """The kernel's ``(TILE_D, TILE_D2)`` for ``head_dim``: one part padded to a power of two
    ``(padded, 0)``; with ``split``, the largest power of two below the head dim and a second
    power-of-two part (at least 16 columns: the matrix instructions' depth) for the rest, when
    the two cover fewer padded columns than one part does (96 = 64 + 32, 80 = 64 + 16, 72 =
    64 + 16 with 8 columns zero-filled, 192 = 128 + 64); else one part."""
    padded = padded_head_dim(head_dim)
    if not split or padded == head_dim:
        return padded, 0
    first = padded // 2
    second = max(16, padded_head_dim(head_dim - first))
    if first + second >= padded:
        return padded, 0
    return first, second


#: A paged cache's page size is a multiple of this many tokens (a key tile never straddles
#: two pages).
PAGE_ALIGN = 16
def check_tensor(name: str, x: Any, dims: str, fp8: bool = False) -> None:
    """Raise an InputTypeError / InputValueError naming ``name`` unless ``x`` is a bf16 or fp16
    (with ``fp8``, also an FP8) torch tensor of the layout ``dims`` (e.g. ``"[tokens, heads,
    head_dim]"``: its rank is the count of names) with a contiguous last dim and no empty
    dim."""
    import torch

    ndim = dims.count(",") + 1
    if not isinstance(x, torch.Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor {dims}; got {type(x).__name__}")
    if x.dim() != ndim:
        raise InputValueError(f"{name} must have {ndim} dims {dims}; got shape "
                              f"{tuple(x.shape)}")
    dtype_of(name, x, fp8=fp8)
    if x.stride(-1) != 1:
        raise InputValueError(f"{name} must be contiguous in its last dim (head_dim); got "
                              f"stride {x.stride(-1)}")
    if 0 in x.shape:
        raise InputValueError(f"{name} must have no empty dim; got shape {tuple(x.shape)}")


def check_attention_tensors(names: tuple[str, str, str], q: Any, k: Any, v: Any, q_dims: str,
                            kv_dims: str, kv_fp8: bool = False) -> None:
    """:func:`check_tensor` for a call's query, key and value (``names``), then that they share
    one dtype (``kv_fp8``, an FP8 K/V cache: key and value share theirs) and one device and
    that the value has the key's shape."""
    check_tensor(names[0], q, q_dims)
    for name, x in zip(names[1:], (k, v)):
        check_tensor(name, x, kv_dims, fp8=kv_fp8)
    together = f"{names[0]}, {names[1]} and {names[2]}"
    if kv_fp8:
        if v.dtype != k.dtype:
            raise InputTypeError(f"{names[1]} and {names[2]} of an FP8 cache must have one "
                                 f"dtype; got {k.dtype}, {v.dtype}")
    elif k.dtype != q.dtype or v.dtype != q.dtype:
        raise InputTypeError(f"{together} must have one dtype; got {q.dtype}, {k.dtype}, "
                             f"{v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise InputValueError(f"{together} must be on one device; got {q.device}, {k.device}, "
                              f"{v.device}")
    if tuple(v.shape) != tuple(k.shape):
        raise InputValueError(f"{names[2]} must have the shape of {names[1]} {tuple(k.shape)}; "
                              f"got {tuple(v.shape)}")


def page_tile(page_size: int) -> int:
    """The largest power of two dividing ``page_size``: the most keys one load from a paged
    cache may take (a load never straddles two pages)."""
    return page_size & -page_size


def page_load_rows(page_size: int, tile_n: int) -> int:
    """The keys one load of a paged cache takes under ``tile_n``-key tiles: the most a load
    may take (:func:`page_tile`), at most a tile; 0 without pages (``page_size`` 0)."""
    return min(tile_n, page_tile(page_size)) if page_size else 0


#: The fields ``to_dict`` leaves out at these values (keys stored before they existed).
_OPTIONAL = {"bottom_right": False, "window_left": -1, "window_right": -1, "softcap": 0.0,
             "sinks": False, "ragged": False, "page_size": 0, "kv_dtype": ""}


@dataclass(frozen=True, kw_only=True)
class Problem:
    """Shape, dtype and masking of one attention call (``[B, H, S, D]`` layout).

    ``causal`` masks query row ``i`` to keys ``0..i`` (top-left alignment); with
    ``bottom_right`` as well, to keys ``0..i + S_k - S_q`` (the queries are the last ``S_q``
    positions). A sliding window ``(window_left, window_right)`` (torch's and FlashAttention's
    convention, ``-1`` unbounded) keeps keys ``i + off - window_left .. i + off + window_right``
    with the same alignment offset ``off`` (:attr:`causal_offset`); it composes with ``causal``.
    ``softcap > 0`` caps the scaled scores at ``softcap * tanh(s / softcap)``; ``sinks`` says
    the call passes per-query-head sink logits that join each row's softmax denominator.

    ``ragged``: the batch's sequences have lengths of their own, given per call as query and
    key ranges (packed variable-length sequences, or a padded batch's valid tokens). Such a
    problem is a bucket, not one call: ``seqlen_q`` and ``seqlen_k`` are the longest query
    and key lengths rounded up to powers of two, and ``batch`` the number of such sequences
    the call's query tokens fill (rounded up to a power of two), so every batch of one length
    profile shares a key (``tiledattention.core._ragged.ragged_problem``). The mask and the window
    apply per sequence, aligned by the sequence's own lengths. ``page_size`` (> 0, ragged
    only): K and V are a paged cache, pools of pages of that many tokens that each sequence
    reaches through its row of a block table (``tiledattention.entry_points._paged``).
    ``kv_dtype`` (an FP8 dtype, e.g. ``"e4m3"``): K and V are stored in it, with descale
    factors, under queries (and an output) of ``dtype``: an FP8 K/V cache.

    A problem is kept in one canonical form, so the database never holds two keys for one
    computation: bottom-right with ``S_q == S_k`` is top-left, and with ``S_q == 1`` and no
    window it masks nothing (``causal=False``); a window side that binds no key is ``-1``; with
    ``causal`` the right side is ``-1`` (the causal mask binds it at least as tightly), and a
    right side of 0 without ``causal`` is ``causal``. Fields at their defaults are left out of
    ``to_dict``: keys stored before they existed stay valid.
    """

    #: Fields that make a problem a variant of plain attention: exact parts of every family's
    #: lookup bucket when set (``Family.codec``).
    VARIANT_FIELDS: ClassVar[tuple[str, ...]] = ("window_left", "window_right", "softcap",
                                                 "sinks", "ragged", "page_size", "kv_dtype")
    #: The optional fields and their defaults (what ``to_dict`` leaves out).
    OPTIONAL_FIELDS: ClassVar[Mapping[str, Any]] = _OPTIONAL

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str
    causal: bool
    bottom_right: bool = False
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    sinks: bool = False
    ragged: bool = False
    page_size: int = 0
    kv_dtype: str = ""

    def __post_init__(self) -> None:
        for name in _DIMS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UnsupportedProblemError(f"{name} must be a positive int; got "
                                              f"{_shown(value)}")
            if value > INDEX_LIMIT:
                raise UnsupportedProblemError(
                    f"{name} must be at most {INDEX_LIMIT} (2**31-1: the kernel indexes with "
                    f"int32); got {_shown(value)}")
        if self.dtype not in DTYPES:
            raise UnsupportedProblemError(f"dtype must be one of {DTYPES}; got {self.dtype!r}")
        if self.kv_dtype and (self.kv_dtype not in FP8_DTYPES or self.dtype in FP8_DTYPES):
            raise UnsupportedProblemError(
                f"kv_dtype must be '' (K and V in dtype) or one of {FP8_DTYPES} under 16-bit "
                f"queries (an FP8 K/V cache); got kv_dtype={self.kv_dtype!r} with "
                f"dtype={self.dtype!r}")
        if not isinstance(self.causal, bool):
            raise UnsupportedProblemError(f"causal must be a bool; got {self.causal!r}")
        if not isinstance(self.bottom_right, bool):
            raise UnsupportedProblemError(f"bottom_right must be a bool; got "
                                          f"{self.bottom_right!r}")
        _check_variants(self)
        if self.bottom_right and not (self.causal or self.windowed):
            raise UnsupportedProblemError("bottom_right=True needs causal=True or a window (it "
                                          "aligns the causal mask and the window)")
        _canonical_mask(self)
        if self.heads_q % self.heads_kv:
            raise UnsupportedProblemError(
                f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})"
            )
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise UnsupportedProblemError(
                f"head_dim must be a multiple of 8 in 32..256; got {self.head_dim}"
            )
        _check_index_range(self)

    @property
    def windowed(self) -> bool:
        """Whether a sliding window bounds either side of each row's keys."""
        return self.window_left >= 0 or self.window_right >= 0

    @property
    def variant(self) -> bool:
        """Whether anything beyond plain (causal) attention applies: a window, a softcap or
        sinks."""
        return self.windowed or self.softcap > 0 or self.sinks

    def key_span(self, first_row: int, last_row: int) -> tuple[int, int]:
        """The keys ``[lo, hi)`` any query row in ``first_row..last_row`` (inclusive, clamped
        to the rows that exist) may see under the causal mask and the window; ``lo >= hi``
        when none."""
        first_row = max(0, min(first_row, self.seqlen_q - 1))
        last_row = max(0, min(last_row, self.seqlen_q - 1))
        off = self.causal_offset
        hi = self.seqlen_k
        if self.causal:
            hi = min(hi, last_row + off + 1)
        elif self.window_right >= 0:
            hi = min(hi, last_row + off + self.window_right + 1)
        lo = 0
        if self.window_left >= 0:
            lo = max(0, first_row + off - self.window_left)
        return min(lo, self.seqlen_k), max(hi, 0)

    def lookup_shape(self) -> "Problem":
        """The plain problem the lookup measures this one by (distance, transfer limits,
        padding): itself, or for a sliding window, rows and keys of the window's span and the
        rest of the query rows as batch, so a 4096-key window at 32k and at 64k tokens lie
        one batch doubling apart, not two length doublings."""
        if not self.windowed:
            return self
        sq, sk = self.seqlen_q, self.seqlen_k
        right = 0 if self.causal else (self.window_right if self.window_right >= 0 else sk)
        span = (self.window_left if self.window_left >= 0 else sk) + right + 1
        rows, keys = min(sq, span), min(sk, span)
        return Problem(batch=self.batch * -(-sq // rows), heads_q=self.heads_q,
                       heads_kv=self.heads_kv, seqlen_q=rows, seqlen_k=keys,
                       head_dim=self.head_dim, dtype=self.dtype, causal=self.causal)

    @classmethod
    def lookup_terms(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """``to_dict()`` of :meth:`lookup_shape` of the problem whose ``to_dict()`` is
        ``data`` (what the database's distance columns are taken of)."""
        if "window_left" not in data and "window_right" not in data:
            return data  # not windowed: itself (and no need to rebuild it)
        return cls.from_dict(data).lookup_shape().to_dict()

    @property
    def group_size(self) -> int:
        """Query heads per K/V head (1: MHA; heads_q: MQA)."""
        return self.heads_q // self.heads_kv

    @property
    def flops(self) -> float:
        """4·B·H·S_q·S_k·D, counting only the unmasked part when causal."""
        return 4.0 * self.batch * self.heads_q * self.head_dim * self.attended_pairs

    @property
    def attended_pairs(self) -> int:
        """Number of (query, key) pairs attended per head (the causal mask and the window
        applied)."""
        sq, sk, off = self.seqlen_q, self.seqlen_k, self.causal_offset
        # row i sees keys max(i + off - left, 0) .. min(i + off + right, sk - 1)
        right = 0 if self.causal else (self.window_right if self.window_right >= 0 else sq + sk)
        left = self.window_left if self.window_left >= 0 else sq + sk
        # rows that see a key: i + off + right >= 0 and i + off - left <= sk - 1
        first = max(0, -off - right)
        last = min(sq - 1, sk - 1 - off + left)
        if last < first:
            return 0
        return (_sum_clamped(first, last, off + right, 0, sk - 1)
                - _sum_clamped(first, last, off - left, 0, sk - 1) + (last - first + 1))

    @property
    def causal_offset(self) -> int:
        """The alignment of the causal mask and the window: query row ``i`` sees keys ``0..i +
        causal_offset`` when causal; 0 top-left, ``S_k - S_q`` bottom-right."""
        return self.seqlen_k - self.seqlen_q if self.bottom_right else 0

    def as_tuple(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (the database and the row files store this); the optional
        fields (``bottom_right``, the window, ``softcap``, ``sinks``) only when set."""
        data = {name: getattr(self, name) for name in _field_names(type(self))}
        for name, default in _OPTIONAL.items():
            if data[name] == default:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Problem":
        """Inverse of :meth:`to_dict`; every field but the optional ones is required, none may
        be unknown."""
        if not isinstance(data, Mapping):
            raise UnsupportedProblemError(f"a problem must be a mapping; got "
                                          f"{type(data).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        missing = [name for name in names if name not in data and name not in _OPTIONAL]
        if unknown or missing:
            raise UnsupportedProblemError(f"expected fields {names}; unknown {unknown}, "
                                          f"missing {missing}")
        return cls(**data)

    def describe(self) -> str:
        kv = f"/{self.heads_kv}" if self.heads_kv != self.heads_q else ""
        sk = f"x{self.seqlen_k}" if self.seqlen_k != self.seqlen_q else ""
        mask = "causal" if self.causal else ("" if self.windowed else "full")
        if self.windowed:
            mask += ("-" if mask else "") + f"win({self.window_left},{self.window_right})"
        if self.bottom_right:
            mask += "-br"
        if self.softcap > 0:
            mask += f" cap{self.softcap:g}"
        if self.sinks:
            mask += " sinks"
        if self.ragged:
            mask += " ragged"
        if self.page_size:
            mask += f" paged{self.page_size}"
        if self.kv_dtype:
            mask += f" kv-{self.kv_dtype}"
        return (f"B{self.batch} H{self.heads_q}{kv} S{self.seqlen_q}{sk} D{self.head_dim} "
                f"{self.dtype} {mask}")


def _check_variants(p: Problem) -> None:
    for name in ("window_left", "window_right"):
        value = getattr(p, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            raise UnsupportedProblemError(f"{name} must be an int >= -1 (-1: unbounded); got "
                                          f"{_shown(value)}")
    cap = p.softcap
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap) \
            or cap < 0:
        raise UnsupportedProblemError(f"softcap must be a finite float >= 0 (0: none); got "
                                      f"{cap!r}")
    object.__setattr__(p, "softcap", float(cap))
    if not isinstance(p.sinks, bool):
        raise UnsupportedProblemError(f"sinks must be a bool; got {p.sinks!r}")
    if not isinstance(p.ragged, bool):
        raise UnsupportedProblemError(f"ragged must be a bool; got {p.ragged!r}")
    size = p.page_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 0 or size % PAGE_ALIGN:
        raise UnsupportedProblemError(f"page_size must be 0 (no pages) or a positive multiple "
                                      f"of {PAGE_ALIGN}; got {_shown(size)}")
    if size and not p.ragged:
        raise UnsupportedProblemError(f"page_size={size} needs ragged=True (a paged cache's "
                                      f"sequences have lengths of their own)")


def _canonical_mask(p: Problem) -> None:
    """Bring the causal flag, the alignment and the window to their canonical form (the class
    docstring says which)."""
    def put(name: str, value: Any) -> None:
        object.__setattr__(p, name, value)

    if p.causal and p.window_right >= 0:
        put("window_right", -1)  # the causal mask binds at least as tightly
    elif not p.causal and p.window_right == 0:
        put("causal", True)
        put("window_right", -1)
    if p.ragged:
        # each sequence aligns by its own lengths: which window side binds, and whether
        # bottom-right equals top-left, depends on them, not on the bounds
        if p.bottom_right and not (p.causal or p.windowed):
            put("bottom_right", False)
        return
    off = p.causal_offset
    # the left side binds iff the last row's first key lies past key 0; the right side iff the
    # first row's last key lies before the last key
    if p.window_left >= 0 and p.window_left >= p.seqlen_q - 1 + off:
        put("window_left", -1)
    if p.window_right >= 0 and p.window_right >= p.seqlen_k - 1 - off:
        put("window_right", -1)
    if p.bottom_right and p.seqlen_q == 1 and p.causal:
        put("causal", False)  # the one row is the last position: it sees every key
    if p.bottom_right and (p.seqlen_q == p.seqlen_k or not (p.causal or p.windowed)):
        put("bottom_right", False)  # the same mask as top-left, or no mask at all


def _sum_clamped(first: int, last: int, shift: int, lo: int, hi: int) -> int:
    """``sum(min(max(i + shift, lo), hi) for i in first..last)`` in O(1) (``lo <= hi``)."""
    def ramp(a: int, b: int) -> int:  # sum of i + shift over a..b
        return 0 if b < a else (b - a + 1) * (a + b + 2 * shift) // 2

    below_end = min(last, lo - shift)  # rows clamped up to lo: i + shift <= lo
    above_start = max(first, hi - shift)  # rows clamped down to hi: i + shift >= hi
    total = 0
    if below_end >= first:
        total += (below_end - first + 1) * lo
    if above_start <= last:
        total += (last - above_start + 1) * hi
    total += ramp(max(first, below_end + 1), min(last, above_start - 1))
    return total


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    """The field names of a problem class (``dataclasses.fields`` builds them anew each call;
    ``to_dict`` runs several times for every row stored or imported)."""
    return tuple(f.name for f in fields(cls))


def _shown(value: Any) -> str:
    """``repr(value)``, short for huge ints (``str`` of one over 4300 digits even raises)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"{'a negative' if value < 0 else 'an'} integer of {value.bit_length()} bits"
    return repr(value)


def _check_index_range(p: Problem) -> None:
    """Raise unless every index the kernel forms fits int32.

    The kernel (``_kernel.attention_fwd``) addresses q and out as ``[B, H_q, S_q, D]`` and k, v
    as ``[B, H_kv, S_k, D]``, loading rows of ``TILE_D = padded_head_dim(D)`` columns
    (zero-filled past D). The element counts are taken with the padded head dim, a safe bound
    for every offset those loads can form: ``B*H_q*S_q*TILE_D`` and ``B*H_kv*S_k*TILE_D``. The
    other products the kernel forms are bounded by these (D >= 32): the persistent loop's work
    count ``num_slots*B*H_q <= B*H_q*S_q``, the row and key indices ``tile*TILE + arange(TILE)
    <= S + 255``, the (batch x head) index ``< B*H_q``. Strided tensors can reach further than
    their element count: ``problem_from_arrays`` checks the furthest element they reach.
    (The non-persistent grid's second dim, ``B*H_q``, has CUDA's own limit, which cuTile checks
    at launch with an error; that depends on the schedule, not on the problem.)
    """
    tile_d = padded_head_dim(p.head_dim)
    # a paged cache's pools hold what they hold, not batch x seqlen_k keys: each call checks
    # the arrays' own reach
    arrays = ((("q and out", "heads_q", "seqlen_q"),) if p.page_size else
              (("q and out", "heads_q", "seqlen_q"), ("k and v", "heads_kv", "seqlen_k")))
    for tensors, heads, seqlen in arrays:
        h, s = getattr(p, heads), getattr(p, seqlen)
        elements = p.batch * h * s * tile_d
        if elements > INDEX_LIMIT:
            raise UnsupportedProblemError(
                f"batch*{heads}*{seqlen}*padded head_dim ({p.batch}*{h}*{s}*{tile_d} = "
                f"{elements} elements of {tensors}) must be at most {INDEX_LIMIT} (2**31-1: the "
                f"kernel indexes with int32); split the batch or the heads over several calls")


def _kind(x: Any) -> str:
    module = type(x).__module__
    if module.startswith("torch"):
        return "torch"
    if module.startswith("cupy"):
        return "cupy"
    return ""


def _device_of(x: Any, kind: str) -> str:
    if kind == "torch":
        return str(x.device)
    return f"cuda:{x.device.id}"


def causal_flags(causal: Any) -> tuple[bool, bool]:
    """``(causal, bottom_right)`` for a ``causal=`` argument: ``False``, ``True`` or
    ``"top_left"`` (top-left alignment), ``"bottom_right"``."""
    if isinstance(causal, bool):
        return causal, False
    if causal == TOP_LEFT:
        return True, False
    if causal == BOTTOM_RIGHT:
        return True, True
    expected = f"causal must be a bool, {TOP_LEFT!r} or {BOTTOM_RIGHT!r}"
    if isinstance(causal, str):
        raise InputValueError(f"{expected}; got {causal!r}")
    raise InputTypeError(f"{expected}; got {type(causal).__name__}")


def variant_args(window: Any, softcap: Any) -> tuple[int, int, float]:
    """``(window_left, window_right, softcap)`` for the ``window=`` and ``softcap=`` arguments:
    ``window`` ``None`` or a pair of ints ``(left, right)``, each ``>= -1`` (-1: unbounded);
    ``softcap`` ``None`` or a finite float ``>= 0`` (0: none)."""
    left = right = -1
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise InputTypeError(f"window must be None or a pair (left, right) of ints; got "
                                 f"{type(window).__name__} {window!r}"[:200])
        for side, value in zip(("left", "right"), window):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputTypeError(f"window's {side} side must be an int (-1: unbounded); "
                                     f"got {type(value).__name__}")
            if value < -1:
                raise InputValueError(f"window's {side} side must be >= -1 (-1: unbounded); "
                                      f"got {value}")
        left, right = int(window[0]), int(window[1])
    cap = 0.0
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
            raise InputTypeError(f"softcap must be a float or None; got "
                                 f"{type(softcap).__name__}")
        if not math.isfinite(softcap) or softcap < 0:
            raise InputValueError(f"softcap must be a finite number >= 0 (0: none); got "
                                  f"{softcap}")
        cap = float(softcap)
    return left, right, cap


def sink_logits(sinks: Any, heads_q: int, q: Any, kind: str) -> Any:
    """Check ``sinks`` (per-query-head sink logits, ``[H_q]``, a floating array of q's library
    on q's device) and return them as the kernels read them: float32, contiguous."""
    if _kind(sinks) != kind:
        expected = "torch.Tensor" if kind == "torch" else "cupy.ndarray"
        raise InputTypeError(f"sinks must be a {expected} like q, or None; got "
                             f"{type(sinks).__name__}")
    if tuple(sinks.shape) != (heads_q,):
        raise InputValueError(f"sinks must have shape [H_q] = ({heads_q},); got "
                              f"{tuple(sinks.shape)}")
    if str(sinks.dtype).rsplit(".", 1)[-1] not in ("float32", "bfloat16", "float16"):
        raise InputTypeError(f"sinks must be float32, bfloat16 or float16; got {sinks.dtype}")
    if _device_of(sinks, kind) != _device_of(q, kind):
        raise InputValueError(f"sinks must be on q's device {_device_of(q, kind)}; got "
                              f"{_device_of(sinks, kind)}")
    if kind == "torch":
        import torch

        return sinks.detach().to(torch.float32).contiguous()
    return sinks.astype("float32", copy=False).ravel()


def problem_from_arrays(q: Any, k: Any, v: Any, causal: Any, scale: Any, window: Any = None,
                        softcap: Any = None, sinks: Any = None,
                        fp8: bool = False) -> tuple[Problem, str]:
    """Validate ``q, k, v`` and the variant arguments and return the :class:`Problem` and the
    array kind (torch / cupy); ``sinks`` is checked by :func:`sink_logits` (only whether it is
    given enters the problem). The arrays' device is checked last (:func:`check_cuda`).

    Raises ``TypeError`` / ``ValueError`` naming the argument; touches no GPU state.
    """
    problem, kind = problem_of_arrays(q, k, v, causal, scale, window, softcap, sinks, fp8)
    check_cuda((("q", q), ("k", k), ("v", v)), kind)
    return problem, kind


def check_cuda(arrays: Sequence[tuple[str, Any]], kind: str) -> None:
    """Raise an :class:`InputValueError` naming the first of ``arrays`` (``(name, array)``
    pairs of one library, ``kind``) that is not on a CUDA device, or saying that they are on
    several. Entry points call it after every other check of their arguments."""
    if kind == "torch":
        for name, x in arrays:
            if not x.is_cuda:
                raise InputValueError(f"{name} must be a CUDA tensor; got a tensor on {x.device}")
    devices = {name: _device_of(x, kind) for name, x in arrays}
    if len(set(devices.values())) > 1:
        names = [name for name, _ in arrays]
        together = f"{', '.join(names[:-1])} and {names[-1]}"
        raise InputValueError(f"{together} must be on one device; got {devices}")


def problem_of_arrays(q: Any, k: Any, v: Any, causal: Any, scale: Any, window: Any = None,
                      softcap: Any = None, sinks: Any = None,
                      fp8: bool = False) -> tuple[Problem, str]:
    """:func:`problem_from_arrays` but for the device check: for entry points that check
    arguments of their own (``out``, ``lse``, ...) first, then call :func:`check_cuda`.
    ``fp8``: q, k and v may be FP8, or k and v an FP8 cache under 16-bit queries
    (``Problem.kv_dtype``): the FP8 entry point's call, which takes their descale factors."""
    kinds = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        kind = _kind(x)
        if not kind:
            raise InputTypeError(
                f"{name} must be a torch.Tensor or cupy.ndarray; got {type(x).__name__}"
            )
        kinds.append(kind)
    if len(set(kinds)) != 1:
        raise InputTypeError(f"q, k and v must be of one array library; got {kinds}")
    kind = kinds[0]
    causal, bottom_right = causal_flags(causal)
    window_left, window_right, cap = variant_args(window, softcap)
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise InputTypeError(f"scale must be a float or None; got {type(scale).__name__}")
        if not math.isfinite(scale) or scale <= 0:
            raise InputValueError(f"scale must be a finite positive number; got {scale}")

    dtypes = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise InputValueError(
                f"{name} must have 4 dims [batch, heads, seqlen, head_dim]; got shape "
                f"{tuple(x.shape)}"
            )
        dtypes[name] = dtype_of(name, x, kind, fp8=fp8)
        stride = x.stride(-1) if kind == "torch" else x.strides[-1] // x.itemsize
        if stride != 1 and x.shape[-1] > 1:
            raise InputValueError(
                f"{name} must be contiguous in its last dim (head_dim); got stride {stride}"
            )
        for axis, what in ((1, "heads"), (2, "seqlen")):
            if x.shape[axis] < 1:
                raise InputValueError(f"{name} must have {what} >= 1; got shape "
                                      f"{tuple(x.shape)}")
    kv_dtype = ""
    if (fp8 and dtypes["k"] == dtypes["v"] and dtypes["k"] in FP8_DTYPES
            and dtypes["q"] not in FP8_DTYPES):
        kv_dtype = dtypes["k"]  # an FP8 K/V cache under 16-bit queries
    elif len(set(dtypes.values())) != 1:
        raise InputTypeError(f"q, k and v must have one dtype; got {dtypes}")
    b, hq, sq, d = q.shape
    bk, hkv, sk, dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise InputValueError(f"v must have the shape of k {tuple(k.shape)}; got {tuple(v.shape)}")
    if bk != b:
        raise InputValueError(f"k must have the batch size of q ({b}); got {bk}")
    if dk != d:
        raise InputValueError(f"k must have the head_dim of q ({d}); got {dk}")
    if hq % hkv:
        raise InputValueError(
            f"q's heads ({hq}) must be a multiple of k's heads ({hkv}) for grouped-query attention"
        )
    if d not in SUPPORTED_HEAD_DIMS:
        raise InputValueError(f"head_dim must be a multiple of 8 in 32..256; got {d}")
    if sinks is not None:
        sink_logits(sinks, int(hq), q, kind)
    problem = Problem(batch=int(b), heads_q=int(hq), heads_kv=int(hkv), seqlen_q=int(sq),
                      seqlen_k=int(sk), head_dim=int(d), dtype=dtypes["q"], causal=causal,
                      bottom_right=bottom_right, window_left=window_left,
                      window_right=window_right, softcap=cap, sinks=sinks is not None,
                      kv_dtype=kv_dtype)
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_reach(name, x, kind, padded_head_dim(problem.head_dim))
    return problem, kind


def check_reach(name: str, x: Any, kind: str, tile_d: int) -> None:
    """Raise unless the furthest element offset the kernel forms in ``x`` fits int32. Equal to
    the (padded) element count for a contiguous tensor, which ``Problem`` checked already; a view
    into a larger buffer (a slice of packed qkv, say) reaches further."""
    strides = x.stride() if kind == "torch" else tuple(s // x.itemsize for s in x.strides)
    # the last (b, h, s) row starts here; its TILE_D loaded columns end tile_d elements later
    last_row = sum((n - 1) * abs(int(st)) for n, st in zip(x.shape[:3], strides[:3]))
    reach = last_row + tile_d
    if reach > INDEX_LIMIT:
        raise UnsupportedProblemError(
            f"{name} must lie within {INDEX_LIMIT} (2**31-1) elements of its first one (the "
            f"kernel indexes with int32); got shape {tuple(x.shape)}, strides {tuple(strides)}: "
            f"its last row ends {reach} elements in (head_dim padded to {tile_d}); pass a "
            f"contiguous tensor or split the batch")
