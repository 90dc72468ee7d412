"""Per-kernel times (torch.profiler, CUDA kernels' durations, means over 10 calls) of the
default backward and of stored-dS forms, on a few shapes. EXPERIMENT."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from torch.profiler import profile, ProfilerActivity
from backward_splits import backward_calls, _problem, compile_all
from tiledattention import BACKWARD
from tiledattention.kernels.backward import _launch

SHAPES = [(1, 16, 16, 8192, 128, False), (4, 32, 32, 2048, 128, True), (8, 16, 16, 577, 64, False),
          (2, 16, 4, 4096, 64, True)]


def forms(problem):
    d = BACKWARD.default_schedule("sm_90", problem)
    st = d.replace(dq_mode="stored", dq_worker_warps=None, kv_latency=None, dq_tile_m=128, dq_occupancy=1)
    return {"default": (d, True), "stored-tma": (st, True), "stored-plain": (st, False),
            "stored-plain-o2": (st.replace(dq_occupancy=2), False)}


def main():
    for tma in (True, False):
        _launch.DS_TMA[0] = tma
        compile_all([(_problem(*sh), sc) for sh in SHAPES
                     for sc, t in forms(_problem(*sh)).values() if t == tma])
    for shape in SHAPES:
        p = _problem(*shape)
        for name, (sc, tma) in forms(p).items():
            _launch.DS_TMA[0] = tma
            _launch.launches.cache_clear()
            fn = backward_calls(shape, {name: sc})[name]
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            times = {}
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    key = e.name.split("(")[0][:40]
                    times[key] = times.get(key, 0.0) + e.device_time / 10
            total = sum(v for k, v in times.items() if "attention_bwd" in k)
            print(f"{p.describe():34s} {name:16s} total {total:8.1f} us  " +
                  "  ".join(f"{k} {v:.1f}" for k, v in sorted(times.items()) if "attention_bwd" in k),
                  flush=True)


if __name__ == "__main__":
    main()
