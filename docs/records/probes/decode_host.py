"""Host time of warm decode plans without a GPU: ``DecodePlan.run`` of the sm_90 default's plan
for flat paged, split paged and contiguous calls on CPU tensors, cuTile's launches stubbed (what
is left is the plan's own Python: checks, the output, the scratch, the views, the arguments).

    taskset -c 1 python3 docs/records/probes/decode_host.py

Section 38 of ``docs/records/benchmarks/paged/issue49/README.md``."""
import statistics, timeit, sys
import torch
from tiledattention.core import _plans as hot, _aot
from tiledattention.core._problem import Problem, padded_head_dim
from tiledattention.kernels.decode import _launch
from tiledattention.kernels.decode._plan import DecodePlan
from tiledattention.kernels.decode._defaults import default_decode_schedule
from tiledattention import runtime

hot.bind_torch()
hot.raw_stream = lambda d: 0
hot.current_device = lambda: 0
hot.capturing = lambda: False
_aot.launch = lambda *a, **k: None
rt = runtime()
cases = [  # (B, Hq, Hkv, D, page (0: contiguous), keys)
    (16, 8, 2, 64, 16, 6000), (32, 32, 8, 64, 16, 3000), (20, 24, 8, 64, 16, 5000),
    (8, 32, 8, 128, 64, 8000), (1, 32, 8, 128, 0, 32768), (8, 32, 8, 128, 0, 4096), (24, 28, 4, 128, 0, 3000)]
rows = []
for b, hq, hkv, d, page, maxk in cases:
    paged = page > 0
    p = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=maxk, head_dim=d,
                dtype="bf16", causal=True, bottom_right=paged, ragged=paged, page_size=page)
    s = default_decode_schedule("sm_90", p)
    launches = _launch.launches(p, s, None, sms=132)
    plan = DecodePlan(out_shape=(b, hq, 1, d), launches=launches,
                      partial_shapes=_launch.partial_shapes(launches) if launches.scratch else None,
                      bottom_right=True, tile_d=padded_head_dim(d))
    q = torch.randn(b, hq, 1, d, dtype=torch.bfloat16)
    if paged:
        pages = -(-maxk // page)
        kp = torch.randn(b * pages, page, hkv, d, dtype=torch.bfloat16)
        bt = torch.arange(b * pages, dtype=torch.int32).reshape(b, pages)
        lens = torch.full((b,), maxk, dtype=torch.int32)
        run = lambda: plan.run(rt, q, kp, kp, 0, None, ranges=lens, pages=bt)
    else:
        kc = torch.randn(b, hkv, maxk, d, dtype=torch.bfloat16)
        run = lambda: plan.run(rt, q, kc, kc, 0, None)
    run()
    reps = [timeit.timeit(run, number=3000) / 3000 * 1e6 for _ in range(9)]
    print(f"B{b} H{hq}/{hkv} D{d} {'page' + str(page) if paged else 'contiguous'} {maxk} | {s.describe()} | {statistics.median(reps):.2f} µs", flush=True)
