"""Why FP8 prefill is not twice bf16's speed (issue 52): a standalone FlashAttention forward
(not the project's kernel) in bf16 and in e4m3 (V transposed, P shifted by 2^8), with the next
key tile's scores issued before this tile's softmax (``PIPE``, FlashAttention-3's
intra-warpgroup overlap written in the source) and part of each tile's exponentials computed
by a polynomial on the FMA pipe instead of the MUFU unit (``EMU`` columns). ``cpu``: compile
each for sm_90 and count registers, spills and instructions (needs ``cuobjdump`` from the
nvidia-cuda-cuobjdump wheel on PATH); ``gpu``: time them, interleaved, with errors.

    python docs/records/probes/fp8_pipeline.py cpu
    source .devtk/setup.sh && python3 docs/records/probes/fp8_pipeline.py gpu [ROUNDS]
"""
import math, shutil, sys, io, subprocess
import numpy as np
import cuda.tile as ct
C = ct.Constant[int]
B_ = ct.Constant[bool]
LOG2E = 1.4426950408889634


@ct.kernel
def fwd(Q, K, V, Out, scale: float, TM: C, TN: C, D: C, VT: B_, PIPE: B_, SHIFT: B_, EMU: C):
    b = ct.bid(1) // Q.shape[1]; h = ct.bid(1) % Q.shape[1]; qt = ct.bid(0)
    hk = h // (Q.shape[1] // K.shape[1])
    q = ct.load(Q, (b, h, qt, 0), (1, 1, TM, D)).reshape((TM, D))
    m = ct.full((TM, 1), -1e30, dtype=np.float32); l = ct.full((TM, 1), 0.0, dtype=np.float32)
    acc = ct.full((TM, D), 0.0, dtype=np.float32)
    sc = scale * LOG2E
    n = ct.cdiv(K.shape[2], TN)

    def scores(j):
        k = ct.load(K, (b, hk, 0, j), (1, 1, D, TN), order=(0, 1, 3, 2)).reshape((D, TN))
        return ct.mma(q, k, ct.full((TM, TN), 0.0, dtype=np.float32))

    def exp2(x):
        if EMU:
            # column block 0 (EMU wide) by a polynomial on the FMA pipe, the others by MUFU
            parts = ()
            for i in ct.static_iter(range(TN // EMU)):
                xa = ct.extract(x, (0, i), (TM, EMU))
                if i == 0:
                    xa = ct.maximum(xa, -127.0)
                    big = xa + 12582912.0
                    nn = big - 12582912.0
                    f = xa - nn
                    pf = ((0.0555041086648216 * f + 0.2402264923172690) * f + 0.6931471805599453) * f + 1.0
                    bits = ct.bitcast(pf, ct.int32) + ct.bitwise_lshift(ct.bitcast(big, ct.int32) - 0x4B400000, 23)
                    parts += (ct.bitcast(bits, ct.float32),)
                else:
                    parts += (ct.exp2(xa, flush_to_zero=True),)
            for level in ct.static_iter(range((TN // EMU).bit_length() - 1)):
                joined = ()
                for i in ct.static_iter(range(len(parts) // 2)):
                    joined += (ct.cat((parts[2 * i], parts[2 * i + 1]), 1),)
                parts = joined
            return parts[0]
        return ct.exp2(x, flush_to_zero=True)

    def step(j, s, m, l, acc):
        mn = ct.maximum(m, ct.max(s, axis=1, keepdims=True) * sc)
        x = s * sc - mn
        if SHIFT:
            x = x + 8.0
        p = exp2(x)
        a = ct.exp2(m - mn, flush_to_zero=True)
        l = l * a + ct.sum(p, axis=1, keepdims=True)
        if VT:
            v = ct.load(V, (b, hk, j, 0), (1, 1, TN, D), order=(0, 1, 3, 2)).reshape((TN, D))
        else:
            v = ct.load(V, (b, hk, j, 0), (1, 1, TN, D)).reshape((TN, D))
        acc = ct.mma(p.astype(q.dtype), v, acc * a)
        return mn, l, acc

    if PIPE:
        s_next = scores(0)
        for j in range(n - 1):
            s = s_next
            s_next = scores(j + 1)
            m, l, acc = step(j, s, m, l, acc)
        m, l, acc = step(n - 1, s_next, m, l, acc)
    else:
        for j in range(n):
            m, l, acc = step(j, scores(j), m, l, acc)
    ct.store(Out, (b, h, qt, 0), (acc / l).astype(Out.dtype).reshape((1, 1, TM, D)))


CUOBJDUMP = shutil.which("cuobjdump") or "cuobjdump"
CONFIGS = [  # name, TM, TN, occupancy, warps, PIPE, EMU
    ("128x128 w8", 128, 128, 1, 8, False, 0),
    ("128x128 w8 pipe", 128, 128, 1, 8, True, 0),
    ("128x128 w8 emu32", 128, 128, 1, 8, False, 32),
    ("128x128 w8 pipe emu32", 128, 128, 1, 8, True, 32),
    ("128x128 occ2", 128, 128, 2, None, False, 0),
    ("128x128 occ2 pipe", 128, 128, 2, None, True, 0),
    ("64x128 occ2", 64, 128, 2, None, False, 0),
    ("64x128 occ2 pipe", 64, 128, 2, None, True, 0),
    ("64x128 occ2 pipe emu32", 64, 128, 2, None, True, 32),
    ("128x64 w8 pipe", 128, 64, 1, 8, True, 0),
]

if __name__ == "__main__" and sys.argv[1:] == ["cpu"]:
    from tiledattention.core._compile import array_constraint
    from cuda.tile import compilation as ctc
    for name, tm, tn, occ, w, pipe, emu in CONFIGS:
        for dt in ("bf16", "e4m3"):
            vt = dt == "e4m3"
            qc = array_constraint(dt, (1, 32, 8192, 128)); kc = array_constraint(dt, (1, 8, 8192, 128))
            vc = array_constraint(dt, (1, 8, 128, 8192)) if vt else kc
            oc = array_constraint("bf16", (1, 32, 8192, 128))
            sig = ctc.KernelSignature([qc, kc, vc, oc, ctc.ScalarConstraint(ct.float32), tm, tn, 128, vt, pipe, vt, emu],
                                      calling_convention=ctc.CallingConvention.cutile_python_v2())
            buf = io.BytesIO()
            try:
                ctc.export_kernel(fwd.replace_hints(occupancy=occ, num_worker_warps=w), [sig], buf, gpu_code="sm_90", output_format="cubin")
            except Exception as e:
                print(name, dt, "FAIL", str(e).splitlines()[-1][:200]); continue
            open("/tmp/p.cubin", "wb").write(buf.getvalue())
            sass = subprocess.run([CUOBJDUMP, "-sass", "/tmp/p.cubin"], capture_output=True, text=True).stdout
            res = subprocess.run([CUOBJDUMP, "-res-usage", "/tmp/p.cubin"], capture_output=True, text=True).stdout
            import re
            regs = re.findall(r"REG:(\d+)", res)
            print(f"{name:24s} {dt}: regs {regs} spill {'STL' in sass} MUFU {sass.count('MUFU.EX2')} GMMA {sass.count('GMMA')}")

if __name__ == "__main__" and sys.argv[1:2] == ["gpu"]:
    import torch
    from tuner.measure import time_interleaved
    E4M3 = torch.float8_e4m3fn
    for (b, hq, hkv, s) in [(1, 32, 8, 8192), (4, 32, 8, 2048)]:
        d = 128
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for h in (hq, hkv, hkv))
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
        q8, k8, v8 = (x.to(E4M3) for x in (q, k, v))
        ref8 = torch.nn.functional.scaled_dot_product_attention(q8.float(), k8.float(), v8.float(), enable_gqa=True)
        v8t = v8.transpose(2, 3).contiguous()
        fns, outs = {}, {}
        st = torch.cuda.current_stream()
        for name, tm, tn, occ, w, pipe, emu in CONFIGS:
            kern = fwd.replace_hints(occupancy=occ, num_worker_warps=w)
            for dt in ("bf16", "fp8"):
                fp8 = dt == "fp8"
                out = torch.empty_like(q)
                args = ((q8, k8, v8t) if fp8 else (q, k, v)) + (out, 1 / math.sqrt(d), tm, tn, d, fp8, pipe, fp8, emu)
                grid = (s // tm, b * hq, 1)
                f = (lambda kern=kern, grid=grid, args=args: ct.launch(st, grid, kern, args))
                try:
                    f(); torch.cuda.synchronize()
                except Exception as e:
                    print(name, dt, "FAILED", str(e)[:200]); continue
                fns[f"{name} {dt}"] = f
                outs[f"{name} {dt}"] = (out, ref8 if fp8 else ref)
        t = time_interleaved(fns, rounds=int(sys.argv[2]) if len(sys.argv) > 2 else 8)
        fl = 4 * b * hq * s * s * d
        base = t["128x128 w8 bf16"].median_ms
        print(f"== B{b} H{hq}/{hkv} S{s} D{d} full")
        for name, tt in t.items():
            o, r = outs[name]
            err = ((o.float() - r).norm() / r.norm()).item()
            print(f"{name:32s} {tt.median_ms:7.3f} ms {fl / tt.median_ms / 1e9:6.0f} TFLOP/s {base / tt.median_ms:5.2f}x  err {err:.1e}")
