"""Length-free compiles against cuTile's exact ones (GPU): does code compiled with no assumption on
the lengths (``tiledattention.core._aot.ShippedCompile.compile_length_free``, what every JIT
compile now is) run as fast as code compiled for the launch's own signature, where that signature
says the lengths divide by 16? Each mode runs in processes of its own (the mode is the process's:
one compile per signature), alternating exact, length-free, exact, length-free; each process
times the sm_90 defaults beside torch's cuDNN backend (interleaved, L2 flushed, median of 20),
and the table compares ours ÷ cuDNN between the modes (the cuDNN column cancels drift between
processes).

    source .devtk/setup.sh && python3 docs/records/probes/length_free_ab.py [--rounds 20]

Every call's lengths divide by 16 (elsewhere the two compiles are the same code). Prints the
table last.
"""

import json
import os
import statistics
import subprocess
import sys

#: (family, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
CALLS = (("forward", 2, 32, 8, 4096, 4096, 128, True),
         ("forward", 4, 16, 16, 2048, 2048, 64, False),
         ("forward", 1, 16, 16, 8192, 8192, 128, False),
         ("forward", 2, 8, 8, 4096, 4096, 256, True),
         ("backward", 2, 16, 16, 2048, 2048, 128, True),
         ("backward", 4, 12, 12, 1024, 1024, 64, False),
         ("decode", 8, 32, 8, 1, 8192, 128, False),
         ("decode", 1, 32, 8, 1, 32768, 128, False))


def child(mode: str, rounds: int, warm_only: bool) -> None:
    import tiledattention as ta
    from tiledattention.core import _aot
    from tuner.measure import time_interleaved

    if mode == "exact":  # cuTile's own compile of the launch's signature
        _aot.ShippedCompile.compile_length_free = (
            lambda self, signature, context, capability: self.original(signature, context,
                                                                       capability))
    families = {"forward": ta.FORWARD, "backward": ta.BACKWARD, "decode": ta.DECODE}
    out = {}
    for fam, b, hq, hkv, sq, sk, d, causal in CALLS:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                       dtype="bf16", causal=causal)
        family = families[fam]
        case = family.case(p, 0)
        ours = case.launcher(family.default_schedule("sm_90", p))
        err = case.error(ours)
        if warm_only:
            continue
        times = time_interleaved({"ours": ours, "cudnn": case.baselines()["torch-cudnn"]},
                                 rounds=rounds)
        out[f"{fam} B{b} H{hq}/{hkv} S{sq}x{sk} D{d}{' causal' if causal else ''}"] = dict(
            ours=times["ours"].median_ms, cudnn=times["cudnn"].median_ms, err=err)
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 20
    if "--child" in sys.argv:
        child(sys.argv[sys.argv.index("--child") + 1], rounds, "--warm-only" in sys.argv)
        return
    me = [sys.executable, __file__, "--rounds", str(rounds), "--child"]
    # compile both modes at once (separate processes, one GPU), then time them in turn
    warm = [subprocess.Popen(me + [m, "--warm-only"]) for m in ("exact", "length-free")]
    assert all(w.wait() == 0 for w in warm)
    runs: dict = {"exact": [], "length-free": []}
    for mode in ("exact", "length-free", "exact", "length-free"):
        text = subprocess.run(me + [mode], capture_output=True, text=True, check=True,
                              env=os.environ).stdout
        runs[mode].append(json.loads(text.split("RESULT ", 1)[1]))
    print("| call | exact: ours µs (÷ cuDNN) | length-free: ours µs (÷ cuDNN) | length-free "
          "speed ÷ exact | max rel. error |")
    print("|---|---|---|---|---|")
    ratios = []
    for call in runs["exact"][0]:
        rel = {m: statistics.mean(r[call]["ours"] / r[call]["cudnn"] for r in runs[m])
               for m in runs}
        ours = {m: statistics.mean(r[call]["ours"] for r in runs[m]) for m in runs}
        err = max(r[call]["err"] for m in runs for r in runs[m])
        ratios.append(rel["exact"] / rel["length-free"])
        print(f"| {call} | {ours['exact'] * 1e3:.1f} ({rel['exact']:.3f}) | "
              f"{ours['length-free'] * 1e3:.1f} ({rel['length-free']:.3f}) | "
              f"{ratios[-1]:.3f} | {err:.1e} |")
    print(f"geometric mean length-free ÷ exact speed: "
          f"{statistics.geometric_mean(ratios):.3f} (min {min(ratios):.3f})")


if __name__ == "__main__":
    main()
