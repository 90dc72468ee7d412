"""The element types of attention's inputs, declared once: each short name (what problems,
keys, files and the command line say) with its torch, cuda.tile and CuPy names and its size.

Every table of dtypes in the project derives from :data:`ELEMENTS` (the problem's check, the
tensor checks of the entry points, the compile-only array types, a test case's inputs, the
command line's choices); which of them a family's kernels take is the family's own declaration
(``Family.tolerances``). A new input dtype is one line here and one entry per family that takes
it (``docs/extending.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InputTypeError, UnsupportedProblemError

__all__ = ["Element", "ELEMENTS", "DTYPES", "FP8_DTYPES", "element", "dtype_of", "torch_dtype",
           "array_itemsize"]


@dataclass(frozen=True, kw_only=True)
class Element:
    """One input dtype: ``name`` (short: ``"bf16"``), ``torch`` (the attribute of ``torch``
    and of ``cuda.tile``: ``"bfloat16"``), ``cupy`` (CuPy's dtype name, ``None`` where CuPy
    has none), ``itemsize`` in bytes, and ``output``: the short name of the dtype attention's
    output has for these inputs (``None``: the inputs' own)."""

    name: str
    torch: str
    cupy: str | None
    itemsize: int
    output: str | None = None

    @property
    def output_name(self) -> str:
        """The short name of the output's dtype."""
        return self.output or self.name


#: The input dtypes, in the order the command line lists them (the first is its default).
ELEMENTS: dict[str, Element] = {e.name: e for e in (
    Element(name="bf16", torch="bfloat16", cupy=None, itemsize=2),  # CuPy has no bfloat16
    Element(name="fp16", torch="float16", cupy="float16", itemsize=2),
    # FP8 attention (Hopper and later): e4m3 inputs with descale factors, a bf16 output
    Element(name="e4m3", torch="float8_e4m3fn", cupy=None, itemsize=1, output="bf16"),
)}
#: Short dtype names used in keys, files and on the command line.
DTYPES = tuple(ELEMENTS)
#: The 8-bit float dtypes: inputs that come with descale factors (``q_descale``, ...).
FP8_DTYPES = ("e4m3",)
#: The other arrays the kernels read or write (statistics, offsets), for compile-only builds.
_AUXILIARY = {"fp32": Element(name="fp32", torch="float32", cupy="float32", itemsize=4),
              "int32": Element(name="int32", torch="int32", cupy="int32", itemsize=4),
              # offsets a caller passes as int64, and row indices torch takes as int64
              "int64": Element(name="int64", torch="int64", cupy="int64", itemsize=8),
              # an FP8 cache's values as the decode kernel reads them, two to a word
              "int16": Element(name="int16", torch="int16", cupy="int16", itemsize=2)}
_BY_LIBRARY_NAME = {("torch", e.torch): e.name for e in ELEMENTS.values()}
_BY_LIBRARY_NAME.update({("cupy", e.cupy): e.name for e in ELEMENTS.values() if e.cupy})


def element(name: str) -> Element:
    """The input dtype ``name`` (or an auxiliary array's, ``"fp32"`` / ``"int32"``)."""
    found = ELEMENTS.get(name) or _AUXILIARY.get(name)
    if found is None:
        raise UnsupportedProblemError(f"dtype must be one of {DTYPES}; got {name!r}")
    return found


def _names(kind: str, fp8: bool) -> str:
    names = [getattr(e, kind) for e in ELEMENTS.values()
             if getattr(e, kind) and (fp8 or e.name not in FP8_DTYPES)]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def dtype_of(name: str, x: Any, kind: str = "torch", fp8: bool = False) -> str:
    """The short name of array ``x``'s dtype (``kind``: ``"torch"`` or ``"cupy"``); an
    :class:`InputTypeError` naming the argument ``name`` when no family takes it, or (without
    ``fp8``: an entry point that takes no FP8 inputs) when it is an FP8 dtype."""
    dtype = str(x.dtype)
    found = _BY_LIBRARY_NAME.get((kind, dtype.rsplit(".", 1)[-1]))
    if found is None or (found in FP8_DTYPES and not fp8):
        hint = " (cast with .to(torch.bfloat16))" if kind == "torch" else ""
        raise InputTypeError(f"{name} must be {_names(kind, fp8)}; got {dtype}{hint}")
    return found


def torch_dtype(name: str) -> Any:
    """The torch dtype of the short name ``name``."""
    import torch

    return getattr(torch, element(name).torch)


def array_itemsize(name: str) -> int:
    return element(name).itemsize
