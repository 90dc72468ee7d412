"""Paged decode over an FP8 cache on the GPU (issue 52: "paged FP8 decode likewise"): the
sm_90 default of an e4m3 cache against the same batch in bf16, on mixed-length paged batches
(the family's paged case: caches of the longest, 3/4, 1/2 and 1/4 of it, in shuffled pages) at
pages of 16 to 256, GQA 32/8 and 28/4. Interleaved, the L2 flushed before each sample (GPU
time); shares of the device copy rate (read + written, same run) on each cache's valid K/V
bytes read once; errors against the float32 attention of the dequantised cache.

    source .devtk/setup.sh && python3 docs/records/probes/paged_fp8.py \
        [--sweep | --check | --pdl | --warps]

``--sweep``: for the e4m3 cache only, the default against occupancy 2 with K loads four steps
ahead at 1, 2, 4 and 6 times its splits (the shape of the searched FP8 rows), on the paged
batches and on contiguous caches (``CONTIGUOUS``), each candidate compiled ahead in a pool of
processes. ``--check``: other batches (none of the sweep's; ``CHECK``), the e4m3 cache's
default against the bf16 rule it replaced (``FP8_SPLIT_FACTOR``) and the same batch over a
bf16 cache. ``--pdl``: the batches of the sweep, the default against the same schedule
with its block merge launched as a programmatic dependent (``combine="block_pdl"``).
``--warps``: the batches of the sweep and ``WARPS_MORE`` (bf16 caches among them), the default
against the same schedule with eight worker warps (``num_worker_warps=8``: each warp widens half
the bytes a step), at one and two CTAs an SM and with twice the splits.
"""

import dataclasses
import sys
from pathlib import Path

import tiledattention as ta
from tuner.measure import time_interleaved

sys.path.insert(0, str(Path(__file__).parent))
from compile_ahead import compile_ahead  # noqa: E402
from paged_defaults import copy_rate  # noqa: E402

# (batch, heads_q, heads_kv, longest cache, page size): none is a shipped or tested batch
POINTS = ((8, 32, 8, 20000, 16), (40, 28, 4, 6000, 16), (24, 32, 8, 9000, 32),
          (16, 32, 8, 12000, 64), (56, 28, 4, 3000, 64), (12, 32, 8, 30000, 256))
# (batch, heads_q, heads_kv, cache length): one length for the whole batch, no pages
CONTIGUOUS = ((1, 32, 8, 20000), (4, 32, 8, 16000), (12, 28, 4, 6000), (32, 32, 8, 3000))


# (batch, heads_q, heads_kv, longest cache[, page size]); the two B1 caches of 32k and 128k
# are the shipped contiguous FP8 rows' shapes
CHECK = ((20, 32, 8, 15000, 16), (48, 28, 4, 4000, 32), (10, 32, 8, 25000, 128),
         (1, 32, 8, 48000), (2, 32, 8, 32768), (8, 28, 4, 12000), (64, 32, 8, 1500),
         (1, 32, 8, 32768), (1, 32, 8, 131072))


def fp8_problem(b, hq, hkv, sk, page=0):
    return ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=128,
                      dtype="bf16", causal=bool(page), bottom_right=bool(page),
                      ragged=bool(page), page_size=page, kv_dtype="e4m3")


# (batch, heads_q, heads_kv, cache length, page size, kv dtype): more for ``--warps``, none a
# shipped or tested batch; "" is a bf16 cache
WARPS_MORE = ((1, 32, 8, 8192, 0, "e4m3"), (1, 32, 8, 40000, 0, "e4m3"),
              (2, 64, 8, 24000, 0, "e4m3"), (6, 28, 4, 10000, 0, "e4m3"),
              (1, 32, 8, 8192, 0, ""), (1, 32, 8, 32768, 0, ""), (1, 28, 4, 12000, 0, ""))


