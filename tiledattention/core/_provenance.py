"""Where a measurement comes from: the family's template identity and the toolchain versions.

A stored timing is only comparable with one made by the same kernel template and toolchain; the
schedule database keeps this next to every row and the lookup skips rows whose template differs.
"""

from __future__ import annotations

import functools
import re

from db import Provenance

from ._family import Family

__all__ = ["Provenance", "current_provenance", "toolchain_versions"]


def _version(dist: str) -> str:
    from importlib import metadata  # ~10 ms: only a measurement's provenance asks

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


@functools.lru_cache(maxsize=1)
def _tileiras_version() -> str:
    version = _version("nvidia-cuda-tileiras")
    if version:
        return version
    import subprocess

    try:  # a tileiras on PATH (e.g. the GPU machine's unpacked toolchain)
        text = subprocess.run(["tileiras", "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    match = re.search(r"V(\d+\.\d+\.\d+)", text) or re.search(r"(\d+\.\d+\.\d+)", text)
    return match.group(1) if match else ""


def _driver_version() -> str:
    try:
        import cupy

        version = cupy.cuda.runtime.driverGetVersion()
    except Exception:  # no CuPy, no driver, no GPU: provenance says so by staying empty
        return ""
    return f"{version // 1000}.{version % 1000 // 10}"


def current_provenance(family: Family) -> Provenance:
    """Provenance of measurements of ``family``'s kernels made by this process now."""
    return Provenance(template_hash=family.template_identity(), cuda_tile=_version("cuda-tile"),
                      tileiras=_tileiras_version(), torch=_version("torch"),
                      driver=_driver_version())


def toolchain_versions() -> dict[str, str]:
    """The cuda-tile and tileiras versions this process compiles with."""
    return {"cuda_tile": _version("cuda-tile"), "tileiras": _tileiras_version()}
