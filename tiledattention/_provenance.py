"""Where a measurement came from: compiler, framework, driver and kernel-template versions.

A stored timing is only comparable with one made by the same kernel template and toolchain; the
schedule database keeps this next to every row and the lookup skips rows whose template differs.
"""

from __future__ import annotations

import functools
import hashlib
import re
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

__all__ = ["Provenance", "template_hash", "current_provenance"]


@dataclass(frozen=True, kw_only=True)
class Provenance:
    template_hash: str  # sha1 of the kernel template source, 12 hex digits
    cuda_tile: str
    tileiras: str
    torch: str
    driver: str  # CUDA driver version as "13.0", or "" when no GPU was involved

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Provenance":
        names = ("template_hash", "cuda_tile", "tileiras", "torch", "driver")
        missing = [n for n in names if n not in data]
        if missing:
            raise ValueError(f"provenance lacks {missing}")
        bad = [n for n in names if not isinstance(data[n], str)]
        if bad:
            raise ValueError(f"provenance fields {bad} must be strings")
        return cls(**{n: data[n] for n in names})

    def toolchain(self) -> tuple[str, str, str]:
        """The part that decides whether timings are comparable."""
        return (self.template_hash, self.cuda_tile, self.tileiras)


@functools.lru_cache(maxsize=1)
def template_hash() -> str:
    """Hash of ``_kernel.py`` and ``_launch.py``: the code that decides what a schedule compiles to."""
    here = Path(__file__).parent
    digest = hashlib.sha1()
    for name in ("_kernel.py", "_launch.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:12]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


@functools.lru_cache(maxsize=1)
def _tileiras_version() -> str:
    version = _version("nvidia-cuda-tileiras")
    if version:
        return version
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


def current_provenance() -> Provenance:
    """Provenance of measurements made by this process now."""
    return Provenance(template_hash=template_hash(), cuda_tile=_version("cuda-tile"),
                      tileiras=_tileiras_version(), torch=_version("torch"),
                      driver=_driver_version())
