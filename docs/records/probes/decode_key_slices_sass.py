"""Compile-only (CPU, sm_90): a decode walk of 16 query rows folding each key tile as one
``[16, TILE_N]`` tile (as ``kernels/decode/_kernel.py`` does) or as ``W`` slices of
``TILE_N / W`` keys, each with its own running max and sum, merged once after the walk
(``ct.mma`` on 3-D tiles). Prints, for the key loop of each form's SASS, its instructions, the
named barriers, shared-memory loads and stores and shuffles a key tile costs (section 59 of
``docs/records/benchmarks/paged/issue49/README.md``). Needs ``cuobjdump`` and ``nvdisasm``
on ``PATH`` (the ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels).

    python docs/records/probes/decode_key_slices_sass.py
"""
import collections
import re
import subprocess
import tempfile

import numpy as np
import cuda.tile as ct
from cuda.tile import compilation as ctc

from tiledattention.core._compile import array_constraint, export_cubin

FORMS = ((1, 128, 128), (2, 128, 128), (4, 128, 128), (8, 128, 128), (1, 256, 64),
         (4, 256, 64))  # (W, TILE_N, D)


@ct.kernel
def walk(Q, K, V, Out, n_tiles: int, TILE_N: ct.Constant[int], D: ct.Constant[int],
         W: ct.Constant[int]):
    row = ct.bid(0)
    S = TILE_N // W  # keys a slice
    q = ct.broadcast_to(ct.load(Q, index=(row, 0, 0), shape=(1, 16, D)), (W, 16, D))
    m = ct.full((W, 16, 1), -np.inf, dtype=np.float32)
    l = ct.full((W, 16, 1), 0.0, dtype=np.float32)
    acc = ct.full((W, 16, D), 0.0, dtype=np.float32)
    for j in range(n_tiles):
        k = ct.load(K, index=(row, j, 0), shape=(1, TILE_N, D), latency=2).reshape((W, S, D))
        qk = ct.mma(q, ct.transpose(k, 1, 2), ct.full((W, 16, S), 0.0, dtype=np.float32))
        m_new = ct.maximum(m, ct.max(qk, axis=2, keepdims=True))
        p = ct.exp2(qk - m_new)
        alpha = ct.exp2(m - m_new)
        l = l * alpha + ct.sum(p, axis=2, keepdims=True)
        v = ct.load(V, index=(row, j, 0), shape=(1, TILE_N, D), latency=2).reshape((W, S, D))
        acc = ct.mma(p.astype(v.dtype), v, acc * alpha)
        m = m_new
    scale = ct.exp2(m - ct.max(m, axis=0, keepdims=True))  # the slices merged once
    out = ct.sum(acc * scale, axis=0) / ct.sum(l * scale, axis=0)
    ct.store(Out, index=(row, 0, 0), tile=out.astype(Out.dtype).reshape((1, 16, D)))


def key_loop(sass: str) -> collections.Counter:
    """Opcode counts of the shortest backward-branching loop that holds an MMA."""
    ins = [(int(a, 16), t.strip()) for a, t in
           re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", sass)]
    best = None
    for addr, text in ins:
        hit = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        if hit and int(hit.group(1), 16) < addr:
            body = [t for a, t in ins if int(hit.group(1), 16) <= a <= addr]
            ops = collections.Counter(t.split()[t.startswith("@")].split(".")[0] for t in body)
            if ops["HMMA"] and (best is None or len(body) < sum(best.values())):
                best = ops
    return best or collections.Counter()


def main():
    rows, keys = 84, 1280
    print("W  TILE_N  D  instructions  HMMA  BAR  LDS  STS  SHFL  SYNCS")
    for w, tile_n, d in FORMS:
        arrays = [array_constraint("bf16", shape) for shape in
                  ((rows, 16, d), (rows, keys, d), (rows, keys, d), (rows, 16, d))]
        result = export_cubin(walk, arrays + [ctc.ScalarConstraint(ct.int32), tile_n, d, w],
                              "sm_90", f"walk W{w}")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(result.cubin)
            f.flush()
            sass = subprocess.run(["cuobjdump", "-sass", f.name], check=True,
                                  capture_output=True, text=True).stdout
        ops = key_loop(sass)
        print(f"{w}  {tile_n}  {d}  {sum(ops.values())}  " +
              "  ".join(str(ops[k]) for k in ("HMMA", "BAR", "LDS", "STS", "SHFL", "SYNCS")))


if __name__ == "__main__":
    main()
