"""Launches of a prepared call straight through the CUDA driver, without ``ct.launch``'s
per-launch work.

``ct.launch`` resolves a launch's kernel anew on every call: each tensor becomes a DLPack
capsule, the arguments' layouts and alignments are profiled and hashed into a signature, the
stream's context is looked up and switched to, and only then does ``cuLaunchKernelEx`` run: 8-13
µs of host time a launch on an H200's host (``docs/records/benchmarks/backward/host-time.md``).
A prepared call (a warm path's plan, whose arrays have the shapes, strides and dtypes the plan
was made for) needs none of it after its first launch. :class:`DirectLaunch` keeps what that
launch resolved, the kernel's cubin (loaded once more, with ``cuLibraryLoadData``) and its
parameter words in cuTile's calling convention (per parameter: a constant takes no bytes, a
scalar one word, an array its address, then its shape, then its strides), and each call writes
its arrays' addresses and its scalars into those words and calls ``cuLaunchKernelEx`` as
``ct.launch`` does: a thread block of (1, 1, 1), no dynamic shared memory (what it uses for a
kernel whose compile returned no size program), the programmatic-dependent-launch attribute
when asked.

The cubin is the answer cuTile's compile hook (``_aot.ShippedCompile``) gave or relayed for the
launch's own signature (:func:`record_answer`), so a direct launch runs the code ``ct.launch``
runs. Where anything is missing (no hook answered that signature, no ``libcuda``, a compile that
returned a shared-memory program or tensor maps, a parameter outside the package's calling
convention, ``TILEDATTENTION_DIRECT_LAUNCH=0``), or a call's array is not aligned as the first
launch's was (the code assumes it), or the driver refuses the launch, the launch goes through
``ct.launch``.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from typing import Any, Callable, Sequence

from ._bundles import param_specs

__all__ = ["ENV_DIRECT", "DirectLaunch", "count", "direct_allowed", "launched", "record_answer"]

ENV_DIRECT = "TILEDATTENTION_DIRECT_LAUNCH"

_lock = threading.Lock()
#: (kernel, repr of the launch signature's param_specs) -> (cubin, symbol), or None where the
#: compile's answer needs more than a cubin (a shared-memory program, tensor maps)
_answers: dict = {}
_libraries: dict = {}  # (cubin, symbol) -> the loaded CUkernel handle
_driver: Any = None  # _Driver, or False where libcuda cannot be loaded
_counts = {"direct": 0, "fallback": 0}


def direct_allowed() -> bool:
    """Whether prepared calls may launch directly (``TILEDATTENTION_DIRECT_LAUNCH`` is not
    ``0``, ``false`` or ``no``), as the environment says now."""
    return os.environ.get(ENV_DIRECT, "1").strip().lower() not in ("0", "false", "no")


def count(how: str) -> None:
    """Count one prepared launch made ``how`` (``"direct"`` or ``"fallback"``)."""
    _counts[how] += 1


def launched() -> dict:
    """How many launches went straight to the driver and how many prepared launches fell
    back to ``ct.launch`` (tests, probes)."""
    return dict(_counts)


def record_answer(kernel: Any, params: list, answer: tuple) -> None:
    """Note cuTile's compile answer for ``kernel`` launched with parameters ``params``
    (:func:`~._bundles.param_specs` of the launch's signature): ``(cubin, symbol,
    shared-memory program, tensor maps)``."""
    cubin, symbol, smem_program, tensor_maps = answer
    usable = smem_program is None and not tensor_maps
    with _lock:
        _answers[(kernel, repr(params))] = (cubin, symbol) if usable else None


# -- the driver ------------------------------------------------------------------------------
_LAUNCH_ATTRIBUTE_PDL = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class _LaunchAttribute(ctypes.Structure):
    # (the value is a 64-byte union; the attribute set here is its first int)
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint),
                ("block_z", ctypes.c_uint), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


class _Driver:
    """The four driver entry points a direct launch needs, from ``libcuda``."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.load = lib.cuLibraryLoadData
        self.load.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_uint]
        self.get_kernel = lib.cuLibraryGetKernel
        self.get_kernel.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                    ctypes.c_char_p]
        self.launch = lib.cuLaunchKernelEx
        self.launch.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_void_p]
        for fn in (self.load, self.get_kernel, self.launch):
            fn.restype = ctypes.c_int

    def kernel(self, cubin: bytes, symbol: str) -> int | None:
        """The CUkernel of ``symbol`` in ``cubin`` (loaded once per process), or ``None``."""
        key = (cubin, symbol)
        handle = _libraries.get(key)
        if handle is None:
            library, kernel = ctypes.c_void_p(), ctypes.c_void_p()
            if (self.load(ctypes.byref(library), cubin, None, None, 0, None, None, 0)
                    or self.get_kernel(ctypes.byref(kernel), library, symbol.encode())):
                return None
            handle = _libraries[key] = kernel.value
        return handle


