"""Time the one-pass backward (``dq_mode="atomic"``) against the two-kernel one
(``dq_mode="kernel"``, every other field the same: the architecture's default) on training
shapes, with torch's cuDNN backward beside them.

Steady state: each sample is ``n`` back-to-back calls of one configuration between two CUDA
events (``n`` chosen so that a sample lasts at least 2 ms), configurations interleaved round by
round, the median of the rounds reported. The kernels are launched from plans built once
(the family case's launcher: no lookup per call). Each one-pass result is checked against the
two-kernel gradients (relative L2 of dQ, dK, dV). ``--warm N`` first compiles every
configuration in ``N`` processes at once (cuTile's disk cache keeps the cubins), so the timed
process compiles nothing.

    source .devtk/setup.sh && python scripts/backward_onepass_timing.py [--rounds 15] [--warm 8]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: (label, batch, heads_q, heads_kv, seqlen, head_dim, causal)
SHAPES = [
    ("B1 H32/8 S4096 D128 causal", 1, 32, 8, 4096, 128, True),
    ("B8 H16 S577 D64 full", 8, 16, 16, 577, 64, False),
    ("B2 H28/4 S3000 D128 causal", 2, 28, 4, 3000, 128, True),
    ("B4 H16 S2048 D64 causal", 4, 16, 16, 2048, 64, True),
    ("B1 H48/1 S8192 D128 causal", 1, 48, 1, 8192, 128, True),
    ("B2 H16/8 S4096 D256 causal", 2, 16, 8, 4096, 256, True),
]


def _problem(shape, dtype="bf16"):
    from tiledattention import Problem

    _, b, hq, hkv, s, d, causal = shape
    return Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=d,
                   dtype=dtype, causal=causal)


#: --sweep: one-pass dK/dV fields beyond the default's, (keys, query rows, occupancy, worker
#: warps, Q/dO latency hint). The one-pass kernel holds three float32 accumulator tiles (dK, dV
#: and the pair's dQ share), so 8 worker warps (two warpgroups, as FlashAttention-3's sm_90
#: backward runs) are the hypothesis; 128 keys x 64 rows is FA3's tile at D 128.
SWEEP = [(64, 64, 1, 8, None), (128, 64, 1, 8, None), (64, 128, 1, 8, None),
         (128, 128, 1, 8, None), (128, 64, 1, 8, 3), (64, 64, 2, 8, None),
         (128, 32, 1, 8, None), (64, 32, 2, 4, None)]


def configurations(problem, sweep: bool = False):
    """(name, schedule): the default (two kernels), the same run one-pass, and one-pass at one
    dK/dV CTA per SM where the default runs two (the accumulator tile takes registers); with
    ``sweep`` also the one-pass at every ``SWEEP`` point that fits the head dim."""
    from tiledattention import BACKWARD

    kernel = BACKWARD.default_schedule("sm_90", problem).replace(dq_mode="kernel")
    found = [("kernel", kernel), ("atomic", kernel.replace(dq_mode="atomic"))]
    if kernel.dkdv_occupancy != 1:
        found.append(("atomic occ1", kernel.replace(dq_mode="atomic", dkdv_occupancy=1)))
    if sweep:
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


def _warm_one(job: tuple[int, bool]) -> str:
    """Compile (by running once) every configuration of SHAPES[index]."""
    import torch

    index, sweep = job
    problem = _problem(SHAPES[index])
    inputs = Inputs(problem)
    for _, schedule in configurations(problem, sweep):
        try:
            inputs.runner(schedule)[0]()
        except Exception as exc:  # a configuration that does not compile: time_shape says
            print(f"  {SHAPES[index][0]}: {exc.__class__.__name__}", flush=True)
    torch.cuda.synchronize()
    return SHAPES[index][0]


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


def time_shape(shape, rounds: int, sweep: bool = False) -> dict:
    import torch

    problem = _problem(shape)
    inputs = Inputs(problem)
    runs, grads = {}, {}
    for name, schedule in configurations(problem, sweep):
        try:
            runs[name], grads[name] = inputs.runner(schedule)
        except Exception as exc:  # e.g. out of shared memory
            print(f"  {shape[0]} {name}: {exc.__class__.__name__}: {exc}", flush=True)
    try:
        runs["cuDNN"] = inputs.cudnn()
    except RuntimeError as exc:  # no cuDNN backend for the shape
        print(f"  cuDNN skipped for {shape[0]}: {exc}", flush=True)
    fa4 = _fa4(problem, inputs)
    if fa4 is not None:
        runs["FA4"] = fa4
    counts = {}
    for name, run in runs.items():  # warm up; the calls per sample (>= 2 ms a sample)
        for _ in range(3):
            run()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        counts[name] = max(1, int(2.0 / max(start.elapsed_time(end), 1e-3)) + 1)
    samples = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start, end = (torch.cuda.Event(enable_timing=True),
                          torch.cuda.Event(enable_timing=True))
            start.record()
            for _ in range(counts[name]):
                run()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / counts[name])
    results = {name: copy() for name, copy in grads.items()}
    errors = {name: max(_rel(a, b) for a, b in zip(results[name], results["kernel"]))
              for name in results if name != "kernel"}
    return {"label": shape[0], "ms": {n: statistics.median(s) for n, s in samples.items()},
            "errors": errors}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warm", type=int, default=0, metavar="N",
                        help="compile every configuration in N processes first")
    parser.add_argument("--warm-only", action="store_true")
    parser.add_argument("--shapes", default="", help="comma-separated indices into SHAPES")
    parser.add_argument("--sweep", action="store_true",
                        help="also time the one-pass backward at every SWEEP point")
    args = parser.parse_args(argv)
    chosen = [int(i) for i in args.shapes.split(",") if i] or list(range(len(SHAPES)))
    if args.warm:
        with multiprocessing.get_context("spawn").Pool(min(args.warm, len(chosen))) as pool:
            for label in pool.imap_unordered(_warm_one, [(i, args.sweep) for i in chosen]):
                print(f"  compiled {label}", flush=True)
    if args.warm_only:
        return 0
    import subprocess

    import torch
    from importlib.metadata import version

    results = [time_shape(SHAPES[i], args.rounds, args.sweep) for i in chosen]
    props = torch.cuda.get_device_properties(0)
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    print(f"\ndevice {props.name}; driver {driver}; torch {torch.__version__}; cuDNN "
          f"{torch.backends.cudnn.version()}; cuda-tile {version('cuda-tile')}; steady state, "
          f"median of {args.rounds} interleaved rounds, bf16")
    names = ["kernel", "atomic", "atomic occ1", "cuDNN"]
    print("| shape | " + " | ".join(f"{n} ms" for n in names)
          + " | kernel/atomic | kernel/best atomic | max rel err vs kernel |")
    print("|---" * (len(names) + 4) + "|")
    for r in results:
        ms = r["ms"]
        best = min(ms[n] for n in ("atomic", "atomic occ1") if n in ms)
        cells = [f"{ms[n]:.3f}" if n in ms else "-" for n in names]
        err = max(r["errors"].values())
        print(f"| {r['label']} | " + " | ".join(cells)
              + f" | {ms['kernel'] / ms['atomic']:.3f}x | {ms['kernel'] / best:.3f}x "
              f"| {err:.1e} |")
    print("\nEvery configuration, ms (max rel err of dQ/dK/dV vs the two-kernel result):")
    for r in results:
        ms = r["ms"]
        fa4 = ms.get("FA4")
        print(f"{r['label']}:" + (f"  (FA4 {fa4:.3f} ms)" if fa4 else ""))
        for name in sorted(ms, key=ms.get):
            vs = f"  {fa4 / ms[name]:.3f}x FA4" if fa4 else ""
            err = r["errors"].get(name)
            print(f"  {name:<22} {ms[name]:8.3f}{vs}" + (f"  err {err:.1e}" if err else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
