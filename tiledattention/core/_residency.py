"""How many CTAs of a compiled kernel an SM holds at once, from what its cubin asks
(:class:`~tiledattention.core._cubin.KernelResources`) and the architecture's per-SM limits
(the CUDA C++ Programming Guide's table of compute capabilities; the occupancy calculator's
rules, as CUDA's ``cuda_occupancy.h`` applies them: registers granted a warp at a time in
units of 256, from four sub-partitions of the register file, one quarter each).

The 1 KiB of shared memory the system reserves a CTA: from sm_90 on it is inside what a cuTile
cubin declares (its ``.nv.shared.<kernel>`` size): the backward's partials-sum kernel, whose one
buffer is a 64 x 64 float32 tile (16 KiB), declares 17,408 bytes on sm_90 and 17,420 on sm_100
and sm_120, and the D 128 backward's dQ kernel declares 232,712 on sm_90, more than the 227 KiB
a CTA may have beside the reserved KiB, and runs on an H200; there a CTA takes what it
declares (at least the reserved KiB) of the SM's whole shared memory. On sm_80, sm_86 and sm_89
the same sum kernel declares 16,384 bytes: the reserved KiB comes on top."""

from __future__ import annotations

from dataclasses import dataclass

from ._cubin import KernelResources

__all__ = ["SmLimits", "SM_LIMITS", "Residency", "resident_ctas"]

_WARP = 32
_REGISTER_UNIT = 256  # registers are granted to a warp in units of this many
_SUB_PARTITIONS = 4  # an SM's register file is split between this many; a warp lives in one
_RESERVED_SHARED = 1024  # bytes of shared memory the system keeps per CTA


@dataclass(frozen=True)
class SmLimits:
    """One SM's limits: resident threads and CTAs, 32-bit registers, its shared memory (the
    reserved KiB of each CTA's included), and whether a cubin's declared shared memory holds the
    reserved KiB (``declares_reserved``) or it comes on top."""

    threads: int
    ctas: int
    shared_bytes: int
    declares_reserved: bool = True
    registers: int = 65536


#: By architecture, where the Programming Guide gives them (not for sm_88, sm_107, sm_110).
SM_LIMITS = {
    "sm_80": SmLimits(threads=2048, ctas=32, shared_bytes=164 << 10,
                      declares_reserved=False),
    "sm_86": SmLimits(threads=1536, ctas=16, shared_bytes=100 << 10,
                      declares_reserved=False),
    "sm_87": SmLimits(threads=1536, ctas=16, shared_bytes=164 << 10,
                      declares_reserved=False),
    "sm_89": SmLimits(threads=1536, ctas=24, shared_bytes=100 << 10,
                      declares_reserved=False),
    "sm_90": SmLimits(threads=2048, ctas=32, shared_bytes=228 << 10),
    "sm_100": SmLimits(threads=2048, ctas=32, shared_bytes=228 << 10),
    "sm_103": SmLimits(threads=2048, ctas=32, shared_bytes=228 << 10),
    "sm_120": SmLimits(threads=1536, ctas=32, shared_bytes=100 << 10),
    "sm_121": SmLimits(threads=1536, ctas=32, shared_bytes=100 << 10),
}


@dataclass(frozen=True)
class Residency:
    """``ctas`` of the kernel an SM holds at once (0: it cannot launch), and which limits
    allow no more (of "registers", "shared memory", "threads", "CTAs")."""

    ctas: int
    limited_by: tuple[str, ...]

    def describe(self) -> str:
        if self.ctas == 0:
            return f"does not fit an SM ({', '.join(self.limited_by)})"
        return (f"{self.ctas} CTA{'s' if self.ctas != 1 else ''} an SM "
                f"(limited by {' and '.join(self.limited_by)})")


def resident_ctas(resources: KernelResources, arch: str) -> Residency | None:
    """How many CTAs of the kernel of ``resources`` an SM of ``arch`` holds at once; ``None``
    where the limits of ``arch`` (``SM_LIMITS``) or the kernel's threads are not known."""
    limits = SM_LIMITS.get(arch)
    if limits is None or not resources.threads:
        return None
    warps = -(-resources.threads // _WARP)
    per_warp = max(_REGISTER_UNIT,
                   -(-resources.registers * _WARP // _REGISTER_UNIT) * _REGISTER_UNIT)
    # a CTA's warps as the launch check counts them: rounded up to the sub-partitions
    fits_a_cta = per_warp * -(-warps // _SUB_PARTITIONS) * _SUB_PARTITIONS <= limits.registers
    register_warps = (limits.registers // _SUB_PARTITIONS // per_warp) * _SUB_PARTITIONS
    bounds = {
        "registers": register_warps // warps if fits_a_cta else 0,
        "shared memory": limits.shared_bytes // (
            max(resources.shared_bytes, _RESERVED_SHARED) if limits.declares_reserved
            else resources.shared_bytes + _RESERVED_SHARED),
        "threads": limits.threads // resources.threads,
        "CTAs": limits.ctas,
    }
    ctas = min(bounds.values())
    return Residency(ctas=ctas, limited_by=tuple(k for k, v in bounds.items() if v == ctas))
