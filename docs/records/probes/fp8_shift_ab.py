"""FP8 prefill with P's shift into e4m3's range folded into each row's max, against the form
before it (GPU, issue 52). The e4m3 forward scales P by 2^8 before P·V; the online softmax
added the shift to every score after subtracting the row's max (``FFMA`` then ``FADD`` an
element: 128 ``FADD R, R, 8`` a step in the sm_90 SASS of the D 128 default), and now
subtracts ``max - shift`` once a row (one ``FFMA`` an element). The two forms run in processes
of their own (``old`` patches the former ``online_softmax`` into the forward kernel's module
before anything compiles), alternating new, old, new, old; each process times the lookup's FP8
schedule beside our bf16 forward of the same shape (interleaved, L2 flushed, GPU time, median
of ``--rounds``), and the table compares fp8 ÷ bf16 between the forms (the bf16 kernel is the
same code in both, so it cancels drift between processes). Errors by relative L2 against the
float32 attention of the dequantised inputs where that fits. Shapes: Llama, Qwen and
Gemma-shaped prefills in no other FP8 probe's list.

    source .devtk/setup.sh && python3 docs/records/probes/fp8_shift_ab.py [--rounds 10]

A warm-up runs every (form, shape) once in parallel processes first (the JIT's compiles), so
the timed processes load cubins from cuTile's disk cache. Prints the table last.
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

SHAPES = [  # name, B, H_q, H_kv, S, D, causal
    ("llama3-8b 6000 x2 causal", 2, 32, 8, 6000, 128, True),
    ("40/8 12000 causal", 1, 40, 8, 12000, 128, True),
    ("qwen2.5-7b 2k x4 causal", 4, 28, 4, 2048, 128, True),
    ("llama3-70b 32k causal", 1, 64, 8, 32768, 128, True),
    ("llama3-8b 5000 x2 full", 2, 32, 8, 5000, 128, False),
    ("24/8 9000 full", 1, 24, 8, 9000, 128, False),
    ("gemma2 D256 6144 x2 causal", 2, 16, 8, 6144, 256, True),
    ("D256 16k full (8/4)", 1, 8, 4, 16384, 256, False),
]


def old_online_softmax(qk, m_i, l_i, scale, EXP2, prescaled, shift=0.0):
    """``kernel_core.softmax.online_softmax`` before the shift joined the row's max (commit
    8e35d4d): the shift added to every score."""
    import cuda.tile as ct

    if prescaled:
        m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True))
        shifted = qk - m_ij
    else:
        m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True) * scale)
        shifted = qk * scale - m_ij
    if shift:
        shifted = shifted + shift
    if EXP2:
        p = ct.exp2(shifted, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)
    else:
        p = ct.exp(shifted)
        alpha = ct.exp(m_i - m_ij)
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
    return p, m_ij, l_i, alpha


def child(form: str, rounds: int, only: list[int]) -> None:
    import torch

    import tiledattention as ta
    import tiledattention.kernels.forward._kernel as forward_kernel
    from tuner.measure import time_interleaved

    sys.path.insert(0, str(Path(__file__).parent))
    from fp8_fast_acc import errors, inputs

    if form == "old":
        forward_kernel.online_softmax = old_online_softmax
    out = {}
    for i in only:
        name, b, hq, hkv, s, d, causal = SHAPES[i]
        g = torch.Generator(device="cuda").manual_seed(200 + i)
        reals, (q8, k8, v8), (qd, kd, vd) = inputs(b, hq, hkv, s, d, g)
        q, k, v = (x.to(torch.bfloat16) for x in reals)
        fns = {"fp8": lambda: ta.sdpa(q8, k8, v8, causal, q_descale=qd, k_descale=kd,
                                      v_descale=vd),
               "bf16": lambda: ta.sdpa(q, k, v, causal)}
        errs = errors(fns, ("fp8",), (q8, k8, v8), (qd, kd, vd), causal)
        times = time_interleaved(fns, rounds=rounds)
        out[name] = dict(fp8=times["fp8"].median_ms, bf16=times["bf16"].median_ms,
                         err=errs.get("fp8", math.nan),
                         schedule=ta.explain(q8, k8, v8, causal).schedule.describe())
    print("RESULT " + json.dumps(out), flush=True)


def run_child(form: str, rounds: int, only: list[int]) -> dict:
    cmd = [sys.executable, __file__, "--child", form, "--rounds", str(rounds),
           "--only", ",".join(map(str, only))]
    done = subprocess.run(cmd, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{form} {only}: exit {done.returncode}\n{done.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--child", choices=("new", "old"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = [int(i) for i in args.only.split(",")] if args.only else list(range(len(SHAPES)))
    if args.child:
        child(args.child, args.rounds, only)
        return
    # warm-up: every (form, shape) once, in parallel (the compiles), results dropped
    warm = [subprocess.Popen([sys.executable, __file__, "--child", form, "--rounds", "1",
                              "--only", str(i)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
            for form in ("new", "old") for i in only]
    for proc in warm:
        _, err = proc.communicate()
        if proc.returncode:
            print(f"warm-up failed: {err[-2000:]}", flush=True)
    runs = {"new": [], "old": []}
    for _ in range(args.pairs):
        for form in ("new", "old"):
            runs[form].append(run_child(form, args.rounds, only))
            print(form, json.dumps(runs[form][-1]), flush=True)
    print("\n| prefill (e4m3, per-head descales) | schedule | new fp8 TFLOP/s | old fp8 TFLOP/s "
          "| bf16 TFLOP/s | new ÷ old (speed) | new fp8 ÷ bf16 | old fp8 ÷ bf16 | err new | "
          "err old |\n|---|---|---|---|---|---|---|---|---|---|")
    gains, new_bf16, old_bf16 = [], [], []
    for i in only:
        name, b, hq, hkv, s, d, causal = SHAPES[i]
        flops = 4 * b * hq * s * s * d / (2 if causal else 1)
        ratio = {form: statistics.median(r[name]["bf16"] / r[name]["fp8"] for r in runs[form])
                 for form in runs}
        fp8 = {form: statistics.median(r[name]["fp8"] for r in runs[form]) for form in runs}
        bf16 = statistics.median(r[name]["bf16"] for form in runs for r in runs[form])
        gains.append(ratio["new"] / ratio["old"])
        new_bf16.append(ratio["new"])
        old_bf16.append(ratio["old"])
        print(f"| {name} | {runs['new'][0][name]['schedule']} | {flops / fp8['new'] / 1e9:.0f} | "
              f"{flops / fp8['old'] / 1e9:.0f} | {flops / bf16 / 1e9:.0f} | {gains[-1]:.3f} | "
              f"{ratio['new']:.2f} | {ratio['old']:.2f} | {runs['new'][0][name]['err']:.1e} | "
              f"{runs['old'][0][name]['err']:.1e} |")

    def geo(xs):
        return math.exp(sum(map(math.log, xs)) / len(xs))

    print(f"geometric mean: new ÷ old {geo(gains):.3f}, new fp8 ÷ bf16 {geo(new_bf16):.3f}, "
          f"old fp8 ÷ bf16 {geo(old_bf16):.3f}")


if __name__ == "__main__":
    main()
