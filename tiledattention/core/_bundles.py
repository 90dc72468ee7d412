"""The cubin bundle format of ``tiledtune aot``: what one shipped kernel is, and its file.

A *bundle* is a zip file, ``cubins-<arch>.zip``: a ``manifest.json`` and the cubins it names.
Each manifest entry (an *image*) is one kernel compiled for one architecture with one set of
compile-time constants: the kernel's name and compiler options (:func:`kernel_name`), the
modules whose code it was compiled from and their template identity
(:func:`~._identity.module_identity`), its symbol, and per parameter what it was compiled
for (:func:`param_specs`: a constant's value, a left-out placeholder, an int32 or float32
scalar, or an array's :class:`ArraySpec`). :func:`current_entries` reads the images whose
template has not changed since their build; :mod:`._aot` launches them.

Bundles are read from ``tiledattention/pretuned/cubins-*.zip`` (``tiledtune aot
--into-package`` writes them before a wheel is built), from the user's cubin cache
(``tiledtune warm``) and from the files named in ``TILEDATTENTION_CUBINS``
(``os.pathsep``-separated).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from ._identity import module_identity
from ._settings import cubin_cache
from ..errors import InputValueError

__all__ = ["ArraySpec", "BUNDLE_FORMAT", "ENV_CUBINS", "PACKAGE_BUNDLES", "any_length",
           "bundle_paths", "constants_key", "convention_of", "current_entries", "kernel_name",
           "param_specs", "read_manifest", "read_member", "serves", "write_bundle"]

ENV_CUBINS = "TILEDATTENTION_CUBINS"
BUNDLE_FORMAT = 2  # 2: each image's calling convention and every array assumption
#: where a wheel's bundles lie (``tiledtune aot --into-package`` writes them)
PACKAGE_BUNDLES = Path(__file__).resolve().parents[1] / "pretuned"


def kernel_name(kernel: Any) -> str:
    """``module:qualname`` of a ``ct.kernel``'s function and its compiler options: what tells
    two kernel objects apart (``replace_hints`` makes one per option set). The module is
    named from the ``tiledattention`` package down, also where a Kernel Hub build vendors it
    under a package of its own, so the Hub build's bundles are the wheel's."""
    fn = kernel._annotated_function.pyfunc
    o = kernel._compiler_options
    parts = fn.__module__.split(".")
    module = ".".join(parts[parts.index("tiledattention"):] if "tiledattention" in parts
                      else parts)
    return (f"{module}:{fn.__qualname__}[ctas={o.num_ctas},occ={o.occupancy},"
            f"opt={o.opt_level},warps={o.num_worker_warps}]")


@dataclass(frozen=True)
class ArraySpec:
    """The assumptions an array argument was compiled under (an ``ArrayConstraint``'s)."""

    dtype: str  # cuTile's name: bfloat16, float16, float32, int32, ...
    ndim: int
    index_dtype: str
    stride_constant: tuple  # per dim: the stride it must have, or None
    shape_constant: tuple  # per dim: the length it must have (1 or None: the launch's)
    stride_lower_bound: tuple  # per dim: an inclusive lower bound of the stride, or None
    stride_divisible_by: tuple
    shape_divisible_by: tuple
    base_divisible_by: int
    may_alias_internally: bool
    alias_groups: tuple

    def to_json(self) -> dict:
        return {"kind": "array", "dtype": self.dtype, "ndim": self.ndim,
                "index_dtype": self.index_dtype,
                "stride_constant": list(self.stride_constant),
                "shape_constant": list(self.shape_constant),
                "stride_lower_bound": list(self.stride_lower_bound),
                "stride_divisible_by": list(self.stride_divisible_by),
                "shape_divisible_by": list(self.shape_divisible_by),
                "base_divisible_by": self.base_divisible_by,
                "may_alias_internally": self.may_alias_internally,
                "alias_groups": list(self.alias_groups)}

    @classmethod
    def from_json(cls, data: dict) -> "ArraySpec":
        return cls(data["dtype"], data["ndim"], data["index_dtype"],
                   tuple(data["stride_constant"]), tuple(data["shape_constant"]),
                   tuple(data["stride_lower_bound"]), tuple(data["stride_divisible_by"]),
                   tuple(data["shape_divisible_by"]), data["base_divisible_by"],
                   data["may_alias_internally"], tuple(data["alias_groups"]))

    @classmethod
    def of(cls, constraint: Any) -> "ArraySpec":
        """The spec of a ``cuda.tile.compilation.ArrayConstraint``."""
        c = constraint
        return cls(c.dtype.name, c.ndim, c.index_dtype.name, tuple(c.stride_constant),
                   tuple(c.shape_constant), tuple(c.stride_lower_bound_incl),
                   tuple(c.stride_divisible_by), tuple(c.shape_divisible_by),
                   c.base_addr_divisible_by or 1, bool(c.may_alias_internally),
                   tuple(c.alias_groups))

    def serves(self, call: "ArraySpec") -> bool:
        """Whether code compiled under this spec is right for an array the launch describes
        as ``call``: the same layout of parameters (dtype, rank, index type, constant shapes
        and strides) and every assumption of this spec implied by ``call``'s."""
        if (self.dtype, self.ndim, self.index_dtype, self.stride_constant,
                self.shape_constant) != (call.dtype, call.ndim, call.index_dtype,
                                         call.stride_constant, call.shape_constant):
            return False
        if call.may_alias_internally and not self.may_alias_internally:
            return False
        if not set(call.alias_groups) <= set(self.alias_groups):
            return False  # (every group the launch allows aliasing in, this code allows too)
        for mine, theirs in zip(self.stride_lower_bound, call.stride_lower_bound):
            if mine is not None and (theirs is None or theirs < mine):
                return False
        pairs = (zip(self.stride_divisible_by, call.stride_divisible_by),
                 zip(self.shape_divisible_by, call.shape_divisible_by),
                 ((self.base_divisible_by, call.base_divisible_by),))
        return all(theirs % mine == 0 for group in pairs for mine, theirs in group)


def any_length(arg: Any) -> Any:
    """``arg`` (an export's or a launch's parameter constraint) with no assumption on the
    lengths of a call: an array may have any length along every dim but the last of an array of
    4 or more dims (the head dim of a ``[B, H, S, D]`` array, a page pool or a decode step's 5-D
    view), and a table of at most 2 dims (ranges, work and block tables, descale factors: read
    element by element, never by a bulk copy) any row stride; a dim of length 1 stays the
    constant the launch makes of it, and every other constraint is ``arg`` itself. Code compiled
    under it serves every sequence length, token count and sequence count of the same pattern
    (:func:`serves`): lengths and strides pass to the kernel either way."""
    divisible = getattr(arg, "shape_divisible_by", None)
    if divisible is None:
        return arg
    ndim = len(divisible)
    shape = (1,) * (ndim - 1) + (tuple(divisible[-1:]) if ndim >= 4 else (1,))
    stride = (1,) * ndim if ndim <= 2 else tuple(arg.stride_divisible_by)
    if (tuple(divisible), tuple(arg.stride_divisible_by)) == (shape, stride):
        return arg
    return dataclasses.replace(arg, shape_divisible_by=shape, stride_divisible_by=stride)


def param_specs(kernel: Any, args: Sequence[Any]) -> list:
    """The parameters of ``kernel`` compiled or launched with ``args`` (an export's
    constraints or constant values, or the ``KernelSignature.parameters`` of a launch), per
    parameter as JSON values: ``{"kind": "const", "value": v}``, ``{"kind": "omit"}`` (no
    bytes: a non-constant parameter given a constant or an empty tuple), ``{"kind": "i32"}`` /
    ``{"kind": "f32"}`` or an :class:`ArraySpec`'s."""
    from cuda.tile import compilation as ctc

    annotations = kernel._annotated_function.parameter_annotations
    if len(annotations) != len(args):
        raise InputValueError(f"{kernel_name(kernel)} has {len(annotations)} parameters; "
                              f"got {len(args)} arguments")
    specs: list = []
    for annotation, arg in zip(annotations, args):
        if annotation.constant:
            value = arg.value if isinstance(arg, ctc.ConstantConstraint) else arg
            specs.append({"kind": "const", "value": value})
        elif isinstance(arg, ctc.ConstantConstraint) or (
                isinstance(arg, ctc.TupleConstraint) and not arg.items):
            specs.append({"kind": "omit"})
        elif isinstance(arg, ctc.ScalarConstraint):
            kind = {"int32": "i32", "float32": "f32"}.get(arg.dtype.name)
            if kind is None:
                raise InputValueError(f"a scalar of {arg.dtype.name} has no shipped "
                                      "calling convention here (int32 and float32 have)")
            specs.append({"kind": kind})
        elif isinstance(arg, ctc.ArrayConstraint):
            specs.append(ArraySpec.of(arg).to_json())
        else:
            raise InputValueError(f"an argument of {type(arg).__name__} has no shipped "
                                  "calling convention")
    return specs


def convention_of(params: Sequence[dict]) -> str:
    """The calling convention ``ct.launch`` picks for a launch with parameters ``params``
    (:func:`param_specs`): the oldest that can pass them, ``cutile_python_v2`` where a
    parameter takes no bytes (an empty tuple) or an array has a dim of constant length,
    else ``cutile_python_v1``."""
    newer = any(p["kind"] == "omit" or (p["kind"] == "array"
                                        and any(c is not None for c in p["shape_constant"]))
                for p in params)
    return "cutile_python_v2" if newer else "cutile_python_v1"


def serves(image: Sequence[dict], call: Sequence[dict]) -> bool:
    """Whether an image compiled with parameters ``image`` is right for a launch whose
    parameters are ``call`` (both :func:`param_specs`)."""
    if len(image) != len(call):
        return False
    for mine, theirs in zip(image, call):
        if mine["kind"] != theirs["kind"]:
            return False
        if mine["kind"] == "array":
            if not ArraySpec.from_json(mine).serves(ArraySpec.from_json(theirs)):
                return False
        elif mine != theirs:  # (constants: equal values)
            return False
    return True


def constants_key(params: Sequence[dict]) -> tuple:
    """The values of an image's constant parameters, in order, as a launch passes them (JSON
    lists become tuples): the key a launch's constants are looked up by."""
    return tuple(_freeze(spec["value"]) for spec in params if spec["kind"] == "const")


def _freeze(value: Any) -> Any:
    """A JSON value as the hashable Python value a launch passes (lists become tuples)."""
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


def bundle_paths() -> list[Path]:
    """The bundle files in use: the package's, ``tiledtune warm``'s (the cubin cache,
    :func:`~._settings.cubin_cache`), then ``TILEDATTENTION_CUBINS``'s."""
    found = sorted(PACKAGE_BUNDLES.glob("cubins-*.zip"))
    found += sorted(cubin_cache().glob("cubins-*.zip"))
    extra = os.environ.get(ENV_CUBINS, "")
    found += [Path(p) for p in extra.split(os.pathsep) if p]
    return found


def read_manifest(path: Path) -> dict:
    """A bundle's manifest; raises :class:`InputValueError` naming a file that is no bundle."""
    try:
        with zipfile.ZipFile(path) as bundle:
            manifest = json.loads(bundle.read("manifest.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise InputValueError(f"{path} is not a cubin bundle: {exc}") from exc
    if manifest.get("format") != BUNDLE_FORMAT:
        raise InputValueError(f"{path}: bundle format {manifest.get('format')!r}; this "
                              f"tiledattention reads format {BUNDLE_FORMAT}")
    return manifest


def write_bundle(path: Path, arch: str, images: Iterable[dict], versions: dict) -> int:
    """Write a bundle of ``images`` (each: ``kernel``, ``modules``, ``identity``, ``params``,
    ``symbol`` and its ``cubin`` bytes) for ``arch``; return how many images it holds.
    Identical cubins are stored once."""
    entries, cubins = [], {}
    for image in images:
        digest = hashlib.sha256(image["cubin"]).hexdigest()[:24]
        cubins[f"{digest}.cubin"] = image["cubin"]
        entries.append({k: v for k, v in image.items() if k != "cubin"}
                       | {"file": f"{digest}.cubin"})
    manifest = {"format": BUNDLE_FORMAT, "arch": arch, "versions": versions, "images": entries}
    tmp = path.with_suffix(".tmp")
    # LZMA: a third smaller than deflate on cubins (35.8 MB, not 54, for the three wheel
    # architectures with their PTX text; without_ptx_text blanks that before)
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_LZMA) as out:
        out.writestr("manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
        for name, data in sorted(cubins.items()):
            out.writestr(name, data)
    os.replace(tmp, path)
    return len(entries)


def current_entries(paths: Sequence[Path] | None = None,
                    arch: str | None = None) -> Iterator[tuple[Path, str, dict]]:
    """``(bundle, arch, entry)`` of every image in the bundles (``bundle_paths()`` by default),
    only ``arch``'s when given, whose template is the one installed now; an image built from
    another version of its template is left out. A bundle that cannot be read is warned about
    and skipped; one named for another architecture (``cubins-<arch>[-<tag>].zip``, as
    ``tiledtune aot`` and ``warm`` name them) is not read."""
    for path in bundle_paths() if paths is None else paths:
        named = re.match(r"cubins-(sm_\d+)(-|\.zip$)", path.name)
        if arch is not None and named is not None and named.group(1) != arch:
            continue
        try:
            manifest = read_manifest(path)
        except InputValueError as exc:
            warnings.warn(f"tiledattention: {exc}; its cubins are not used", stacklevel=3)
            continue
        if arch is not None and manifest["arch"] != arch:
            continue
        for entry in manifest["images"]:
            if module_identity(*entry["modules"]) == entry["identity"]:  # (cached)
                yield path, manifest["arch"], entry


def read_member(path: Path, name: str) -> bytes:
    with zipfile.ZipFile(path) as bundle:
        return bundle.read(name)
