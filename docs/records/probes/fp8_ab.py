"""FP8 kernels against their former code (GPU, issue 52), two changes at once:

- prefill: P's shift into e4m3's range (2^8) folded into each row's max. The online softmax
  added the shift to every score after subtracting the max (``FFMA`` then ``FADD`` an element:
  128 ``FADD R, R, 8`` a step in the sm_90 SASS of the D 128 default); it now subtracts
  ``max - shift`` once a row.
- decode over an e4m3 cache: V (and P) widened to float16, not to the queries' bf16. Every e4m3
  value is a float16 one, so the widening is one ``F2FP`` a pair of values; into bf16 it went
  through float32 (``F2FP`` + ``HADD2.F32`` + ``F2FP``): 4,568 -> 4,168 instructions in the
  sm_90 split kernel of B1 H32/8 32k.

The former code is the package with the files under ``--old DIR`` laid over it (the files of
the commit before, ``DIR/kernel_core/softmax.py`` and ``DIR/kernels/decode/_kernel.py``). Each
form runs in processes of its own, alternating new, old, new, old; each process times our FP8
call beside our bf16 call of the same shape (interleaved, L2 flushed, GPU time, median of
``--rounds``; the bf16 kernels are the same code in both forms, so they cancel drift between
processes) and, for decode, a device copy of the FP8 cache's bytes (the share of the copy
rate). Every call runs the family's sm_90 default (a shipped row would be stale under one of
the two trees). Errors by relative L2 against the float32 attention of the dequantised inputs
where that fits. Shapes are in no other FP8 probe's list.

    git show REV:tiledattention/kernel_core/softmax.py > old/kernel_core/softmax.py   # etc.
    source .devtk/setup.sh && python3 docs/records/probes/fp8_ab.py --old old [--rounds 10]

``--views``: decode and paged calls are also timed in two views with the host's time counted:
an isolated call from an idle GPU (L2 flushed) and calls back to back (steady state, warm L2).

A warm-up runs every (form, call) once in parallel processes first (the JIT's compiles), so the
timed processes load cubins from cuTile's disk cache. Prints the tables last.
"""

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PREFILL = [  # name, B, H_q, H_kv, S, D, causal
    ("llama3-8b 6000 x2 causal", 2, 32, 8, 6000, 128, True),
    ("40/8 12000 causal", 1, 40, 8, 12000, 128, True),
    ("qwen2.5-7b 2k x4 causal", 4, 28, 4, 2048, 128, True),
    ("llama3-70b 32k causal", 1, 64, 8, 32768, 128, True),
    ("llama3-8b 5000 x2 full", 2, 32, 8, 5000, 128, False),
    ("24/8 9000 full", 1, 24, 8, 9000, 128, False),
    ("gemma2 D256 6144 x2 causal", 2, 16, 8, 6144, 256, True),
    ("D256 16k full (8/4)", 1, 8, 4, 16384, 256, False),
]
DECODE = [  # name, B, H_q, H_kv, S_k, D
    ("B1 32/8 40000", 1, 32, 8, 40000, 128),
    ("B1 32/8 8192", 1, 32, 8, 8192, 128),
    ("B2 64/8 24000", 2, 64, 8, 24000, 128),
    ("B4 32/8 16000", 4, 32, 8, 16000, 128),
    ("B16 28/4 6000", 16, 28, 4, 6000, 128),
    ("B64 32/8 2000", 64, 32, 8, 2000, 128),
]
PAGED = [  # name, B, H_q, H_kv, longest cache, D, page size (the family's mixed lengths)
    ("paged B12 32/8 14000 p16", 12, 32, 8, 14000, 128, 16),
    ("paged B30 28/4 5000 p32", 30, 28, 4, 5000, 128, 32),
    ("paged B6 32/8 26000 p64", 6, 32, 8, 26000, 128, 64),
    ("paged B20 32/8 9000 p256", 20, 32, 8, 9000, 128, 256),
]
CALLS = ([("prefill", c) for c in PREFILL] + [("decode", c) for c in DECODE]
         + [("paged", c) for c in PAGED])


