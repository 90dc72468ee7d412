"""Time the one-pass backward (``dq_mode="atomic"``) against the two-kernel one
(``dq_mode="kernel"``: the architecture's two-kernel default) and the architecture's default
where it is neither, with torch's cuDNN backward (plain attention only) and FlashAttention-4
(where ``flash_attn.cute`` imports) beside them, on a set of shapes (``--set``: issue 47's
training shapes, windows / softcap / sinks, softcaps, a softcap check, plain D 256).

Steady state: each sample is ``n`` back-to-back calls of one configuration between two CUDA
events (``n`` chosen so that a sample lasts at least 2 ms), configurations interleaved round by
round, the median of the rounds reported; ``--isolated R`` adds isolated calls
(``time_interleaved(host=True)``). The kernels are launched from plans built once (the family
case's launcher: no lookup per call). Each one-pass result is checked against the two-kernel
gradients (relative L2 of dQ, dK, dV); the two-kernel, default and FA4 runs' kernels are
listed with their GPU time (torch's profiler). ``--warm N`` first compiles every
configuration in ``N`` processes at once (cuTile's disk cache keeps the cubins), so the timed
process compiles nothing.

    source .devtk/setup.sh && python scripts/backward_onepass_timing.py [--set S] [--warm 8]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

def _shape(label, b, hq, hkv, s, d, causal, **variant):
    """(label, Problem keyword arguments) of a self-attention shape (bf16 unless ``variant``
    names a dtype)."""
    return label, dict(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=d,
                       causal=causal, **variant)


#: --set training: issue 47's training shapes
SHAPES = [
    _shape("B1 H32/8 S4096 D128 causal", 1, 32, 8, 4096, 128, True),
    _shape("B8 H16 S577 D64 full", 8, 16, 16, 577, 64, False),
    _shape("B2 H28/4 S3000 D128 causal", 2, 28, 4, 3000, 128, True),
    _shape("B4 H16 S2048 D64 causal", 4, 16, 16, 2048, 64, True),
    _shape("B1 H48/1 S8192 D128 causal", 1, 48, 1, 8192, 128, True),
    _shape("B2 H16/8 S4096 D256 causal", 2, 16, 8, 4096, 256, True),
]
#: --set variants: windows, softcaps and sinks (GPT-OSS, Mistral, Gemma 2 shaped)
VARIANTS = [
    _shape("B2 H64/8 S4096 D64 causal w128 sinks", 2, 64, 8, 4096, 64, True,
           window_left=127, sinks=True),
    _shape("B1 H64/8 S9000 D64 causal w128 sinks", 1, 64, 8, 9000, 64, True,
           window_left=127, sinks=True),
    _shape("B2 H64/8 S4096 D64 causal sinks", 2, 64, 8, 4096, 64, True, sinks=True),
    _shape("B4 H32/8 S4096 D128 causal w128", 4, 32, 8, 4096, 128, True, window_left=127),
    _shape("B1 H32/8 S16384 D128 causal w4096", 1, 32, 8, 16384, 128, True,
           window_left=4095),
    _shape("B2 H16/8 S4096 D256 causal softcap 50", 2, 16, 8, 4096, 256, True, softcap=50.0),
]
#: --set softcap: capped scores (Gemma 2 2B/9B/27B, Grok shaped, and an encoder)
SOFTCAPS = [
    _shape("B4 H8/4 S2048 D256 causal softcap 50", 4, 8, 4, 2048, 256, True, softcap=50.0),
    _shape("B2 H16/8 S8192 D256 causal w4096 softcap 50", 2, 16, 8, 8192, 256, True,
           window_left=4095, softcap=50.0),
    _shape("B1 H32/16 S8192 D128 causal softcap 50", 1, 32, 16, 8192, 128, True, softcap=50.0),
    _shape("B2 H32/8 S4096 D128 causal softcap 30", 2, 32, 8, 4096, 128, True, softcap=30.0),
    _shape("B8 H12 S1024 D64 full softcap 30", 8, 12, 12, 1024, 64, False, softcap=30.0),
]
#: --set softcap-check: capped scores none of the above (fp16 among them); windows of 128 and
#: 512 keys (narrower than the softcap rule's span at D 128) and of 512-1536 around it
SOFTCAP_CHECK = [
    _shape("B3 H16/8 S3000 D256 causal w1024 softcap 50", 3, 16, 8, 3000, 256, True,
           window_left=1023, softcap=50.0),
    _shape("B2 H16/8 S4096 D256 causal w512 softcap 50", 2, 16, 8, 4096, 256, True,
           window_left=511, softcap=50.0),
    _shape("B1 H24/8 S6000 D128 causal softcap 30 fp16", 1, 24, 8, 6000, 128, True,
           softcap=30.0, dtype="fp16"),
    _shape("B2 H32/16 S2048 D128 causal w512 softcap 50", 2, 32, 16, 2048, 128, True,
           window_left=511, softcap=50.0),
    _shape("B1 H16/8 S5000 D256 full softcap 50", 1, 16, 8, 5000, 256, False, softcap=50.0),
    _shape("B4 H8/2 S2500 D96 causal softcap 30", 4, 8, 2, 2500, 96, True, softcap=30.0),
    _shape("B16 H12 S512 D64 full softcap 30 fp16", 16, 12, 12, 512, 64, False, softcap=30.0,
           dtype="fp16"),
    _shape("B2 H8/8 S8192 D128 causal w128 softcap 50", 2, 8, 8, 8192, 128, True,
           window_left=127, softcap=50.0),
    _shape("B2 H32/8 S2048 D128 causal w1536 softcap 30", 2, 32, 8, 2048, 128, True,
           window_left=1535, softcap=30.0),
]
#: --set d256: plain (uncapped) D 256, where the one-pass came within 6% before the 128-row
#: delta kernel, and the multi-query D 128 shape where it came within 4%
D256 = [
    _shape("B2 H16/8 S4096 D256 causal", 2, 16, 8, 4096, 256, True),
    _shape("B2 H16/4 S2048 D256 full fp16", 2, 16, 4, 2048, 256, False, dtype="fp16"),
    _shape("B4 H8/8 S3000 D256 causal", 4, 8, 8, 3000, 256, True),
    _shape("B1 H32/16 S6000 D256 full", 1, 32, 16, 6000, 256, False),
    _shape("B8 H8/4 S1024 D256 causal", 8, 8, 4, 1024, 256, True),
    _shape("B1 H48/1 S8192 D128 causal", 1, 48, 1, 8192, 128, True),
]
SETS = {"training": SHAPES, "variants": VARIANTS, "softcap": SOFTCAPS,
        "softcap-check": SOFTCAP_CHECK, "d256": D256}


def _problem(shape):
    from tiledattention import Problem

    return Problem(**{"dtype": "bf16", **shape[1]})


#: --sweep: one-pass dK/dV fields beyond the default's, (keys, query rows, occupancy, worker
#: warps, Q/dO latency hint). The one-pass kernel holds three float32 accumulator tiles (dK, dV
#: and the pair's dQ share), so 8 worker warps (two warpgroups, as FlashAttention-3's sm_90
#: backward runs) are the hypothesis; 128 keys x 64 rows is FA3's tile at D 128.
SWEEP = [(64, 64, 1, 8, None), (128, 64, 1, 8, None), (64, 128, 1, 8, None),
         (128, 128, 1, 8, None), (128, 64, 1, 8, 3), (64, 64, 2, 8, None)]


def configurations(problem, sweep: bool = False):
    """(name, schedule): the two-kernel default (``kernel``), the same run one-pass, one-pass
    at one dK/dV CTA per SM where the default runs two (the accumulator tile takes registers),
    the architecture's default where it is not ``kernel`` and, with a softcap, its one-pass
    fields (``SOFTCAP_ONE_PASS``) on the two-kernel default; with ``sweep`` also the one-pass at
    every ``SWEEP`` point that fits the head dim."""
    from tiledattention import BACKWARD
    from tiledattention.kernels.backward import softcap_one_pass_rule

    default = BACKWARD.default_schedule("sm_90", problem)
    kernel = BACKWARD.deterministic_schedule("sm_90", problem, default)  # two kernels
    atomic = BACKWARD.normalise(problem, kernel.replace(dq_mode="atomic"))
    found = [("kernel", kernel), ("atomic", atomic)]
    if default not in (kernel, atomic):
        found.append(("default", default))
    rule = softcap_one_pass_rule("sm_90", problem)
    if rule is not None:
        wide = BACKWARD.normalise(problem, kernel.replace(dq_mode="atomic", **rule.fields))
        if wide not in (default, atomic):
            found.append(("softcap one-pass fields", wide))
    if kernel.dkdv_occupancy != 1:
        found.append(("atomic occ1", kernel.replace(dq_mode="atomic", dkdv_occupancy=1)))
    if sweep:
        found.append(("kernel, tile order flipped",
                      kernel.replace(tile_major=not kernel.tile_major)))
        if kernel.dq_worker_warps != 8:
            found.append(("kernel, dQ 8 warps", kernel.replace(dq_worker_warps=8)))
            found.append(("kernel, dQ 8 warps occ1",
                          kernel.replace(dq_worker_warps=8, dq_occupancy=1)))
        for n, m, occ, warps, latency in SWEEP:
            if problem.head_dim > 128 and n * m > 64 * 64:
                continue  # three [n or m, 256] float32 tiles do not fit the registers
            name = f"a{n}x{m} o{occ} w{warps}" + (f" l{latency}" if latency else "")
            found.append((name, kernel.replace(
                dq_mode="atomic", dkdv_tile_n=n, dkdv_tile_m=m, dkdv_occupancy=occ,
                dkdv_worker_warps=warps, q_latency=latency)))
    return found


class Inputs:
    """The backward family's GPU case of a problem (random q, k, v and dO, our forward's out and
    log-sum-exp), whose launcher builds a configuration's plan and scratch once."""

    def __init__(self, problem) -> None:
        from tiledattention import BACKWARD

        self.case = BACKWARD.case(problem, 0)
        self.problem = problem
        self.q, self.k, self.v, self.grad_out = (self.case.q, self.case.k, self.case.v,
                                                 self.case.grad_out)

    def runner(self, schedule):
        """(run, grads): a call of ``schedule`` (no lookup per call), and a function that runs
        it once more and returns copies of its gradients (the case's buffers are shared)."""
        import torch

        run = self.case.launcher(schedule)

        def grads() -> tuple:
            run()
            torch.cuda.synchronize()
            return tuple(g.clone() for g in self.case.grads)

        return run, grads

    def cudnn(self):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        leaves = [x.detach().requires_grad_() for x in (self.q, self.k, self.v)]
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.enable_grad():
            out = F.scaled_dot_product_attention(
                *leaves, is_causal=self.problem.causal,
                enable_gqa=self.problem.heads_q != self.problem.heads_kv)

        def run() -> None:
            torch.autograd.grad(out, leaves, self.grad_out, retain_graph=True)

        return run


