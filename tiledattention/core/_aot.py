"""Shipped cubins: kernels compiled ahead of time (``tiledtune aot``), launched through the
CUDA driver.

Every kernel launch of the package goes through :func:`launch`. When the bundles
(:mod:`._bundles`) hold an image of the launch's kernel, constants and architecture whose
array constraints its arguments meet, the image's cubin runs through the driver
(:mod:`._driver`): no ``tileiras`` process and no cuTile front-end compile, so a fresh process
runs at speed on its first call. Any other launch is ``ct.launch`` (the JIT), unless
``TILEDATTENTION_JIT=0`` (read at the first launch): then it raises
:class:`CompileRequiredError` instead of compiling.

An image's arrays are compiled for the layouts the launchers pass (a contiguous last dim,
16-byte aligned bases and rows) with no assumption on the length of any dimension but a 4-D
array's head dim, so one image serves every sequence length and batch; a launch whose arrays
break a constraint (an unaligned view, a dtype the image was not built for) takes the JIT.

The binary calling convention (cuTile's ``cutile_python_v1``): the kernel's parameters in
order, ``ct.Constant`` ones and zero-byte placeholders left out; an array is its base pointer,
its shape and its strides (int32, in elements); an int scalar an int32, a float a float32.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
import threading
from pathlib import Path
from typing import Any, Sequence

from . import _driver
from . import _plans as hot
from ._bundles import (ArraySpec, bundle_paths, constants_key, current_entries, kernel_name,
                       param_specs, read_member)
from ._device import device_info
from ._lazy import lazy_module
from ..errors import CompileRequiredError

ct = lazy_module("cuda.tile", globals(), "ct")

__all__ = ["ENV_JIT", "Image", "jit_allowed", "launch", "launch_path", "reset",
           "shipped_image", "shipped_images"]

ENV_JIT = "TILEDATTENTION_JIT"
_INT32_MAX = 2 ** 31 - 1


def jit_allowed() -> bool:
    """Whether a launch without a shipped image may compile (``TILEDATTENTION_JIT`` is not
    ``0``, ``false`` or ``no``), as the environment says now. Launches read it once, on the
    first launch of the process and after :func:`reset`."""
    return os.environ.get(ENV_JIT, "1").strip().lower() not in ("0", "false", "no")


class _ArrayCheck:
    """:meth:`fields` of an argument under one :class:`~._bundles.ArraySpec`, with the spec's tests
    reduced to the dimensions that have one (what every launch of an image runs)."""

    __slots__ = ("spec", "torch_dtype", "stride_tests", "stride_values", "shape_tests", "passed")

    def __init__(self, spec: ArraySpec) -> None:
        self.spec = spec
        self.torch_dtype: Any = None  # looked up on the first torch argument
        self.stride_tests = tuple((d, n) for d, n in enumerate(spec.stride_divisible_by) if n > 1)
        self.stride_values = tuple((d, c) for d, c in enumerate(spec.stride_constant)
                                   if c is not None)
        self.shape_tests = tuple((d, n) for d, n in enumerate(spec.shape_divisible_by) if n > 1)
        self.passed: tuple = ()  # the (shape, strides) that last passed the tests

    def fields(self, value: Any) -> tuple | None:
        """``(pointer, *shape, *strides)`` of ``value`` (a torch tensor or CuPy array), or None
        where it breaks a constraint (then the JIT runs the launch)."""
        spec = self.spec
        if hasattr(value, "data_ptr"):  # torch
            if value.dtype is not self.torch_dtype:
                if self.torch_dtype is not None or str(value.dtype)[6:] != spec.dtype:
                    return None
                self.torch_dtype = value.dtype
            pointer, shape, strides = value.data_ptr(), value.shape, value.stride()
        elif hasattr(value, "data") and hasattr(value, "strides"):  # CuPy
            if value.dtype.name != spec.dtype:
                return None
            size = value.itemsize
            pointer, shape = value.data.ptr, value.shape
            strides = tuple(s // size for s in value.strides)
        else:
            return None
        if pointer % spec.base_divisible_by:
            return None
        if (shape, strides) == self.passed:  # a plan's arrays keep their layout call to call
            return (pointer, *shape, *strides)
        if len(shape) != spec.ndim:
            return None
        for d, n in self.stride_tests:
            if strides[d] % n:
                return None
        for d, c in self.stride_values:
            if strides[d] != c:
                return None
        for d, n in self.shape_tests:
            if shape[d] % n:
                return None
        if min(strides) < 0 or max(strides) > _INT32_MAX or max(shape) > _INT32_MAX:
            return None
        self.passed = (shape, strides)
        return (pointer, *shape, *strides)


class Image:
    """One shipped kernel: its cubin, symbol and parameters; packs a launch's arguments into the
    driver's parameter buffer and launches it."""

    def __init__(self, symbol: str, specs: list, cubin_reader: Any) -> None:
        self.symbol = symbol
        self._read_cubin = cubin_reader
        self._cubin: bytes | None = None
        self._handles: dict[int, int] = {}  # device -> the loaded kernel
        self._lock = threading.Lock()
        # (argument index, an array's check or "i"/"f") of the parameters that take bytes
        self.slots: list[tuple[int, Any]] = []
        layout = ""
        offsets: list[int] = []
        size = 0
        for index, spec in enumerate(specs):
            kind = spec["kind"]
            if kind in ("const", "omit"):
                continue
            if kind == "array":
                array = ArraySpec.from_json(spec)
                self.slots.append((index, _ArrayCheck(array)))
                codes = "Q" + "i" * (2 * array.ndim)
            else:
                self.slots.append((index, "i" if kind == "i32" else "f"))
                codes = self.slots[-1][1]
            for code in codes:
                width = struct.calcsize(code)
                pad = -size % width
                layout += "x" * pad + code
                offsets.append(size + pad)
                size += pad + width
        self._struct = struct.Struct("<" + layout)
        self._buffer = ctypes.create_string_buffer(max(size, 1))
        base = ctypes.addressof(self._buffer)
        self._params = (ctypes.c_void_p * max(len(offsets), 1))(*(base + o for o in offsets))

    def values(self, args: Sequence[Any]) -> list | None:
        """The launch's argument bytes as values in :attr:`slots` order, or None where an
        array breaks its constraints (a scalar out of int32 range too)."""
        values: list = []
        for index, spec in self.slots:
            arg = args[index]
            if spec == "i":
                if not -_INT32_MAX - 1 <= arg <= _INT32_MAX:
                    return None
                values.append(arg)
            elif spec == "f":
                values.append(arg)
            else:
                fields = spec.fields(arg)
                if fields is None:
                    return None
                values.extend(fields)
        return values

    def handle(self, device: int) -> int:
        handle = self._handles.get(device)
        if handle is None:
            if self._cubin is None:  # kept: the driver may load the image lazily, on first use
                self._cubin = self._read_cubin()
            handle = self._handles[device] = _driver.load_kernel(self._cubin, self.symbol,
                                                                 device)
        return handle

    def launch(self, stream: int, grid: tuple, args: Sequence[Any], device: int) -> bool:
        """Launch on ``stream``; False (nothing launched) where the arguments do not fit."""
        values = self.values(args)
        if values is None:
            return False
        handle = self.handle(device)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        with self._lock:  # one parameter buffer: the driver copies it during the call
            self._struct.pack_into(self._buffer, 0, *values)
            _driver.launch_kernel(handle, grid, stream, self._params)
        return True