def overlaid(old: str) -> str:
    """A copy of the installed package with ``old``'s files laid over it: the directory to put
    first on ``sys.path``."""
    import importlib.util

    package = Path(importlib.util.find_spec("tiledattention").origin).parent
    root = Path(tempfile.mkdtemp(prefix="fp8_ab_old_"))
    shutil.copytree(package, root / "tiledattention")
    for path in Path(old).rglob("*.py"):
        shutil.copy(path, root / "tiledattention" / path.relative_to(old))
    return str(root)


def prefill_call(i, rounds):
    import torch

    import tiledattention as ta
    from fp8_fast_acc import errors, inputs
    from tuner.measure import time_interleaved

    name, b, hq, hkv, s, d, causal = PREFILL[i]
    g = torch.Generator(device="cuda").manual_seed(200 + i)
    reals, (q8, k8, v8), (qd, kd, vd) = inputs(b, hq, hkv, s, d, g)
    q, k, v = (x.to(torch.bfloat16) for x in reals)
    problem = dict(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=s, seqlen_k=s, head_dim=d,
                   causal=causal)
    sch8 = ta.FORWARD.default_schedule("sm_90", ta.Problem(dtype="e4m3", **problem))
    sch16 = ta.FORWARD.default_schedule("sm_90", ta.Problem(dtype="bf16", **problem))
    fns = {"fp8": lambda: ta.sdpa(q8, k8, v8, causal, q_descale=qd, k_descale=kd,
                                  v_descale=vd, schedule=sch8),
           "bf16": lambda: ta.sdpa(q, k, v, causal, schedule=sch16)}
    errs = errors(fns, ("fp8",), (q8, k8, v8), (qd, kd, vd), causal)
    t = time_interleaved(fns, rounds=rounds)
    return dict(fp8=t["fp8"].median_ms, bf16=t["bf16"].median_ms,
                err=errs.get("fp8", math.nan), schedule=sch8.describe())


def decode_call(i, rounds):
    import torch

    import tiledattention as ta
    from fp8_bench import rel
    from tiledattention.tooling import dequantise_fp8, quantise_fp8

    name, b, hq, hkv, sk, d = DECODE[i]
    g = torch.Generator(device="cuda").manual_seed(300 + i)
    q = torch.randn(b, hq, 1, d, device="cuda", generator=g).to(torch.bfloat16)
    reals = [torch.randn(b, hkv, sk, d, device="cuda", generator=g) for _ in range(2)]
    (k8, kd), (v8, vd) = (quantise_fp8(x, hkv) for x in reals)
    k, v = (x.to(torch.bfloat16) for x in reals)
    problem = dict(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                   dtype="bf16", causal=False)
    sch8 = ta.DECODE.default_schedule("sm_90", ta.Problem(kv_dtype="e4m3", **problem))
    sch16 = ta.DECODE.default_schedule("sm_90", ta.Problem(**problem))
    fns = {"fp8": lambda: ta.sdpa(q, k8, v8, k_descale=kd, v_descale=vd, schedule=sch8),
           "bf16": lambda: ta.sdpa(q, k, v, schedule=sch16)}
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), dequantise_fp8(k8, kd), dequantise_fp8(v8, vd), enable_gqa=hq != hkv)
    return timed_step(fns, 2 * k8.numel(), rounds, rel(fns["fp8"](), ref), sch8)


def paged_call(i, rounds):
    """A paged decode step over an e4m3 cache against the same batch over a bf16 cache (the
    family's case: caches of the longest, 3/4, 1/2 and 1/4 of it in shuffled pages), each
    with its sm_90 default."""
    import dataclasses

    import tiledattention as ta

    name, b, hq, hkv, sk, d, page = PAGED[i]
    p8 = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=d,
                    dtype="bf16", causal=True, bottom_right=True, ragged=True, page_size=page,
                    kv_dtype="e4m3")
    p16 = dataclasses.replace(p8, kv_dtype="")
    sch8 = ta.DECODE.default_schedule("sm_90", p8)
    case8, case16 = ta.DECODE.case(p8, 0), ta.DECODE.case(p16, 0)
    fns = {"fp8": case8.launcher(sch8),
           "bf16": case16.launcher(ta.DECODE.default_schedule("sm_90", p16))}
    bytes8 = 2 * int(case8.seqused.sum()) * hkv * d
    return timed_step(fns, bytes8, rounds, case8.error(fns["fp8"]), sch8)


