"""The shipped cubins against cuTile's JIT on the same launches, in one process: outputs bit
for bit, and steady-state time interleaved.

    TILEDATTENTION_CUBINS=cubins/cubins-sm_90.zip python scripts/aot_vs_jit.py [--rounds 15]

The calls are ``scripts/cold_start.py``'s (Llama-shaped prefill and decode); the bundle must
hold their kernels (``cold_start.py --aot-problems``). Compiling is switched off
(``TILEDATTENTION_JIT=0``), so a call that runs took every kernel from the bundle. Its launches
are recorded and replayed: through the package's kernel objects (their compiles answered from
the bundle) and through a twin of each (``kernel.replace_hints()``: the same kernel and
options, compiled by cuTile's JIT). Both replays are ``ct.launch`` on the same arguments, so
each sample (20 back-to-back replays of a call's launches between CUDA events, the two taking
turns) times the kernels and the launch path with host time included.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cold_start import HEAD_DIM, HEADS_KV, HEADS_Q  # noqa: E402

LENGTHS = (173, 1000, 4096, 8192)


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if not os.environ.get("TILEDATTENTION_CUBINS"):
        print("set TILEDATTENTION_CUBINS to the bundle", file=sys.stderr)
        return 2
    os.environ["TILEDATTENTION_JIT"] = "0"
    import torch
    import cuda.tile as ct

    import tiledattention
    from tiledattention.tooling import recording_launches, served_from_bundles

    twins: dict = {}

    def replay(launches, jit: bool) -> None:
        for stream, grid, kernel, kernel_args, options in launches:
            if jit:
                if kernel not in twins:
                    twins[kernel] = kernel.replace_hints()
                kernel = twins[kernel]
            ct.launch(stream, grid, kernel, kernel_args, **options)

    def tensors(launches) -> list:
        return [a.clone() for *_, kernel_args, _ in launches for a in kernel_args
                if isinstance(a, torch.Tensor)]

    torch.manual_seed(0)
    rows = []
    for n in LENGTHS:
        q = torch.randn(1, HEADS_Q, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, HEADS_KV, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        for name, (qq, causal) in ((f"prefill {n}", (q, True)),
                                   (f"decode {n}", (q[:, :, -1:].clone(), False))):
            with recording_launches() as launches:
                tiledattention.sdpa(qq, k, v, causal=causal)  # every kernel from the bundle
            replay(launches, jit=False)
            torch.cuda.synchronize()
            shipped = tensors(launches)
            replay(launches, jit=True)  # (compiles the twins)
            torch.cuda.synchronize()
            same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                       for a, b in zip(shipped, tensors(launches)))
            samples: dict = {False: [], True: []}
            for _ in range(args.rounds):
                for jit in (False, True):
                    replay(launches, jit)
                    start, end = (torch.cuda.Event(enable_timing=True),
                                  torch.cuda.Event(enable_timing=True))
                    start.record()
                    for _ in range(20):
                        replay(launches, jit)
                    end.record()
                    end.synchronize()
                    samples[jit].append(start.elapsed_time(end) / 20)
            aot, jit = (statistics.median(samples[j]) for j in (False, True))
            rows.append((name, len(launches), same, aot, jit))
    served = served_from_bundles()
    print(f"device {torch.cuda.get_device_name()}; {served} launch signatures served from the "
          f"bundle, none compiled (TILEDATTENTION_JIT=0); median of {args.rounds} interleaved "
          "rounds of 20 back-to-back replays")
    print("| call | launches | bitwise equal to the JIT's | shipped ms | JIT ms | JIT / shipped |")
    print("|---|---|---|---|---|---|")
    for name, count, same, aot, jit in rows:
        print(f"| {name} | {count} | {same} | {aot:.4f} | {jit:.4f} | {jit / aot:.3f} |")
    return 0 if all(r[2] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