def shipped_images(paths: Sequence[Path] | None = None) -> dict:
    """``{kernel name: {arch: {constants: Image}}}`` of every current image in the bundles
    (``bundle_paths()`` by default; :func:`~._bundles.current_entries`)."""
    found: dict = {}
    for path, arch, entry in current_entries(paths):
        reader = functools.partial(read_member, path, entry["file"])
        found.setdefault(entry["kernel"], {}).setdefault(arch, {}).setdefault(
            constants_key(entry["params"]), Image(entry["symbol"], entry["params"], reader))
    return found


# -- the launch -----------------------------------------------------------------------------------
class _KernelImages:
    """The images of one kernel object, by architecture and constants."""

    __slots__ = ("const_at", "by_arch")

    def __init__(self, kernel: Any, by_arch: dict) -> None:
        annotations = kernel._annotated_function.parameter_annotations
        self.const_at = tuple(i for i, a in enumerate(annotations) if a.constant)
        self.by_arch = by_arch


_UNSEEN = object()
_kernels: dict[Any, Any] = {}  # kernel object -> _KernelImages, or None where none is shipped
_images: dict | None = None  # shipped_images(), read on the first launch
_jit: bool | None = None  # jit_allowed() at the first launch (an environment read costs ~1 µs)


def reset() -> None:
    """Forget what was read of the bundles and of ``TILEDATTENTION_JIT`` (tests; a process
    that changed ``TILEDATTENTION_CUBINS`` or ``TILEDATTENTION_JIT``)."""
    global _images, _jit
    _images = None
    _jit = None
    _kernels.clear()