def _get_driver() -> Any:
    global _driver
    if _driver is None:
        try:
            _driver = _Driver()
        except (OSError, AttributeError):
            _driver = False
    return _driver


# -- one launch ------------------------------------------------------------------------------
def _f32_word(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


class DirectLaunch:
    """The launch of ``kernel`` on ``grid`` with arguments laid out as ``args`` (a launch
    ``ct.launch`` has made, so that cuTile's compile has answered its signature), ready to be
    made again with other arrays of the same shapes, strides and dtypes and other scalars:
    :meth:`__call__`. :meth:`make` returns ``None`` where it cannot be made (module
    docstring)."""

    __slots__ = ("_words", "_params", "_config", "_attrs", "_kernel", "_arrays", "_scalars",
                 "_lock")

    @classmethod
    def make(cls, grid: Sequence[int], kernel: Any, args: Sequence[Any],
             pdl: bool = False) -> "DirectLaunch | None":
        driver = _get_driver()
        if not driver or not direct_allowed():
            return None
        try:
            from cuda.tile._cext import CallingConvention, get_parameter_constraints_from_pyargs

            constraints = get_parameter_constraints_from_pyargs(
                kernel, tuple(args), CallingConvention.cutile_python_v2())
            params = param_specs(kernel, constraints)
        except Exception:  # (a parameter outside the package's calling convention)
            return None
        with _lock:
            answer = _answers.get((kernel, repr(params)))
        if answer is None:
            return None
        handle = driver.kernel(*answer)
        if handle is None:
            return None
        try:
            return cls(grid, handle, args, params, pdl)
        except (AttributeError, TypeError):  # (an array that is not a torch tensor)
            return None

    def __init__(self, grid: Sequence[int], handle: int, args: Sequence[Any], params: list,
                 pdl: bool) -> None:
        words: list = []
        self._arrays: list = []  # (argument index, word index, the alignment it was given)
        self._scalars: list = []  # (argument index, word index, kind, first value, its word)
        for at, (arg, spec) in enumerate(zip(args, params)):
            kind = spec["kind"]
            if kind == "array":
                self._arrays.append((at, len(words), (spec["base_divisible_by"] or 1) - 1))
                words.append(arg.data_ptr())
                mask = (1 << (64 if spec["index_dtype"] == "int64" else 32)) - 1
                words.extend(n & mask for n in (*arg.shape, *arg.stride()))
            elif kind in ("i32", "f32"):
                word = arg & 0xFFFFFFFF if kind == "i32" else _f32_word(arg)
                self._scalars.append((at, len(words), kind, arg, word))
                words.append(word)
        self._words = (ctypes.c_uint64 * max(len(words), 1))(*words)
        base = ctypes.addressof(self._words)
        self._params = (ctypes.c_void_p * max(len(words), 1))(
            *(base + 8 * i for i in range(len(words))))
        self._attrs = (_LaunchAttribute * 1)()
        if pdl:
            self._attrs[0].id = _LAUNCH_ATTRIBUTE_PDL
            self._attrs[0].value[0] = 1  # programmaticStreamSerializationAllowed
        grid = (*grid, 1, 1)[:3]
        self._config = _LaunchConfig(grid[0], grid[1], grid[2], 1, 1, 1, 0, None,
                                     self._attrs, 1 if pdl else 0)
        self._kernel = handle
        self._lock = threading.Lock()  # the words are shared: one launch writes them at a time

    def __call__(self, stream: int, args: Sequence[Any]) -> bool:
        """Launch with ``args`` on the raw CUDA stream ``stream``; ``False`` (nothing
        launched) where an array is not aligned as the first launch's was (the code was
        compiled for that), or the driver refused the launch."""
        words = self._words
        with self._lock:
            for at, word, misaligned in self._arrays:
                address = args[at].data_ptr()
                if address & misaligned:  # (the code assumes the first launch's alignment)
                    return False
                words[word] = address
            for at, word, kind, first, first_word in self._scalars:
                value = args[at]
                words[word] = (first_word if value == first else
                               value & 0xFFFFFFFF if kind == "i32" else _f32_word(value))
            config = self._config
            config.stream = stream
            return not _driver.launch(ctypes.byref(config), self._kernel, self._params, None)
