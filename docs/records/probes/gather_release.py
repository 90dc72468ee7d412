"""Compile-only repro (CPU, cuda-tile 1.7.0, tileiras 13.4.92, 2026-11-29): a gathered TMA load
(``ct.load_advanced_indexing``) followed by an atomic with release semantics fails to compile
for sm_90 ("Return code 5 / failed to compile Tile IR program", no location; the paged decode
kernel with such a merge failed so for sm_100 too, and for sm_120 tileiras ran past 10 minutes
and was stopped). Without the atomic, with ``memory_order=RELAXED`` or ``ACQUIRE``, or with
the gather's ``allow_tma=False``, it compiles. (The decode kernels have neither the merge nor
the gather now: both were reverted, docs/records/benchmarks/paged/issue49/README.md.)

    python docs/records/probes/gather_release.py [sm_90]

Printed on 2026-11-29: acq_rel FAIL, release FAIL, relaxed ok, acquire ok, no_tma ok.
"""

import sys

import cuda.tile as ct
import numpy as np

from tiledattention.core._compile import array_constraint, export_cubin

ConstInt = ct.Constant[int]


def make(order, allow_tma):
    @ct.kernel
    def gather_then_count(A, Out, Counters, N: ConstInt):
        row = ct.bid(0)
        pages = ct.arange(4, dtype=ct.int32) + row
        tile = ct.load_advanced_indexing(A, (pages, ct.Slice(0, 16), ct.Slice(0, 64)),
                                         padding_mode=ct.PaddingMode.ZERO, allow_tma=allow_tma)
        tile = tile.reshape((64, 64)).astype(np.float32)
        ct.store(Out, (row, 0), tile)
        done = ct.atomic_add(Counters, row, 1, memory_order=order)
        if done == N - 1:
            ct.store(Out, (row, 0), tile * 2.0)
    return gather_then_count


def main() -> None:
    arch = sys.argv[1] if len(sys.argv) > 1 else "sm_90"
    orders = ct.MemoryOrder
    for name, order, tma in (("acq_rel", orders.ACQ_REL, None), ("release", orders.RELEASE, None),
                             ("relaxed", orders.RELAXED, None), ("acquire", orders.ACQUIRE, None),
                             ("no_tma", orders.ACQ_REL, False)):
        args = [array_constraint("bf16", (64, 16, 64)), array_constraint("fp32", (256, 64)),
                array_constraint("int32", (4,)), 4]
        try:
            export_cubin(make(order, tma), args, arch, name)
            print(name, "ok")
        except Exception as exc:  # the point of the probe
            print(name, "FAIL", str(exc)[:120])


if __name__ == "__main__":
    main()
