"""Shipped cubins and length-free compiles: what cuTile's launcher gets in place of its own
compile of a launch signature.

Every kernel launch of the package goes through :func:`launch`, which is ``ct.launch``. cuTile
compiles a kernel the first time it sees a launch *signature* (the constraints it derives
from the arguments: dtypes, ranks, 16-byte alignment and divisibility, dims of length 1 as
constants, the constants' values) by calling the kernel object's ``_compile(signature,
context, compute_capability)``, which must return ``(cubin, symbol, None, providers)``; it
loads and caches what it gets and launches every later call of that signature itself.

Under a cuda-tile release whose launcher this was checked with (:data:`ANSWERING_RELEASES`),
:func:`launch` first puts a :class:`ShippedCompile` in that place of each kernel object. Where
bundles (:mod:`._bundles`) are installed, it answers a signature with the cubin of an image
built for the same kernel, constants and architecture whose assumptions the signature implies
(:func:`~._bundles.serves`), so no ``tileiras`` process and no cuTile front end run. Any other
signature is compiled with no assumption on its arrays' lengths (:func:`~._bundles.any_length`,
as the images are), once per such signature: cuTile's own signatures tell a token count, a
sequence count or a cache length divisible by 16 from one that is not, so a packed batch whose
lengths change from step to step would otherwise compile each kernel again for every new
combination (8-13 s a compile on an H200, in 8 of the first 30 steps of a padding-free
training run: ``docs/records/benchmarks/varlen/hf-padding-free/``). With
``TILEDATTENTION_JIT=0`` (read at the first launch) such a signature raises
:class:`CompileRequiredError` instead. The launch itself, its streams, CUDA graphs and
programmatic dependent launch, stays cuTile's, at its cost.

An image's arrays are compiled with the same length-free assumptions, and the dims of length 1
(batch 1, one query row) are constants in cuTile's ``cutile_python_v2`` calling convention, so
one image serves every sequence length and every batch of more than one (``tiledtune aot``
also builds the batch-1 images).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

from ._bundles import (any_length, bundle_paths, constants_key, convention_of, current_entries,
                       kernel_name, param_specs, read_member, serves)
from ._lazy import lazy_module
from ..errors import CompileRequiredError, InputValueError, LaunchOutOfMemoryError

ct = lazy_module("cuda.tile", globals(), "ct")

__all__ = ["ANSWERING_RELEASES", "ENV_JIT", "Image", "ShippedCompile", "compiles", "jit_allowed",
           "launch", "launch_path", "recording", "reset", "served", "shipped_images"]

ENV_JIT = "TILEDATTENTION_JIT"
#: cuda-tile releases whose launcher takes a ``_compile`` answer as :class:`ShippedCompile`
#: gives it (``(cubin, symbol, None, providers)``; checked on an H200 with 1.7.0). Under any
#: other, shipped cubins are not used (every kernel compiles, or with ``TILEDATTENTION_JIT=0``
#: is refused).
ANSWERING_RELEASES = ("1.7.",)


def jit_allowed() -> bool:
    """Whether a launch without a shipped image may compile (``TILEDATTENTION_JIT`` is not
    ``0``, ``false`` or ``no``), as the environment says now. Launches read it once, on the
    first launch of the process and after :func:`reset`."""
    return os.environ.get(ENV_JIT, "1").strip().lower() not in ("0", "false", "no")


class Image:
    """One shipped kernel: its parameters as compiled (:func:`~._bundles.param_specs`), its
    symbol, and its cubin (read from the bundle on first use)."""

    def __init__(self, symbol: str, params: list, cubin_reader: Any) -> None:
        self.symbol = symbol
        self.params = params
        self._read_cubin = cubin_reader
        self._cubin: bytes | None = None

    @property
    def cubin(self) -> bytes:
        if self._cubin is None:
            self._cubin = self._read_cubin()
        return self._cubin


def shipped_images(paths: Sequence[Path] | None = None, arch: str | None = None) -> dict:
    """``{kernel name: {arch: {constants: [Image, ...]}}}`` of every current image in the
    bundles (``bundle_paths()`` by default; only ``arch``'s when given;
    :func:`~._bundles.current_entries`)."""
    found: dict = {}
    seen: set = set()
    for path, arch, entry in current_entries(paths, arch):
        key = (entry["kernel"], arch, repr(entry["params"]))
        if key in seen:  # (the same image in two bundles: the first is used)
            continue
        seen.add(key)
        reader = functools.partial(read_member, path, entry["file"])
        found.setdefault(entry["kernel"], {}).setdefault(arch, {}).setdefault(
            constants_key(entry["params"]), []).append(
                Image(entry["symbol"], entry["params"], reader))
    return found


def _find(images_by_arch: dict, arch: str, params: list) -> Image | None:
    """The first image for ``arch`` that serves a launch with parameters ``params``."""
    for image in images_by_arch.get(arch, {}).get(constants_key(params), ()):
        if serves(image.params, params):
            return image
    return None


class ShippedCompile:
    """A kernel object's ``_compile`` under a release of :data:`ANSWERING_RELEASES` (or,
    under another, where bundles or ``TILEDATTENTION_JIT=0`` are in use): a signature that an
    image serves gets the image's cubin; any other one goes to cuTile's compile
    (``original``) with its length assumptions dropped (:meth:`compile_length_free`; under
    another release or calling convention as it came), or raises
    :class:`CompileRequiredError` where ``jit`` is false. The images are the bundles' for the
    launch's architecture (read on its first compile). ``served`` counts the signatures
    answered from images, ``compiled`` the length-free compiles, ``reused`` the signatures
    answered by an earlier one of those."""

    def __init__(self, kernel: Any, original: Any, jit: bool) -> None:
        self.kernel = kernel
        self.original = original
        self.jit = jit
        self.served = 0
        self.compiled = 0
        self.reused = 0
        self._answers: dict = {}  # length-free signature -> cuTile's answer to it
        self._lock = threading.Lock()

    def __call__(self, signature: Any, context: Any, compute_capability: Any = None) -> tuple:
        from cuda.tile._cext import get_compute_capability

        capability = tuple(compute_capability or get_compute_capability())
        arch = "sm_{}{}".format(*capability)
        # the package's own calling convention for these parameters (the one images are built
        # for and length-free compiles were checked with), under a release that takes answers
        ours = False
        if ct.__version__.startswith(ANSWERING_RELEASES):
            try:
                params = param_specs(self.kernel, signature.parameters)
            except InputValueError:  # a parameter no image has a convention for
                params = None
            ours = params is not None and (signature.calling_convention.name
                                           == convention_of(params))
        image = (_find(_loaded_images(arch).get(kernel_name(self.kernel), {}), arch, params)
                 if ours else None)
        if image is not None:
            self.served += 1
            return image.cubin, image.symbol, None, ()
        if not self.jit:
            raise CompileRequiredError(
                f"{kernel_name(self.kernel)} has no shipped cubin for this launch on {arch} and "
                f"{ENV_JIT}=0 forbids compiling it: build one with `tiledtune aot` (its "
                f"problem or schedule), or unset {ENV_JIT}")
        if not ours:
            return self.original(signature, context, compute_capability)
        return self.compile_length_free(signature, context, capability)

    def compile_length_free(self, signature: Any, context: Any, capability: tuple) -> tuple:
        """cuTile's compile of ``signature`` with no assumption on its arrays' lengths
        (:func:`~._bundles.any_length`), once per such signature and architecture: a later
        signature that differs only in which lengths divide by 16 gets the same answer. The
        code is right for it (the lengths and strides are passed to the kernel whatever their
        divisibility; the parameters' layout does not change) and as fast as far as measured
        (eight dense calls on an H200: ``docs/records/benchmarks/varlen/hf-padding-free/``)."""
        from cuda.tile import compilation as ctc

        params = tuple(any_length(p) for p in signature.parameters)
        key = repr((params, signature.calling_convention, capability))  # (values unhashable)
        with self._lock:
            answer = self._answers.get(key)
            if answer is not None:
                self.reused += 1
                return answer
            general = signature if params == tuple(signature.parameters) else (
                ctc.KernelSignature(params, calling_convention=signature.calling_convention))
            answer = self._answers[key] = self.original(general, context, capability)
            self.compiled += 1
            return answer


# -- the launch -----------------------------------------------------------------------------------
_lock = threading.Lock()
_prepared: dict[Any, ShippedCompile | None] = {}  # kernel object -> its hook, or None (plain)
_images: dict[str, dict] = {}  # arch -> shipped_images(arch=arch), read on its first compile
_jit: bool | None = None  # jit_allowed() at the first launch


def reset() -> None:
    """Forget what was read of the bundles and of ``TILEDATTENTION_JIT`` and give every kernel
    its own ``_compile`` back (tests; a process that changed ``TILEDATTENTION_CUBINS`` or
    ``TILEDATTENTION_JIT``). Signatures cuTile has already loaded a kernel for keep it."""
    global _jit
    with _lock:
        for kernel, hook in _prepared.items():
            if hook is not None:
                vars(kernel).pop("_compile", None)
        _prepared.clear()
        _images.clear()
        _jit = None


def _loaded_images(arch: str) -> dict:
    """:func:`shipped_images` of ``arch`` in the bundles in use, read once (until
    :func:`reset`)."""
    found = _images.get(arch)
    if found is None:
        found = _images[arch] = shipped_images(arch=arch)
    return found


def _prepare(kernel: Any) -> ShippedCompile | None:
    """Put a :class:`ShippedCompile` in ``kernel``'s ``_compile`` under a release of
    :data:`ANSWERING_RELEASES`, or where bundles are installed or compiling is switched off
    (once per kernel object)."""
    global _jit
    with _lock:
        if kernel in _prepared:
            return _prepared[kernel]
        if _jit is None:
            _jit = jit_allowed()
        hook = None
        if not _jit or bundle_paths() or ct.__version__.startswith(ANSWERING_RELEASES):
            hook = ShippedCompile(kernel, kernel._compile, _jit)
            kernel._compile = hook
        _prepared[kernel] = hook
        return hook


_recording: list | None = None  # recording()'s list


@contextlib.contextmanager
def recording() -> Iterator[list]:
    """Within: each launch's ``(stream, grid, kernel, args, options)`` is appended to the list
    yielded (a benchmark replays a call's launches with it)."""
    global _recording
    before, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = before


def served() -> int:
    """How many launch signatures cuTile has been given a shipped cubin for, in all."""
    return sum(hook.served for hook in list(_prepared.values()) if hook is not None)


def compiles() -> tuple[int, int]:
    """``(compiled, reused)``: how many length-free compiles ran in this process, and how many
    launch signatures got the code of an earlier one
    (:meth:`ShippedCompile.compile_length_free`)."""
    hooks = [hook for hook in list(_prepared.values()) if hook is not None]
    return sum(h.compiled for h in hooks), sum(h.reused for h in hooks)


#: cuTile's message for a launch the driver refused for want of device memory
_LAUNCH_OOM = "Failed to launch cuTile kernel: out of memory"


def launch(stream: Any, grid: tuple, kernel: Any, args: Sequence[Any], **options: Any) -> None:
    """``ct.launch(stream, grid, kernel, args, **options)``, with ``kernel``'s compiles
    answered from shipped cubins where one serves (:class:`ShippedCompile`); a launch the
    driver refuses for want of device memory raises :class:`LaunchOutOfMemoryError`."""
    if kernel not in _prepared:
        _prepare(kernel)
    if _recording is not None:
        _recording.append((stream, grid, kernel, args, options))
    try:
        ct.launch(stream, grid, kernel, args, **options)
    except RuntimeError as exc:
        if str(exc) != _LAUNCH_OOM:
            raise
        name = getattr(getattr(kernel, "_pyfunc", None), "__name__", type(kernel).__name__)
        raise LaunchOutOfMemoryError(
            f"CUDA out of memory. The GPU has no memory left to launch tiledattention's "
            f"{name} kernel (grid {tuple(grid)}); free some (torch.cuda.empty_cache() returns "
            f"torch's cached blocks) or make the call smaller") from exc


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
    images = _loaded_images(arch)
    missing = sum(_find(images.get(kernel_name(kernel), {}), arch, param_specs(kernel, args))
                  is None for kernel, args, _, _ in builds)
    if missing == 0:
        return f"shipped cubins ({len(builds)} kernel variant(s); no compiler runs)"
    return (f"{jit}: {missing} of {len(builds)} kernel variant(s) have no shipped cubin for {arch} "
            "(`tiledtune aot` builds them)")
