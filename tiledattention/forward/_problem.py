"""The attention problem a call describes, and the checks that turn bad input into clear errors.

``Problem`` is the key the schedule database, the tuner and the lookup share: architecture-free
shape, dtype and masking. ``problem_from_arrays`` validates torch tensors or CuPy arrays and
builds it; nothing here touches the GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from ..errors import InputTypeError, InputValueError, UnsupportedProblemError

__all__ = ["Problem", "DTYPES", "SUPPORTED_HEAD_DIMS", "problem_from_arrays", "padded_head_dim"]

#: Short dtype names used in keys, files and on the command line.
DTYPES = ("bf16", "fp16")
#: Head dims the kernel supports: multiples of 8 (16-byte rows for TMA) from 32 to 256. A head dim
#: that is not a power of two is padded to the next one inside the kernel (zero-filled loads).
SUPPORTED_HEAD_DIMS = tuple(range(32, 257, 8))


def padded_head_dim(head_dim: int) -> int:
    return 1 << (head_dim - 1).bit_length()


@dataclass(frozen=True, kw_only=True)
class Problem:
    """Shape, dtype and masking of one attention call (``[B, H, S, D]`` layout)."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str
    causal: bool

    def __post_init__(self) -> None:
        for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UnsupportedProblemError(f"{name} must be a positive int; got {value!r}")
        if self.dtype not in DTYPES:
            raise UnsupportedProblemError(f"dtype must be one of {DTYPES}; got {self.dtype!r}")
        if not isinstance(self.causal, bool):
            raise UnsupportedProblemError(f"causal must be a bool; got {self.causal!r}")
        if self.heads_q % self.heads_kv:
            raise UnsupportedProblemError(
                f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})"
            )
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise UnsupportedProblemError(
                f"head_dim must be a multiple of 8 in 32..256; got {self.head_dim}"
            )

    @property
    def group_size(self) -> int:
        """Query heads per K/V head (1: MHA; heads_q: MQA)."""
        return self.heads_q // self.heads_kv

    @property
    def flops(self) -> float:
        """4·B·H·S_q·S_k·D, counting only the unmasked part when causal (top-left alignment)."""
        return 4.0 * self.batch * self.heads_q * self.head_dim * self.attended_pairs

    @property
    def attended_pairs(self) -> int:
        """Number of (query, key) pairs attended per head."""
        sq, sk = self.seqlen_q, self.seqlen_k
        if not self.causal:
            return sq * sk
        # row i sees keys 0..min(i, sk-1): sum over i of min(i+1, sk)
        full = min(sq, sk)
        return full * (full + 1) // 2 + max(0, sq - sk) * sk

    def as_tuple(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (the database and the row files store this)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Problem":
        """Inverse of :meth:`to_dict`; every field is required, none may be unknown."""
        if not isinstance(data, Mapping):
            raise UnsupportedProblemError(f"a problem must be a mapping; got "
                                          f"{type(data).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        missing = [name for name in names if name not in data]
        if unknown or missing:
            raise UnsupportedProblemError(f"expected fields {names}; unknown {unknown}, "
                                          f"missing {missing}")
        return cls(**data)

    def describe(self) -> str:
        kv = f"/{self.heads_kv}" if self.heads_kv != self.heads_q else ""
        sk = f"x{self.seqlen_k}" if self.seqlen_k != self.seqlen_q else ""
        mask = "causal" if self.causal else "full"
        return (f"B{self.batch} H{self.heads_q}{kv} S{self.seqlen_q}{sk} D{self.head_dim} "
                f"{self.dtype} {mask}")


_TORCH_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
_CUPY_DTYPES = {"float16": "fp16"}  # CuPy has no bfloat16 dtype of its own


def _kind(x: Any) -> str:
    module = type(x).__module__
    if module.startswith("torch"):
        return "torch"
    if module.startswith("cupy"):
        return "cupy"
    return ""


def _dtype_name(name: str, x: Any, kind: str) -> str:
    table = _TORCH_DTYPES if kind == "torch" else _CUPY_DTYPES
    dtype = str(x.dtype)
    if dtype not in table:
        raise InputTypeError(
            f"{name} must be bfloat16 or float16; got {dtype} (cast with .to(torch.bfloat16))"
        )
    return table[dtype]


def _device_of(x: Any, kind: str) -> str:
    if kind == "torch":
        return str(x.device)
    return f"cuda:{x.device.id}"


def problem_from_arrays(q: Any, k: Any, v: Any, causal: Any, scale: Any) -> tuple[Problem, str]:
    """Validate ``q, k, v`` and return the :class:`Problem` and the array kind (torch / cupy).

    Raises ``TypeError`` / ``ValueError`` naming the argument; touches no GPU state.
    """
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
    if not isinstance(causal, bool):
        raise InputTypeError(f"causal must be a bool; got {type(causal).__name__}")
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
        dtypes[name] = _dtype_name(name, x, kind)
        stride = x.stride(-1) if kind == "torch" else x.strides[-1] // x.itemsize
        if stride != 1 and x.shape[-1] > 1:
            raise InputValueError(
                f"{name} must be contiguous in its last dim (head_dim); got stride {stride}"
            )
        if x.shape[2] < 1:
            raise InputValueError(f"{name} must have seqlen >= 1; got shape {tuple(x.shape)}")
    if len(set(dtypes.values())) != 1:
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
    for name, x in (("q", q), ("k", k), ("v", v)):
        if kind == "torch" and not x.is_cuda:
            raise InputValueError(f"{name} must be a CUDA tensor; got a tensor on {x.device}")
    devices = {name: _device_of(x, kind) for name, x in (("q", q), ("k", k), ("v", v))}
    if len(set(devices.values())) != 1:
        raise InputValueError(f"q, k and v must be on one device; got {devices}")
    problem = Problem(batch=int(b), heads_q=int(hq), heads_kv=int(hkv), seqlen_q=int(sq),
                      seqlen_k=int(sk), head_dim=int(d), dtype=dtypes["q"], causal=causal)
    return problem, kind
