"""Random problems compiled for every architecture on the CPU (no GPU): does the schedule a call
would get without a shipped row (the family's architecture default) compile, for the kernels
the call may launch (``Family.compile_launchable``), on sm_80, sm_90, sm_100, sm_120 and
sm_121? The GPU conformance test (``tests/gpu/test_conformance_gpu.py``) runs such draws on
Hopper; Blackwell's calls can only be compiled here. Each draw varies batch, grouping, head
dim, dtype, lengths, masks, windows, softcap, sinks, FP8 caches and pages; for a draw that
needs gradients the backward's default too. Prints one line per failure and a count.

    python docs/records/probes/compile_draws.py [--draws N] [--seed S] [--arch sm_120 ...]
"""

import argparse
import dataclasses
import random
import time

import tiledattention as ta
from tiledattention import BACKWARD, Problem
from tiledattention.core._dispatch import choose_family

HEAD_DIMS = (32, 40, 64, 72, 80, 96, 128, 160, 192, 256)
ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120", "sm_121")


def draw(rng):
    group = rng.choice((1, 2, 3, 4, 7, 8))
    hkv = rng.choice((1, 2, 4, 8))
    sq = rng.choice((1, 1, 2, 4, rng.randint(5, 64), rng.randint(65, 9000)))
    sk = rng.randint(max(1, sq if rng.random() < 0.5 else 1), 70000)
    causal = rng.random() < 0.6
    window = (-1, -1)
    if rng.random() < 0.3:
        window = (rng.randint(0, 4000), 0 if causal else rng.choice((-1, rng.randint(0, 300))))
    paged = sq <= 256 and rng.random() < 0.25
    fields = dict(batch=rng.randint(1, 64), heads_q=hkv * group, heads_kv=hkv, seqlen_q=sq,
                  seqlen_k=sk, head_dim=rng.choice(HEAD_DIMS), dtype=rng.choice(("bf16", "fp16")),
                  causal=causal, bottom_right=(paged and (causal or window != (-1, -1)))
                  or (causal and rng.random() < 0.5),
                  window_left=window[0], window_right=window[1],
                  softcap=round(rng.uniform(5, 50), 1) if rng.random() < 0.2 else 0.0,
                  sinks=rng.random() < 0.2)
    while fields["batch"] * hkv * max(sq, sk) * 256 >= 2 ** 31:  # the int32 index bound
        fields["batch"] = max(1, fields["batch"] // 2)
        sk = fields["seqlen_k"] = max(1, sk // 2) if fields["batch"] == 1 else sk
    if paged:
        fields.update(ragged=True, page_size=rng.choice((16, 32, 64, 128, 256)))
    if sq <= 8 and rng.random() < 0.2:
        fields["kv_dtype"] = "e4m3"
    problem = Problem(**fields)
    training = (not paged and "kv_dtype" not in fields and rng.random() < 0.3)
    return problem, training


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arch", action="append")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    failures = builds = 0
    for i in range(args.draws):
        problem, training = draw(rng)
        for arch in args.arch or ARCHS:
            if problem.kv_dtype and arch == "sm_80":
                continue  # FP8 needs sm_89 and later: refused by design
            jobs = []
            try:
                family = choose_family(arch, problem, "sdpa_with_lse" if training else "sdpa")
                jobs.append((family, problem))
                if training:
                    jobs.append((BACKWARD, problem))
                for fam, p in jobs:
                    start = time.time()
                    fam.compile_launchable(p, fam.default_schedule(arch, p), arch)
                    builds += 1
                    print(f"ok   {i:3d} {arch} {fam.name:8s} {time.time() - start:5.1f}s "
                          f"{p.describe()}", flush=True)
            except ta.TiledAttentionError as exc:
                failures += 1
                print(f"FAIL {i:3d} {arch} {problem.describe()} training={training}: "
                      f"{type(exc).__name__}: {str(exc)[:300]}", flush=True)
    print(f"{builds} builds, {failures} failures")


if __name__ == "__main__":
    main()
