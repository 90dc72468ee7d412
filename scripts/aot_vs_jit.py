"""The shipped cubins against cuTile's JIT on the same calls, in one process: outputs bit for
bit, and steady-state time interleaved (each sample: 20 back-to-back calls between CUDA events,
the two paths taking turns, median of the rounds).

    TILEDATTENTION_CUBINS=cubins/cubins-sm_90.zip python scripts/aot_vs_jit.py [--rounds 15]

The calls are ``scripts/cold_start.py``'s (Llama-shaped prefill and decode); the bundle must
hold their kernels (``cold_start.py --aot-problems``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cold_start import HEAD_DIM, HEADS_KV, HEADS_Q  # noqa: E402

LENGTHS = (173, 1000, 4096, 8192)
CUBINS = "TILEDATTENTION_CUBINS"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    import torch

    import tiledattention
    from tiledattention.tooling import forget_shipped_cubins, launch_path

    bundles = os.environ.get(CUBINS, "")
    if not bundles:
        print(f"set {CUBINS} to the bundle", file=sys.stderr)
        return 2

    def use(shipped: bool) -> None:
        if shipped:
            os.environ[CUBINS] = bundles
        else:
            os.environ.pop(CUBINS, None)
        forget_shipped_cubins()

    def from_bundle(q, k, v, causal: bool) -> bool:
        """Whether the call's kernels all have shipped cubins (``explain``'s launch path)."""
        found = tiledattention.explain(q, k, v, causal=causal)
        problem, _ = tiledattention.problem_from_arrays(q, k, v, causal, None)
        arch = "sm_%d%d" % torch.cuda.get_device_capability()
        path = launch_path(tiledattention.get_family(found.family), problem, found.schedule, arch)
        return path.startswith("shipped")

    torch.manual_seed(0)
    calls = []
    for n in LENGTHS:
        q = torch.randn(1, HEADS_Q, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, HEADS_KV, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        step = q[:, :, -1:].clone()
        calls.append((f"prefill {n}", (q, k, v, True)))
        calls.append((f"decode {n}", (step, k, v, False)))
    rows = []
    for name, (q, k, v, causal) in calls:
        def call(q=q, k=k, v=v, causal=causal):
            return tiledattention.sdpa(q, k, v, causal=causal)
        use(False)
        want = call()
        use(True)
        got = call()
        torch.cuda.synchronize()
        shipped = from_bundle(q, k, v, causal)
        same = torch.equal(got.view(torch.int16), want.view(torch.int16))
        samples = {True: [], False: []}
        for _ in range(args.rounds):
            for path in (True, False):
                use(path)
                call()
                start, end = (torch.cuda.Event(enable_timing=True),
                              torch.cuda.Event(enable_timing=True))
                start.record()
                for _ in range(20):
                    call()
                end.record()
                end.synchronize()
                samples[path].append(start.elapsed_time(end) / 20)
        aot, jit = (statistics.median(samples[p]) for p in (True, False))
        rows.append((name, shipped, same, aot, jit))
    print(f"device {torch.cuda.get_device_name()}; median of {args.rounds} interleaved rounds")
    print("| call | from a shipped cubin | bitwise equal to the JIT's | shipped ms | JIT ms "
          "| JIT / shipped |")
    print("|---|---|---|---|---|---|")
    for name, shipped, same, aot, jit in rows:
        print(f"| {name} | {shipped} | {same} | {aot:.4f} | {jit:.4f} | {jit / aot:.3f} |")
    return 0 if all(r[1] and r[2] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
