"""How fast could the one-pass backward be if its dQ shares cost nothing to add (issue 47)?

The one-pass dK/dV kernel (``DQ_ATOMIC``) computes each (query tile, key tile) pair's dQ share
(a fifth matrix product) and adds it into a float32 accumulator by a bulk reduce-add staged
through one shared-memory buffer (``docs/performance-notes.md``, "Next hypotheses"). This probe
builds, from the product's own kernel source, a *bound* form of it: the same five products a
pair, but each pair's dQ share accumulated in registers across the walk and added once at the
end (its result is wrong: it only keeps the product from being removed). Timed beside the
two-kernel default, the one-pass form with the same dK/dV fields and FlashAttention-4 (where
``flash_attn.cute`` imports), steady state (``backward_onepass_timing.steady_ms``: back-to-back
calls, interleaved, median of ``--rounds``), and each kernel's GPU time (torch's profiler).

Reading: if the bound is far above the two kernels, the reduce-add path is what holds the
one-pass back; if it is near them, five products in the compiler's code do not run faster
than seven in two kernels, whatever the reduce costs.

    source .devtk/setup.sh && python3 docs/records/probes/backward_onepass_bound.py [--cpu]

``--cpu``: only compile the forms for sm_90 and print their registers and stack.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

#: (label, batch, heads_q, heads_kv, seqlen, head_dim, causal, dtype)
SHAPES = [("B1 H16 S8192 D128 full", 1, 16, 16, 8192, 128, False, "bf16"),
          ("B1 H32/8 S4096 D128 causal", 1, 32, 8, 4096, 128, True, "bf16"),
          ("B2 H28/4 S3000 D128 causal", 2, 28, 4, 3000, 128, True, "bf16"),
          ("B1 H48/1 S8192 D128 causal fp16", 1, 48, 1, 8192, 128, True, "fp16"),
          ("B8 H16 S577 D64 full", 8, 16, 16, 577, 64, False, "bf16"),
          ("B2 H16/4 S4096 D64 causal", 2, 16, 4, 4096, 64, True, "bf16"),
          ("B2 H16/8 S4096 D256 causal", 2, 16, 8, 4096, 256, True, "bf16")]

#: the one-pass pair step's dQ share and its reduce-add, as the kernel source has them
SHARE = """                dq = ct.mma(ct.transpose(ds), k,
                            ct.full((TILE_M, TILE_D), 0.0, dtype=np.float32))
                dQsum.tiled_view((1, 1, TILE_M, TILE_D)).atomic_store_add(
                    (batch, head, i, 0), dq.reshape((1, 1, TILE_M, TILE_D)))"""
#: the bound's: the share accumulated across the walk in ``dv2`` (unused without a second
#: head-dim part)
SHARE_BOUND = """                dv2 = ct.mma(ct.transpose(ds), k, dv2)"""
WALK = """        dv, dv2 = _accumulators(TILE_D, TILE_D2, rows=TILE_N)
"""
WALK_BOUND = WALK + """        dv2 = ct.full((TILE_M, TILE_D), 0.0, dtype=np.float32)
"""
STORE = """        part = split * Q.shape[0] + batch
"""
STORE_BOUND = """        dQsum.tiled_view((1, 1, TILE_M, TILE_D)).atomic_store_add(
            (batch, kv_head * group, 0, 0), dv2.reshape((1, 1, TILE_M, TILE_D)))
""" + STORE


def bound_kernel():
    """``attention_bwd_dkdv`` of the bound form (for schedules of one head-dim part)."""
    from tiledattention.kernels.backward import _kernel

    text = Path(_kernel.__file__).read_text()
    for old, new in ((SHARE, SHARE_BOUND), (WALK, WALK_BOUND), (STORE, STORE_BOUND)):
        if text.count(old) != 1:
            raise SystemExit(f"the kernel source changed; not found once: {old.strip()[:60]}")
        text = text.replace(old, new)
    text = text.replace("from ...kernel_core", "from tiledattention.kernel_core")
    path = Path(__file__).with_name("_bwd_kernel_bound.py")  # ct.kernel reads its source file
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("_bwd_kernel_bound", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["_bwd_kernel_bound"] = module
    spec.loader.exec_module(module)
    return module.attention_bwd_dkdv


def forms(problem):
    """(name, schedule, bound?) of the problem: the two-kernel default, the one-pass form of
    the softcap rule's dK/dV fields at D <= 128 (FA3's layout: the fastest one-pass form in
    ``backward/onepass.md``) or of the default's at D 256, and its bound."""
    from tiledattention import BACKWARD
    from tiledattention.kernels.backward._defaults import SOFTCAP_ONE_PASS

    default = BACKWARD.default_schedule("sm_90", problem)
    kernel = BACKWARD.deterministic_schedule("sm_90", problem, default)
    fields = SOFTCAP_ONE_PASS["hopper"][128].fields if problem.head_dim <= 128 else {}
    one_pass = BACKWARD.normalise(problem, kernel.replace(dq_mode="atomic", **fields))
    return [("two kernels", kernel, False), ("one-pass", one_pass, False),
            ("bound", one_pass, True)]


