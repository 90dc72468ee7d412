"""Side-by-side speed table: tiledattention schedules vs torch SDPA (cuDNN, flash), one run.

    python scripts/speed_table.py [--candidates | --schedules FILE.json] [--shape B,H,S,D,causal]...
                                  [--tuned] [--jobs N] [--out FILE.md]

Every contender is checked against a float32 reference first, then all are timed interleaved
(tuner.measure.time_interleaved: CUDA events, L2 flushed, median). TFLOP/s = 4·B·H·S_q·S_k·D,
halved (exactly: unmasked pairs only) for causal. With --candidates, a few hand-picked schedules
are timed too (used to choose the per-architecture defaults). ``--schedules`` reads candidates
from a JSON list of ``{"name", "schedule", "head_dims"?, "seqlens"?, "causal"?}`` (the
optional filters say which shapes a candidate applies to); ``--tuned`` adds the schedule the
lookup picks (shipped table or the user's database); ``--jobs`` compiles them all in parallel
first.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention
from tiledattention import FORWARD, Problem, Schedule
from tuner.measure import time_interleaved

SHAPES = [(4, 16, 4096, 128, True), (4, 16, 4096, 128, False), (8, 16, 2048, 64, False),
          (8, 16, 2048, 64, True), (16, 8, 1024, 256, False), (4, 8, 4096, 256, True)]

# The untuned fallback ("seed") schedule: what the first kernel shipped with (search_spaces.SEED
# until the kernel-family renovation removed it).
SEED = Schedule(tile_m=64, tile_n=64, occupancy=1)

CANDIDATES = {
    "128x64 o2": Schedule(tile_m=128, tile_n=64, occupancy=2, exp2=True, approx_div=True, k_transposed=True),
    "128x128 o1": Schedule(tile_m=128, tile_n=128, occupancy=1, exp2=True, approx_div=True, k_transposed=True),
    "128x128 o2": Schedule(tile_m=128, tile_n=128, occupancy=2, exp2=True, approx_div=True, k_transposed=True),
    "64x64 o2": Schedule(tile_m=64, tile_n=64, occupancy=2, exp2=True, approx_div=True, k_transposed=True),
    "64x128 o2": Schedule(tile_m=64, tile_n=128, occupancy=2, exp2=True, approx_div=True, k_transposed=True),
    "128x32 o2": Schedule(tile_m=128, tile_n=32, occupancy=2, exp2=True, approx_div=True, k_transposed=True),
    "256x64 o1": Schedule(tile_m=256, tile_n=64, occupancy=1, exp2=True, approx_div=True, k_transposed=True),
    "128x64 o2 lat": Schedule(tile_m=128, tile_n=64, occupancy=2, exp2=True, approx_div=True, k_transposed=True, k_latency=2, v_latency=4),
    "128x64 o2 saw": Schedule(tile_m=128, tile_n=64, occupancy=2, exp2=True, approx_div=True, k_transposed=True, kv_sawtooth=True),
    "128x64 o2 unchk": Schedule(tile_m=128, tile_n=64, occupancy=2, exp2=True, approx_div=True, k_transposed=True, unchecked_loads=True),
}


def rel_err(out, ref):
    return (torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref)).item()


def parse_shape(text: str) -> tuple[int, int, int, int, bool]:
    """``B,H,S,D,yes|no`` (the last: causal)."""
    b, h, s, d, causal = text.split(",")
    if causal not in ("yes", "no"):
        raise argparse.ArgumentTypeError(f"causal must be yes or no; got {causal!r}")
    return int(b), int(h), int(s), int(d), causal == "yes"


def _load_candidates(path: str) -> list[tuple[str, Schedule, Callable[[Problem], bool]]]:
    with open(path) as f:
        entries = json.load(f)

    def applies(entry: dict) -> Callable[[Problem], bool]:
        return lambda p: (p.head_dim in entry.get("head_dims", [p.head_dim])
                          and p.seqlen_q in entry.get("seqlens", [p.seqlen_q])
                          and entry.get("causal", p.causal) == p.causal)
    # a candidate names only the fields off the default: build it (from_dict wants them all)
    return [(e["name"], Schedule(**e["schedule"]), applies(e)) for e in entries]


def _compile(job) -> str | None:
    problem, schedule, arch = job
    try:
        FORWARD.compile(problem, schedule, arch)
    except Exception as exc:  # reported; the timing pass skips nothing on this account
        return f"{schedule.describe()}: {exc}"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", action="store_true")
    parser.add_argument("--schedules", metavar="FILE.json", default=None)
    parser.add_argument("--shape", type=parse_shape, action="append", default=[],
                        metavar="B,H,S,D,yes|no")
    parser.add_argument("--jobs", type=int, default=0, help="parallel compiles before timing")
    parser.add_argument("--tuned", action="store_true",
                        help="time the schedule the lookup picks (shipped table, user database)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    shapes = args.shape or SHAPES
    extra = _load_candidates(args.schedules) if args.schedules else []
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    lines = [f"device: {torch.cuda.get_device_name()} ({arch}), torch {torch.__version__}, "
             f"cuDNN {torch.backends.cudnn.version()}", ""]
    header = "| shape | contender | schedule | ms | TFLOP/s | vs cuDNN | vs flash |"
    lines += [header, "|" + "---|" * 7]
    problems = [Problem(batch=b, heads_q=h, heads_kv=h, seqlen_q=s, seqlen_k=s, head_dim=d,
                        dtype=args.dtype, causal=causal) for b, h, s, d, causal in shapes]

    def schedules_for(problem: Problem) -> dict[str, Schedule]:
        found = {"default": FORWARD.default_schedule(arch, problem), "seed": SEED}
        if args.candidates:
            found.update(CANDIDATES)
        for name, sched, applies in extra:
            if applies(problem):
                found[name] = sched
        return found

    if args.jobs:
        jobs = [(p, s, arch) for p in problems for s in schedules_for(p).values()]
        with ProcessPoolExecutor(args.jobs) as pool:
            for failure in pool.map(_compile, jobs):
                if failure:
                    print(f"compile failed: {failure}", file=sys.stderr)
    for problem in problems:
        b, h, s, d, causal = (problem.batch, problem.heads_q, problem.seqlen_q,
                              problem.head_dim, problem.causal)
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen)
                   for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), is_causal=causal)
        contenders = {}
        schedules = schedules_for(problem)
        if args.tuned:
            schedules["tuned"] = tiledattention.explain(q, k, v, causal).schedule
        for name, sched in schedules.items():
            contenders[name] = (lambda sched=sched: tiledattention.sdpa(q, k, v, causal, schedule=sched))
        for name, backend in (("torch-cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("torch-flash", SDPBackend.FLASH_ATTENTION)):
            def run(backend=backend):
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            contenders[name] = run
        ok = {}
        for name, fn in contenders.items():
            try:
                err = rel_err(fn(), ref)
            except Exception as exc:  # a contender that cannot run this shape is reported
                print(f"{problem.describe()} {name}: failed: {exc}", file=sys.stderr)
                continue
            if err > (1e-2 if dtype == torch.bfloat16 else 5e-3):
                print(f"{problem.describe()} {name}: WRONG rel err {err:.2e}", file=sys.stderr)
                continue
            ok[name] = fn
        timings = time_interleaved(ok, rounds=25)
        cudnn = timings.get("torch-cudnn")
        flash = timings.get("torch-flash")
        for name, t in timings.items():
            tflops = problem.flops / (t.median_ms * 1e-3) / 1e12
            sched = schedules.get(name)
            r1 = f"{cudnn.median_ms / t.median_ms:.2f}" if cudnn else "-"
            r2 = f"{flash.median_ms / t.median_ms:.2f}" if flash else "-"
            lines.append(f"| {problem.describe()} | {name} | {sched.describe() if sched else ''} | "
                         f"{t.median_ms:.3f} | {tflops:.0f} | {r1} | {r2} |")
        print("\n".join(lines[-len(timings):]), flush=True)
    text = "\n".join(lines)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