def timed_step(fns, bytes8, rounds, err, schedule):
    """The ``fp8`` and ``bf16`` decode calls of ``fns`` timed beside a device copy of
    ``bytes8`` bytes (the FP8 cache's), interleaved, L2 flushed: their medians, the shares of
    the copy rate, ``err`` and ``schedule``; with ``VIEWS`` the host-counted views too."""
    import torch

    from tuner.measure import time_interleaved

    src = torch.ones(bytes8 // 4, dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    timed = {**fns, "copy": lambda: dst.copy_(src)}  # reads and writes bytes8
    t = {n: tm.median_ms for n, tm in time_interleaved(timed, rounds=rounds).items()}
    rate = 2 * bytes8 / t["copy"]  # bytes a ms, read plus written
    return decode_views(fns, rounds, dict(
        fp8=t["fp8"], bf16=t["bf16"], err=err, schedule=schedule.describe(),
        copy8=bytes8 / t["fp8"] / rate, copy16=2 * bytes8 / t["bf16"] / rate))


VIEWS = False  # set by --views: decode_views adds the isolated and loop timings


def decode_views(fns, rounds, result):
    """With ``VIEWS``: the FP8 and bf16 calls' isolated (host counted, L2 flushed) and loop
    (back to back, host counted, warm L2) medians, added to ``result``."""
    from tuner.measure import time_interleaved

    if VIEWS:
        pair = {n: fns[n] for n in ("fp8", "bf16")}
        for view, mode in (("iso", dict(host=True)), ("loop", dict(loop=True, flush_l2=False))):
            for n, t in time_interleaved(pair, rounds=rounds, **mode).items():
                result[f"{n}_{view}"] = t.median_ms
    return result


def child(old: str | None, rounds: int, only: list[int]) -> None:
    if old:
        sys.path.insert(0, overlaid(old))
    sys.path.insert(0, str(Path(__file__).parent))
    import tiledattention

    out = {"package": tiledattention.__file__}
    for i in only:
        kind, (name, *_) = CALLS[i]
        index = i - sum(1 for k, _ in CALLS[:i] if k != kind)
        call = {"prefill": prefill_call, "decode": decode_call, "paged": paged_call}[kind]
        out[name] = call(index, rounds)
    print("RESULT " + json.dumps(out), flush=True)


def command(form: str, old: str, rounds: int, only: list[int]) -> list[str]:
    return [sys.executable, __file__, "--child", form, "--old", old, "--rounds", str(rounds),
            "--only", ",".join(map(str, only))] + (["--views"] if VIEWS else [])


def run_child(form: str, old: str, rounds: int, only: list[int]) -> dict:
    done = subprocess.run(command(form, old, rounds, only), capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{form} {only}: exit {done.returncode}\n{done.stderr[-3000:]}")


def geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def report(runs: dict, only: list[int]) -> None:
    def med(form, name, key):
        return statistics.median(r[name][key] for r in runs[form])

    for kind in ("prefill", "decode", "paged"):
        rows = [CALLS[i][1] for i in only if CALLS[i][0] == kind]
        if not rows:
            continue
        if kind == "prefill":
            print("\n| prefill (e4m3, per-head descales) | schedule | new fp8 TFLOP/s | old fp8 "
                  "TFLOP/s | bf16 TFLOP/s | new ÷ old (speed) | new fp8 ÷ bf16 | old fp8 ÷ bf16 "
                  "| err new | err old |\n" + "|---" * 10 + "|")
        else:
            print("\n| decode (bf16 q, e4m3 cache) | schedule | new fp8 µs | old fp8 µs | bf16 µs "
                  "| new ÷ old (speed) | new fp8 ÷ bf16 | old fp8 ÷ bf16 | new % of copy | "
                  "old % of copy | bf16 % of copy | err new | err old |\n"
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        gains, new_x, old_x = [], [], []
        for name, b, hq, _hkv, s, d, *rest in rows:
            x = {form: statistics.median(r[name]["bf16"] / r[name]["fp8"] for r in runs[form])
                 for form in runs}
            gains.append(x["new"] / x["old"])
            new_x.append(x["new"])
            old_x.append(x["old"])
            first = {form: runs[form][0][name] for form in runs}
            bf16 = statistics.median(r[name]["bf16"] for form in runs for r in runs[form])
            if kind == "prefill":
                flops = 4 * b * hq * s * s * d / (2 if rest[0] else 1)
                print(f"| {name} | {first['new']['schedule']} | "
                      f"{flops / med('new', name, 'fp8') / 1e9:.0f} | "
                      f"{flops / med('old', name, 'fp8') / 1e9:.0f} | {flops / bf16 / 1e9:.0f} | "
                      f"{gains[-1]:.3f} | {x['new']:.2f} | {x['old']:.2f} | "
                      f"{first['new']['err']:.1e} | {first['old']['err']:.1e} |")
            else:
                print(f"| {name} | {first['new']['schedule']} | "
                      f"{med('new', name, 'fp8') * 1e3:.1f} | {med('old', name, 'fp8') * 1e3:.1f} "
                      f"| {bf16 * 1e3:.1f} | {gains[-1]:.3f} | {x['new']:.2f} | {x['old']:.2f} | "
                      f"{med('new', name, 'copy8'):.0%} | {med('old', name, 'copy8'):.0%} | "
                      f"{med('new', name, 'copy16'):.0%} | {first['new']['err']:.1e} | "
                      f"{first['old']['err']:.1e} |")
        print(f"{kind} geometric mean: new ÷ old {geo(gains):.3f}, new fp8 ÷ bf16 "
              f"{geo(new_x):.3f}, old fp8 ÷ bf16 {geo(old_x):.3f}")
        if kind != "prefill" and "fp8_iso" in runs["new"][0][rows[0][0]]:
            print("\n| call | view | new fp8 µs | old fp8 µs | bf16 µs | new ÷ old (speed) | "
                  "new fp8 ÷ bf16 | old fp8 ÷ bf16 |\n|---|---|---|---|---|---|---|---|")
            for view in ("iso", "loop"):
                for name, *_ in rows:
                    n8, o8 = med("new", name, f"fp8_{view}"), med("old", name, f"fp8_{view}")
                    b16 = statistics.median(r[name][f"bf16_{view}"]
                                            for form in runs for r in runs[form])
                    print(f"| {name} | {'isolated' if view == 'iso' else 'loop'} | "
                          f"{n8 * 1e3:.1f} | {o8 * 1e3:.1f} | {b16 * 1e3:.1f} | {o8 / n8:.3f} | "
                          f"{b16 / n8:.2f} | {b16 / o8:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="the former files, laid over the package")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--child", choices=("new", "old"))
    ap.add_argument("--only", default="")
    ap.add_argument("--views", action="store_true")
    args = ap.parse_args()
    global VIEWS
    VIEWS = args.views
    only = [int(i) for i in args.only.split(",")] if args.only else list(range(len(CALLS)))
    if args.child:
        child(args.old if args.child == "old" else None, args.rounds, only)
        return
    # warm-up: every (form, call) once, in parallel (the compiles), results dropped
    warm = [subprocess.Popen(command(form, args.old, 1, [i]), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
            for form in ("new", "old") for i in only]
    for proc in warm:
        _, err = proc.communicate()
        if proc.returncode:
            print(f"warm-up failed: {err[-2000:]}", flush=True)
    runs = {"new": [], "old": []}
    for _ in range(args.pairs):
        for form in ("new", "old"):
            runs[form].append(run_child(form, args.old, args.rounds, only))
            print(form, json.dumps(runs[form][-1]), flush=True)
    report(runs, only)


if __name__ == "__main__":
    main()