def _warm_one(job: tuple[str, int, bool]) -> str:
    """Compile (by running once) every configuration of shape ``index`` of set ``name``."""
    import torch

    name, index, sweep = job
    shape = SETS[name][index]
    problem = _problem(shape)
    inputs = Inputs(problem)
    for _, schedule in configurations(problem, sweep):
        try:
            inputs.runner(schedule)[0]()
        except Exception as exc:  # a configuration that does not compile: time_shape says
            print(f"  {shape[0]}: {exc.__class__.__name__}", flush=True)
    torch.cuda.synchronize()
    return shape[0]


def _fa4(problem, inputs):
    """FlashAttention-4's backward on the case (its own [B, S, H, D] layout), or None."""
    try:
        from tuner.bench import build_peer_contender

        run, err = build_peer_contender("flash-attn-4", problem, inputs.case, backward=True)
    except Exception as exc:  # not installed, or not this problem
        print(f"  FA4 skipped: {exc}", flush=True)
        return None
    print(f"  FA4 rel err vs float32 reference: {err:.1e}", flush=True)
    return run


def _rel(a, b) -> float:
    import torch

    return (torch.linalg.vector_norm(a.float() - b.float())
            / torch.linalg.vector_norm(b.float())).item()


def time_shape(shape, rounds: int, sweep: bool = False, isolated_rounds: int = 0) -> dict:
    """Steady state (``rounds`` interleaved rounds of back-to-back calls) and, with
    ``isolated_rounds``, isolated calls (the GPU drained, the L2 flushed, the host's time from
    the launch to the end of its GPU work counted: ``time_interleaved(host=True)``)."""
    from tiledattention import BACKWARD

    problem = _problem(shape)
    inputs = Inputs(problem)
    runs, grads = {}, {}
    for name, schedule in configurations(problem, sweep):
        try:
            runs[name], grads[name] = inputs.runner(schedule)
        except Exception as exc:  # e.g. out of shared memory
            print(f"  {shape[0]} {name}: {exc.__class__.__name__}: {exc}", flush=True)
    if any(getattr(problem, f) != problem.OPTIONAL_FIELDS[f] for f in problem.VARIANT_FIELDS):
        print(f"  cuDNN skipped for {shape[0]}: torch's SDPA has no window, softcap or sinks",
              flush=True)
    else:
        try:
            runs["cuDNN"] = inputs.cudnn()
        except RuntimeError as exc:  # no cuDNN backend for the shape
            print(f"  cuDNN skipped for {shape[0]}: {exc}", flush=True)
    fa4 = _fa4(problem, inputs)
    if fa4 is not None:
        runs["FA4"] = fa4
    steady = steady_ms(runs, rounds)
    isolated = {}
    if isolated_rounds:
        from tuner.measure import time_interleaved

        isolated = {name: t.median_ms for name, t in time_interleaved(
            runs, rounds=isolated_rounds, host=True).items()}
    breakdown = {name: kernel_times(runs[name]) for name in ("kernel", "default", "FA4")
                 if name in runs}
    results = {name: copy() for name, copy in grads.items()}
    errors = {name: max(_rel(a, b) for a, b in zip(results[name], results["kernel"]))
              for name in results if name != "kernel"}
    default = BACKWARD.default_schedule("sm_90", problem)
    return {"label": shape[0], "ms": steady,
            "errors": errors, "kernels": breakdown, "isolated": isolated,
            "default": next(n for n, s in configurations(problem, sweep) if s == default)}