def warps_candidates(p):
    d = ta.DECODE.default_schedule("sm_90", p)
    splits = min(2 * d.splits, max(1, p.seqlen_k // 512))
    forms = {"default": d, "w8 occ1": d.replace(num_worker_warps=8, occupancy=1),
             "w8 occ2": d.replace(num_worker_warps=8, occupancy=2),
             "w8 occ2 x2 splits": d.replace(num_worker_warps=8, occupancy=2, splits=splits)}
    return unique_forms(forms)


def unique_forms(forms):
    """``forms`` without a schedule equal to an earlier one's (each timed once)."""
    unique = {}
    for name, s in forms.items():
        if s not in unique.values():
            unique[name] = s
    return unique


def sweep_candidates(p):
    d = ta.DECODE.default_schedule("sm_90", p)
    out = {"default": d}
    for times in (1, 2, 4, 6):
        splits = min(d.splits * times, max(1, p.seqlen_k // 512))
        out[f"occ2 K4 x{times} splits"] = d.replace(occupancy=2, k_latency=4, splits=splits)
    return out


def check_candidates(p):
    """The e4m3 cache's default and the bf16 rule it replaced (the default of the same
    problem without ``kv_dtype``)."""
    return {"default": ta.DECODE.default_schedule("sm_90", p),
            "bf16 rule": ta.DECODE.default_schedule("sm_90",
                                                    dataclasses.replace(p, kv_dtype=""))}


def pdl_candidates(p):
    d = ta.DECODE.default_schedule("sm_90", p)
    return {"default": d, "block_pdl": d.replace(combine="block_pdl")}


def sweep(copy_gbps, check=False, pdl=False, warps=False):
    if check:
        plans = [(fp8_problem(*pt), None) for pt in CHECK]
        plans = [(p, check_candidates(p)) for p, _ in plans]
    else:
        points = [fp8_problem(*pt) for pt in POINTS] + [fp8_problem(*pt) for pt in CONTIGUOUS]
        if warps:
            points += [dataclasses.replace(fp8_problem(*pt[:5]), kv_dtype=pt[5])
                       for pt in WARPS_MORE]
        candidates = (warps_candidates if warps else pdl_candidates if pdl
                      else sweep_candidates)
        plans = [(p, candidates(p)) for p in points]
    compile_ahead([(p, s) for p, c in plans for s in c.values()])
    for p, cands in plans:
        case = ta.DECODE.case(p, 0)
        fns = {name: case.launcher(s) for name, s in cands.items()}
        errors = {name: case.error(fn) for name, fn in fns.items()}
        seqused = getattr(case, "seqused", None)
        keys = int(seqused.sum()) if seqused is not None else p.batch * p.seqlen_k
        nbytes = keys * p.heads_kv * 128 * 2 * (1 if p.kv_dtype else 2)
        if check:  # the same batch over a bf16 cache, its own default
            plain = ta.DECODE.case(dataclasses.replace(p, kv_dtype=""), 0)
            cands = {**cands, "bf16 cache": ta.DECODE.default_schedule(
                "sm_90", dataclasses.replace(p, kv_dtype=""))}
            fns["bf16 cache"] = plain.launcher(cands["bf16 cache"])
            errors["bf16 cache"] = plain.error(fns["bf16 cache"])
        times = time_interleaved(fns, rounds=15)
        base = times["default"].median_ms
        print(f"== {p.describe()}")
        for name, t in sorted(times.items(), key=lambda kv: kv[1].median_ms):
            share = nbytes / (t.median_ms * 1e-3) / 1e9 / copy_gbps
            if name == "bf16 cache":
                share *= 2  # its bytes are twice the e4m3 cache's
            print(f"  {name:20s} {1e3 * t.median_ms:8.1f} us {base / t.median_ms:5.2f}x "
                  f"{100 * share:5.1f}% of copy err {errors[name]:.1e} "
                  f"{cands[name].describe()}")
        if check:  # the isolated-call view: an idle GPU, the host's time counted
            isolated = time_interleaved(fns, rounds=10, host=True)
            print("  isolated call (host counted): " + ", ".join(
                f"{name} {1e3 * t.median_ms:.1f} us" for name, t in isolated.items()))


def main():
    copy_gbps = copy_rate()
    if {"--sweep", "--check", "--pdl", "--warps"} & set(sys.argv):
        sweep(copy_gbps, check="--check" in sys.argv, pdl="--pdl" in sys.argv,
              warps="--warps" in sys.argv)
        return
    rows = []
    for b, hq, hkv, sk, page in POINTS:
        bf16 = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                          head_dim=128, dtype="bf16", causal=True, bottom_right=True,
                          ragged=True, page_size=page)
        fp8 = dataclasses.replace(bf16, kv_dtype="e4m3")
        fns, errors, nbytes, labels = {}, {}, {}, {}
        for name, p in (("e4m3", fp8), ("bf16", bf16)):
            case = ta.DECODE.case(p, 0)
            schedule = ta.DECODE.default_schedule("sm_90", p)
            fns[name] = case.launcher(schedule)
            errors[name] = case.error(fns[name])
            nbytes[name] = int(case.seqused.sum()) * hkv * 128 * 2 * (1 if p.kv_dtype else 2)
            labels[name] = schedule.describe()
        times = time_interleaved(fns, rounds=15)
        print(f"== {fp8.describe()}")
        for name, t in times.items():
            share = nbytes[name] / (t.median_ms * 1e-3) / 1e9 / copy_gbps
            print(f"  {name:5s} {1e3 * t.median_ms:8.1f} us {100 * share:5.1f}% of copy "
                  f"err {errors[name]:.1e} {labels[name]}")
        ratio = times["bf16"].median_ms / times["e4m3"].median_ms
        rows.append((fp8.describe(), 1e3 * times["e4m3"].median_ms,
                     1e3 * times["bf16"].median_ms, ratio,
                     nbytes["e4m3"] / (times["e4m3"].median_ms * 1e-3) / 1e9 / copy_gbps))
    print("\n| paged decode (mixed lengths) | e4m3 µs | bf16 µs | e4m3 ÷ bf16 speed | e4m3 share "
          "of copy |\n|---|---|---|---|---|")
    for what, f, h, r, share in rows:
        print(f"| {what} | {f:.1f} | {h:.1f} | {r:.2f} | {100 * share:.0f}% |")


if __name__ == "__main__":
    main()