def runner(inputs, schedule, bound):
    """A call of ``schedule`` on the case's buffers; ``bound``: its dK/dV kernel the bound's."""
    import torch
    from tiledattention.kernels.backward import _launch
    from tiledattention.kernels.backward._family import allocate_scratch

    case = inputs.case
    plan = _launch.launches(case.problem, schedule, case.scale)
    if bound:
        s = _launch.normalise(case.problem, schedule)
        plan = plan._replace(dkdv=bound_kernel().replace_hints(
            occupancy=s.dkdv_occupancy, num_worker_warps=s.dkdv_worker_warps))
    scratch = allocate_scratch(plan, case.q.device)

    def run() -> None:
        _launch.launch(torch.cuda.current_stream(), plan, case.q, case.k, case.v, case.out,
                       case.grad_out, case.lse, case.delta, *case.grads, scratch)
    return run


def cpu_report(problem):
    import cuda.tile.compilation  # noqa: F401  (the compile-only path)
    from tiledattention import BACKWARD
    from tiledattention.kernels.backward import _launch

    for name, schedule, bound in forms(problem):
        if bound:
            product = _launch._dkdv
            kernel = bound_kernel()
            _launch._dkdv = lambda: kernel
            _launch._hinted.cache_clear()
        try:
            built = BACKWARD.compile(problem, schedule, "sm_90")
            said = "; ".join(f"{k.name} {k.registers} regs x {k.threads}, {k.stack_bytes} B stack"
                             for k in built.resources())
        finally:
            if bound:
                _launch._dkdv = product
                _launch._hinted.cache_clear()
        print(f"  {name} {schedule.describe()}: {said}", flush=True)


def _warm(shape) -> None:
    from tiledattention import Problem

    label, b, hq, hkv, s, d, causal, dtype = shape
    cpu_report(Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s,
                       head_dim=d, causal=causal, dtype=dtype))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--only", type=str, default="")
    ap.add_argument("--warm", action="store_true",
                    help="compile every form first, a process a shape (cuTile's cache serves "
                         "the launches)")
    args = ap.parse_args()
    from tiledattention import Problem

    shapes = [s for s in SHAPES if not args.only or any(o in s[0] for o in args.only.split(","))]
    if args.warm and not args.cpu:
        from concurrent.futures import ProcessPoolExecutor

        bound_kernel()  # its source file written once, before the workers read it
        with ProcessPoolExecutor(max_workers=len(shapes)) as pool:
            list(pool.map(_warm, shapes))
    rows = []
    for label, b, hq, hkv, s, d, causal, dtype in shapes:
        problem = Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s,
                          head_dim=d, causal=causal, dtype=dtype)
        print(f"== {label}", flush=True)
        if args.cpu:
            cpu_report(problem)
            continue
        from backward_onepass_timing import Inputs, _fa4, kernel_times, steady_ms

        inputs = Inputs(problem)
        runs = {name: runner(inputs, schedule, bound) for name, schedule, bound in forms(problem)}
        fa4 = _fa4(problem, inputs)
        if fa4 is not None:
            runs["FA4"] = fa4
        ms = steady_ms(runs, args.rounds)
        for name, run in runs.items():
            kernels = kernel_times(run)
            print(f"  {name}: {ms[name] * 1e3:.1f} us; kernels "
                  + ", ".join(f"{k[:28]} {t:.1f}" for k, t in kernels.items()), flush=True)
        rows.append((label, ms))
    if rows:
        print("\n| shape | two kernels µs | one-pass ÷ two | bound ÷ two | FA4 ÷ two |")
        print("|---|---|---|---|---|")
        for label, ms in rows:
            two = ms["two kernels"]
            fa4 = f"{two / ms['FA4']:.3f}" if "FA4" in ms else "-"
            print(f"| {label} | {two * 1e3:.1f} | {two / ms['one-pass']:.3f} | "
                  f"{two / ms['bound']:.3f} | {fa4} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