def _loaded_images() -> dict:
    """:func:`shipped_images` of the bundles in use, read once (until :func:`reset`)."""
    global _images
    if _images is None:
        _images = shipped_images()
    return _images


def _device_of(args: Sequence[Any]) -> int | None:
    """The CUDA device of the launch's first array (torch or CuPy)."""
    for arg in args:
        if hasattr(arg, "get_device"):  # torch
            return arg.get_device()
        device = getattr(arg, "device", None)
        if device is not None:  # CuPy
            return device.id
    return None


def _current_device() -> int:
    hot.bind_torch()  # (once; returns at once after)
    return hot.current_device()


def _stream_handle(stream: Any) -> int:
    if isinstance(stream, int):
        return stream
    for name in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        if hasattr(stream, name):
            return int(getattr(stream, name))
    return int(stream)


def _shipped(kernel: Any, args: Sequence[Any]) -> tuple[Image, int] | None:
    """``(image, device)`` of a launch of ``kernel`` with ``args`` on a CUDA device, or None
    where no shipped image has its kernel, architecture and constants."""
    entry = _kernels.get(kernel, _UNSEEN)
    if entry is _UNSEEN:
        by_arch = _loaded_images().get(kernel_name(kernel))
        entry = _kernels[kernel] = None if by_arch is None else _KernelImages(kernel, by_arch)
    if entry is None:
        return None
    device = _device_of(args)
    if device is None or device < 0:  # no CUDA array: the JIT's launch says what is wrong
        return None
    images = entry.by_arch.get(device_info(device).arch)
    image = None if images is None else images.get(tuple(args[i] for i in entry.const_at))
    return None if image is None else (image, device)


def shipped_image(kernel: Any, args: Sequence[Any]) -> Image | None:
    """The image a launch of ``kernel`` with ``args`` would run, or None (the JIT's)."""
    found = _shipped(kernel, args)
    return None if found is None else found[0]


def launch_path(family: Any, problem: Any, schedule: Any, arch: str) -> str:
    """How a call of ``family`` with ``schedule`` launches its kernels on ``arch`` (``explain``):
    from shipped cubins, or by the JIT (and how many of the kernel variants such a call may
    launch, :meth:`Family.compile_launchable`'s, no bundle holds). Nothing is compiled to
    tell."""
    from ._compile import capturing

    jit = "JIT" if jit_allowed() else f"refused ({ENV_JIT}=0)"
    if not bundle_paths():  # (and the kernels are not imported to tell)
        return f"{jit}: no cubin bundle is installed (`tiledtune aot` builds them)"
    with capturing(compile=False) as builds:
        family.compile_launchable(problem, schedule, arch)
    images = _loaded_images()
    missing = 0
    for kernel, args, _, _ in builds:
        key = constants_key(param_specs(kernel, args))
        if key not in images.get(kernel_name(kernel), {}).get(arch, {}):
            missing += 1
    if missing == 0:
        return f"shipped cubins ({len(builds)} kernel variant(s); no compiler runs)"
    return (f"{jit}: {missing} of {len(builds)} kernel variant(s) have no shipped cubin for {arch} "
            "(`tiledtune aot` builds them)")


def launch(stream: Any, grid: tuple, kernel: Any, args: Sequence[Any], **options: Any) -> None:
    """Launch ``kernel`` over ``grid`` on ``stream`` with ``args`` (``ct.launch``'s
    arguments and options): from a shipped cubin where one fits, else by cuTile's JIT (or,
    with ``TILEDATTENTION_JIT=0``, :class:`CompileRequiredError`). A shipped launch leaves
    ``programmatic_dependent_launch`` out: the kernel then simply waits for its predecessor
    (what the option lets overlap), with the same results."""
    found = _shipped(kernel, args)
    if found is not None:
        image, device = found
        # the driver launches in the thread's current context: the arrays' device's
        if device == _current_device() and image.launch(_stream_handle(stream), grid, args,
                                                        device):
            return
    global _jit
    if _jit is None:
        _jit = jit_allowed()
    if not _jit:
        raise CompileRequiredError(
            f"{kernel_name(kernel)} has no shipped cubin for this call and {ENV_JIT}=0 "
            "forbids compiling it: build one with `tiledtune aot` (its problem or schedule), "
            f"or unset {ENV_JIT}")
    ct.launch(stream, grid, kernel, args, **options)
