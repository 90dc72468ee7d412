"""What cuTile 1.7 / tileiras 13.4 compile e4m3 decode products and half-precision exponentials
to on sm_90 (issue 52's bars; CPU only, no GPU): four small kernels exported as sm_90 cubins and
read with ``cuobjdump -sass`` (the ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``
wheels' ``cuobjdump`` on PATH), opcodes counted.

1. ``scores_rows``: a decode step's scores as the split kernel forms them, 16 query rows times
   the key tile, ``mma(q, k^T)``, q and k e4m3 (a 16-row product is a ``mma.sync`` one);
2. ``scores_keys``: the same scores transposed, ``mma(k, q^T)``: the key tile is the product's
   M (a ``wgmma`` one), q and k e4m3;
3. ``values_keys``: that form's value product from V as a cache stores it (``[keys, D]``, e4m3):
   ``mma(V^T, P^T)``, P in e4m3;
4. ``exp_half``: ``exp2`` of a float16 tile (a packed ``ex2.f16x2`` would do two a lane).

    python3 docs/records/probes/fp8_sass.py
"""

import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import cuda.tile as ct
import numpy as np
from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature,
                                   export_kernel)

ConstInt = ct.Constant[int]
N, D, STEPS = 128, 128, 4
OPS = ("HMMA", "QGMMA", "HGMMA", "F2FP", "F2F", "PRMT", "LDS", "STS", "MUFU")


@ct.kernel
def scores_rows(Q, K, Out, STEPS: ConstInt):
    q = ct.load(Q, (0, 0), (16, D))
    acc = ct.full((16, 1), 0.0, dtype=np.float32)
    for j in range(STEPS):
        k = ct.load(K, (j, 0), (N, D))
        s = ct.mma(q, ct.transpose(k), ct.full((16, N), 0.0, dtype=np.float32))
        acc = acc + ct.sum(s, axis=1, keepdims=True)
    ct.store(Out, (0, 0), acc)


@ct.kernel
def scores_keys(Q, K, Out, STEPS: ConstInt):
    qt = ct.transpose(ct.load(Q, (0, 0), (16, D)))
    acc = ct.full((1, 16), 0.0, dtype=np.float32)
    for j in range(STEPS):
        k = ct.load(K, (j, 0), (N, D))
        st = ct.mma(k, qt, ct.full((N, 16), 0.0, dtype=np.float32))
        acc = acc + ct.sum(st, axis=0, keepdims=True)
    ct.store(Out, (0, 0), acc)


@ct.kernel
def values_keys(P, V, Out, STEPS: ConstInt):
    acc = ct.full((D, 16), 0.0, dtype=np.float32)
    for j in range(STEPS):
        pt = ct.load(P, (j, 0), (N, 16))
        v = ct.load(V, (j, 0), (N, D))
        acc = ct.mma(ct.transpose(v), pt, acc)
    ct.store(Out, (0, 0), acc)


@ct.kernel
def exp_half(X, Out):
    x = ct.load(X, (ct.bid(0), 0), (128, 128))
    ct.store(Out, (ct.bid(0), 0), ct.exp2(x.astype(ct.float16)))


def _array(dtype, ndim=2):
    return ArrayConstraint(dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=False,
                           stride_divisible_by=(16, 1), base_addr_divisible_by=16)


def _counts(tool, kernel, params, folder):
    path = folder / f"{kernel._annotated_function.pyfunc.__name__}.cubin"
    export_kernel(kernel, [KernelSignature(params, CallingConvention.cutile_python_v1())],
                  str(path), gpu_code="sm_90", output_format="cubin")
    sass = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True,
                          check=True).stdout
    ops = collections.Counter()
    names = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([.\w]*)", line)
        if m:
            ops[m.group(1)] += 1
            if m.group(1) in ("MUFU", "F2FP", "HMMA", "QGMMA", "HGMMA"):
                names[m.group(1) + m.group(2)] += 1
    return sum(ops.values()), {op: ops[op] for op in OPS if ops[op]}, dict(names)


def main():
    tool = shutil.which("cuobjdump")
    if tool is None:
        sys.exit("cuobjdump is not on PATH (pip install nvidia-cuda-cuobjdump "
                 "nvidia-cuda-nvdisasm; its bin folder on PATH)")
    e4m3, f32 = ct.float8_e4m3fn, ct.float32
    cases = [("scores, 16 rows x keys: mma(q, k^T)", scores_rows,
              [_array(e4m3), _array(e4m3), _array(f32), STEPS]),
             ("scores, keys x 16 rows: mma(k, q^T)", scores_keys,
              [_array(e4m3), _array(e4m3), _array(f32), STEPS]),
             ("values as stored: mma(V^T, P^T)", values_keys,
              [_array(e4m3), _array(e4m3), _array(f32), STEPS]),
             ("exp2 of a float16 tile", exp_half, [_array(f32), _array(ct.float16)])]
    print("| kernel (sm_90, e4m3 unless named) | instructions | opcodes | product and "
          "conversion instructions |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for label, kernel, params in cases:
            total, ops, names = _counts(tool, kernel, params, Path(folder))
            print(f"| {label} | {total} | {ops} | {names} |")


if __name__ == "__main__":
    main()
