"""What every family's compile-only build shares: the architectures tileiras knows, the result
of one build, and what a cubin says about itself (static shared memory)."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from .errors import InputValueError

__all__ = ["ARCHITECTURES", "CompileResult", "check_arch", "cubin_shared_bytes", "generation"]

#: Architectures tileiras accepts (``--gpu-name``; no ``a``/``f`` suffixes), and the GPU
#: generation each belongs to (defaults and search spaces differ by generation).
GENERATIONS = {
    "sm_80": "ampere", "sm_86": "ampere", "sm_87": "ampere", "sm_88": "ampere",
    "sm_89": "ada",
    "sm_90": "hopper",
    "sm_100": "blackwell", "sm_103": "blackwell", "sm_107": "blackwell", "sm_110": "blackwell",
    "sm_120": "blackwell-consumer", "sm_121": "blackwell-consumer",
}
ARCHITECTURES = tuple(GENERATIONS)


def check_arch(arch: object) -> str:
    """``arch`` if tileiras knows it, else :class:`InputValueError` saying what it takes."""
    if not isinstance(arch, str) or not re.fullmatch(r"sm_\d{2,3}", arch):
        raise InputValueError(f"arch must look like 'sm_90'; got {arch!r}")
    if arch not in ARCHITECTURES:
        raise InputValueError(f"arch must be one of {', '.join(ARCHITECTURES)}; got {arch!r}")
    return arch


def generation(arch: str) -> str:
    """The GPU generation of ``arch``: ampere, ada, hopper, blackwell, blackwell-consumer."""
    return GENERATIONS[check_arch(arch)]


@dataclass(frozen=True)
class CompileResult:
    arch: str
    cubin_size: int
    seconds: float
    cubin: bytes
    shared_bytes: int | None  # static shared memory of the kernel (None: not in the cubin)


def cubin_shared_bytes(cubin: bytes) -> int | None:
    """Static shared memory of the kernel: the size of the cubin's ``.nv.shared.<kernel>`` ELF
    section. (Register counts and spills need cuobjdump, which the pip toolchain lacks.)"""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        return None
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQII", cubin, shoff + i * shentsize)
                for i in range(shnum)]
    names_at = sections[shstrndx][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return cubin[start:cubin.index(b"\0", start)].decode(errors="replace")

    for sh_name, _, _, _, _, size, _, _ in sections:
        label = name(sh_name)
        if label.startswith(".nv.shared.") and not label.startswith(".nv.shared.reserved"):
            return size
    return None


