"""The few CUDA driver calls that launch a shipped cubin without cuTile: load the cubin as a
library, find its kernel, allow it the device's shared memory, launch it on a stream.

Through ``ctypes`` on the driver library every CUDA process has (``libcuda.so.1``), so that a
shipped kernel runs with neither ``tileiras`` nor cuTile's front end. ``cuda.tile``'s own launch
does the same for a JIT-compiled kernel: block (1, 1, 1) (the cubin carries its thread count),
no dynamic shared memory, and the kernel's limit on dynamic shared memory raised to what the
device allows beyond the kernel's static use (the carve-out the compiled kernel expects).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

from ..errors import DriverError

__all__ = ["load_kernel", "launch_kernel"]

#: CUfunction_attribute / CUdevice_attribute values (cuda.h)
_SHARED_SIZE_BYTES = 1
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


@functools.cache
def _lib() -> Any:
    name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise DriverError(f"the CUDA driver library {name} cannot be loaded: {exc}") from exc
    void_p, c_int, c_uint = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
    signatures = {
        "cuLibraryLoadData": [ctypes.POINTER(void_p), ctypes.c_char_p, void_p, void_p, c_uint,
                              void_p, void_p, c_uint],
        "cuLibraryGetKernel": [ctypes.POINTER(void_p), void_p, ctypes.c_char_p],
        "cuKernelGetAttribute": [ctypes.POINTER(c_int), c_int, void_p, c_int],
        "cuKernelSetAttribute": [c_int, c_int, void_p, c_int],
        "cuDeviceGet": [ctypes.POINTER(c_int), c_int],
        "cuDeviceGetAttribute": [ctypes.POINTER(c_int), c_int, c_int],
        "cuLaunchKernel": [void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                           void_p, void_p, void_p],
    }
    for fn, argtypes in signatures.items():
        getattr(lib, fn).argtypes = argtypes
        getattr(lib, fn).restype = c_int
    return lib


def _check(result: int, call: str) -> None:
    if result != 0:
        raise DriverError(f"{call} failed with CUDA driver error {result}")


def load_kernel(cubin: bytes, symbol: str, device: int) -> int:
    """Load ``cubin`` (a library of one kernel, ``symbol``) and ready that kernel for CUDA
    device ``device``; return its handle for :func:`launch_kernel`."""
    lib = _lib()
    library, kernel = ctypes.c_void_p(), ctypes.c_void_p()
    _check(lib.cuLibraryLoadData(ctypes.byref(library), cubin, None, None, 0, None, None, 0),
           "cuLibraryLoadData")
    _check(lib.cuLibraryGetKernel(ctypes.byref(kernel), library, symbol.encode()),
           f"cuLibraryGetKernel({symbol})")
    dev, optin, static = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    _check(lib.cuDeviceGetAttribute(ctypes.byref(optin), _MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                    dev), "cuDeviceGetAttribute")
    _check(lib.cuKernelGetAttribute(ctypes.byref(static), _SHARED_SIZE_BYTES, kernel, dev),
           "cuKernelGetAttribute")
    if static.value > optin.value:
        raise DriverError(f"{symbol} needs {static.value} bytes of shared memory; device "
                          f"{device} has {optin.value}")
    _check(lib.cuKernelSetAttribute(_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin.value - static.value,
                                    kernel, dev), "cuKernelSetAttribute")
    return kernel.value


def launch_kernel(kernel: int, grid: tuple[int, int, int], stream: int, params: Any) -> None:
    """Launch ``kernel`` over ``grid`` on ``stream`` (a ``CUstream`` handle as an int) with
    ``params``, the driver's array of pointers to each argument."""
    _check(_lib().cuLaunchKernel(kernel, grid[0], grid[1], grid[2], 1, 1, 1, 0, stream, params,
                                 None), "cuLaunchKernel")