def steady_ms(runs: dict, rounds: int) -> dict[str, float]:
    """Steady state: per name, the median over ``rounds`` of ms per call, each sample back-to-back
    calls of one run (enough for at least 2 ms) between CUDA events, the runs interleaved round
    by round after three warm-up calls each."""
    import torch

    def event():
        return torch.cuda.Event(enable_timing=True)

    counts = {}
    for name, run in runs.items():  # warm up; the calls per sample (>= 2 ms a sample)
        for _ in range(3):
            run()
        start, end = event(), event()
        start.record()
        run()
        end.record()
        end.synchronize()
        counts[name] = max(1, int(2.0 / max(start.elapsed_time(end), 1e-3)) + 1)
    samples = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start, end = event(), event()
            start.record()
            for _ in range(counts[name]):
                run()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / counts[name])
    return {name: statistics.median(s) for name, s in samples.items()}


def kernel_times(run, calls: int = 5) -> dict[str, float]:
    """GPU µs per call of each kernel ``run`` launches (torch's profiler, ``calls`` calls back
    to back), by kernel name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    found: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total = getattr(event, "device_time_total", None) or event.cuda_time_total
            found[event.key[:60]] = found.get(event.key[:60], 0.0) + total / calls
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warm", type=int, default=0, metavar="N",
                        help="compile every configuration in N processes first")
    parser.add_argument("--warm-only", action="store_true")
    parser.add_argument("--set", default="training", choices=sorted(SETS),
                        help="the shapes (default: issue 47's training shapes)")
    parser.add_argument("--shapes", default="", help="comma-separated indices into the set")
    parser.add_argument("--isolated", type=int, default=0, metavar="ROUNDS",
                        help="also time isolated calls, host counted, over ROUNDS rounds")
    parser.add_argument("--sweep", action="store_true",
                        help="also time the one-pass backward at every SWEEP point")
    args = parser.parse_args(argv)
    shapes = SETS[args.set]
    chosen = [int(i) for i in args.shapes.split(",") if i] or list(range(len(shapes)))
    if args.warm:
        with multiprocessing.get_context("spawn").Pool(min(args.warm, len(chosen))) as pool:
            jobs = [(args.set, i, args.sweep) for i in chosen]
            for label in pool.imap_unordered(_warm_one, jobs):
                print(f"  compiled {label}", flush=True)
    if args.warm_only:
        return 0
    import subprocess

    import torch
    from importlib.metadata import version

    results = [time_shape(shapes[i], args.rounds, args.sweep, args.isolated) for i in chosen]
    props = torch.cuda.get_device_properties(0)
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    print(f"\ndevice {props.name}; driver {driver}; torch {torch.__version__}; cuDNN "
          f"{torch.backends.cudnn.version()}; cuda-tile {version('cuda-tile')}; steady state, "
          f"median of {args.rounds} interleaved rounds, bf16 unless named")
    print("| shape | two-kernel ms | default ms (which) | two-kernel ÷ default | best one-pass "
          "ms (which) | cuDNN ms | FA4 ms | FA4 ÷ default | max rel err vs two-kernel |")
    print("|---" * 9 + "|")
    for r in results:
        ms, which = r["ms"], r["default"]
        one_pass = [n for n in ms if n in r["errors"]]
        best = min(one_pass, key=ms.get)
        cells = [f"{ms['kernel']:.3f}", f"{ms[which]:.3f} ({which})",
                 f"{ms['kernel'] / ms[which]:.3f}x", f"{ms[best]:.3f} ({best})",
                 f"{ms['cuDNN']:.3f}" if "cuDNN" in ms else "-",
                 f"{ms['FA4']:.3f}" if "FA4" in ms else "-",
                 f"{ms['FA4'] / ms[which]:.3f}x" if "FA4" in ms else "-",
                 f"{max(r['errors'].values()):.1e}"]
        print(f"| {r['label']} | " + " | ".join(cells) + " |")
    if any(r["isolated"] for r in results):
        print("\nIsolated calls (GPU drained, L2 flushed, host counted), ms:")
        print("| shape | two-kernel | default (which) | two-kernel ÷ default | FA4 "
              "| FA4 ÷ default |")
        print("|---" * 6 + "|")
        for r in results:
            iso, which = r["isolated"], r["default"]
            fa4 = iso.get("FA4")
            print(f"| {r['label']} | {iso['kernel']:.3f} | {iso[which]:.3f} ({which}) | "
                  f"{iso['kernel'] / iso[which]:.3f}x | "
                  + (f"{fa4:.3f} | {fa4 / iso[which]:.3f}x |" if fa4 else "- | - |"))
    print("\nEvery configuration, ms (max rel err of dQ/dK/dV vs the two-kernel result):")
    for r in results:
        ms = r["ms"]
        fa4 = ms.get("FA4")
        print(f"{r['label']}:" + (f"  (FA4 {fa4:.3f} ms)" if fa4 else ""))
        for name in sorted(ms, key=ms.get):
            vs = f"  {fa4 / ms[name]:.3f}x FA4" if fa4 else ""
            err = r["errors"].get(name)
            print(f"  {name:<22} {ms[name]:8.3f}{vs}" + (f"  err {err:.1e}" if err else ""))
        for name, kernels in r["kernels"].items():
            print(f"  kernels of {name} (GPU µs per call): " + "; ".join(
                f"{k} {t:.1f}" for k, t in sorted(kernels.items(), key=lambda kv: -kv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
