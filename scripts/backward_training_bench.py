"""Issue 31's training benchmark (GPU): the backward alone and forward + backward, against
torch's cuDNN, flash and efficient backends pinned, on training shapes that are neither in the
tuning grid (``scripts/tune_backward_shipped.py``) nor in the tests.

    python scripts/backward_training_bench.py --out DIR [--rounds 15] [--only N]
    python scripts/backward_training_bench.py --out DIR --from-csv DIR/training.csv   # no GPU

Every contender runs through autograd on the same tensors: ``tiledattention.sdpa`` (the lookup's
schedules) and ``torch.nn.functional.scaled_dot_product_attention`` under ``sdpa_kernel`` with
one backend (grouped heads passed with ``enable_gqa``; a backend that refuses the problem is
reported, not averaged). bwd: ``torch.autograd.grad(out, (q, k, v), dO, retain_graph=True)`` on a
kept graph; fwd+bwd: the forward and that backward. Timed interleaved (``time_interleaved``: the
contenders take turns, L2 flushed before each sample), median of ``--rounds``. Before timing,
each shape checks our gradients against cuDNN's (else flash's) by relative L2 error (at most
2e-2) and that three backward runs give bitwise-identical gradients. Writes ``DIR/training.csv``,
``DIR/training.md`` (per-shape table, geometric means) and ``DIR/training.png`` and prints the
table last; ``--from-csv FILE`` re-renders the table and plot of a recorded run without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from _gpu import require_gpu

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention
from tiledattention import BACKWARD, Problem
from tuner.bench import PlotsUnavailable, new_figure, save_png
from tuner.measure import time_interleaved

#: (B, H_q, H_kv, S_q, S_k, D, mask: "full" | "causal" | "br" (bottom-right), dtype)
SHAPES = (
    (1, 32, 8, 4096, 4096, 128, "causal", "bf16"),  # Llama-3-8B
    (1, 8, 1, 6144, 6144, 128, "causal", "bf16"),  # a 72B model at TP 8: one K/V head a GPU
    (1, 16, 16, 8192, 8192, 128, "full", "bf16"),
    (1, 16, 8, 4096, 4096, 256, "causal", "bf16"),
    (2, 16, 4, 1000, 3000, 128, "br", "bf16"),
    (2, 28, 4, 3072, 3072, 128, "causal", "bf16"),  # Qwen2-7B: groups of 7
    (4, 12, 2, 2048, 2048, 128, "causal", "fp16"),
    (1, 64, 8, 8192, 8192, 128, "causal", "bf16"),  # Llama-3-70B
    (8, 32, 32, 1024, 1024, 64, "full", "fp16"),
    (2, 8, 1, 4096, 4096, 256, "causal", "bf16"),  # Gemma-2B-like multi-query, D 256
    (1, 32, 32, 3000, 3000, 96, "causal", "fp16"),  # Phi-3-like, odd length
    (1, 16, 1, 12288, 12288, 64, "causal", "bf16"),
    (4, 32, 8, 2048, 2048, 128, "full", "bf16"),
    (2, 32, 4, 1536, 4608, 128, "br", "fp16"),
    (1, 40, 8, 5120, 5120, 128, "causal", "bf16"),  # groups of 5
    (16, 16, 16, 1024, 1024, 64, "causal", "bf16"),
    (1, 8, 8, 16384, 16384, 128, "causal", "bf16"),
    (2, 16, 2, 2048, 2048, 256, "full", "fp16"),
)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BACKENDS = {"torch-cudnn": SDPBackend.CUDNN_ATTENTION, "torch-flash": SDPBackend.FLASH_ATTENTION,
            "torch-efficient": SDPBackend.EFFICIENT_ATTENTION}
OURS = "tiledattention"


def problem_of(shape: tuple) -> Problem:
    b, hq, hkv, sq, sk, d, mask, dtype = shape
    return Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                   dtype=dtype, causal=mask != "full", bottom_right=mask == "br")


def forward_of(name: str, shape: tuple):
    """``f(q, k, v) -> out`` for contender ``name``."""
    b, hq, hkv, sq, sk, d, mask, dtype = shape
    causal = {"full": False, "causal": True, "br": "bottom_right"}[mask]
    if name == OURS:
        return lambda q, k, v: tiledattention.sdpa(q, k, v, causal)
    kwargs = {"enable_gqa": hq != hkv}
    if mask == "br":
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(sq, sk)
    else:
        kwargs["is_causal"] = mask == "causal"

    def run(q, k, v):
        with sdpa_kernel(BACKENDS[name]):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
    return run


def measure(shape: tuple, rounds: int) -> list[dict]:
    b, hq, hkv, sq, sk, d, mask, dtype = shape
    problem = problem_of(shape)
    gen = torch.Generator(device="cuda").manual_seed(sq + 7 * hkv + d)
    def make(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=DTYPES[dtype], generator=gen)

    q, k, v = (make(b, h, s, d).requires_grad_() for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))
    grad_out = make(b, hq, sq, d)
    leaves = (q, k, v)
    records, bwd, step, grads = [], {}, {}, {}
    for name in (OURS, *BACKENDS):
        f = forward_of(name, shape)
        try:
            out = f(*leaves)
            grads[name] = torch.autograd.grad(out, leaves, grad_out, retain_graph=True)
            torch.cuda.synchronize()
        except RuntimeError as exc:  # the backend refuses the problem
            records.append(dict(contender=name, status=str(exc).splitlines()[0][:80]))
            continue
        bwd[name] = (lambda out=out: torch.autograd.grad(out, leaves, grad_out,
                                                         retain_graph=True))
        step[name] = (lambda f=f: torch.autograd.grad(f(*leaves), leaves, grad_out))
    check = {}
    against = next((n for n in ("torch-cudnn", "torch-flash") if n in grads), None)
    if against is not None:
        check["vs"] = against
        check["rel_l2"] = max((torch.linalg.vector_norm(a.float() - r.float())
                               / torch.linalg.vector_norm(r.float())).item()
                              for a, r in zip(grads[OURS], grads[against]))
    again = [bwd[OURS]() for _ in range(2)]
    check["bitwise"] = all(torch.equal(x, y) for run in again for x, y in zip(run, grads[OURS]))
    flops = BACKWARD.flops(problem)
    for phase, fns, count in (("bwd", bwd, flops), ("fwd+bwd", step, flops * 3.5 / 2.5)):
        timed = time_interleaved(fns, rounds=rounds)
        for name, t in timed.items():
            records.append(dict(contender=name, phase=phase, status="ok", ms=t.median_ms,
                                tflops=count / t.median_ms / 1e9))
    found = tiledattention.runtime().resolution(BACKWARD, problem, q.device.index)
    for r in records:
        r.update(point=problem.describe(), **check)
        if r["contender"] == OURS:
            r.update(schedule=found.schedule.describe(), source=found.source)
    return records


def table(records: list[dict]) -> list[str]:
    """Markdown: per shape and phase, our TFLOP/s and time ratios (theirs / ours)."""
    lines = ["| shape | phase | tiledattention TFLOP/s | ÷ cuDNN | ÷ flash | ÷ efficient | "
             "grad rel L2 | bitwise |", "|---|---|---|---|---|---|---|---|"]
    ratios: dict[tuple, list[float]] = {}
    points = list(dict.fromkeys(r["point"] for r in records))
    for point in points:
        for phase in ("bwd", "fwd+bwd"):
            at = {r["contender"]: r for r in records
                  if r["point"] == point and r.get("phase") == phase and r["status"] == "ok"}
            if OURS not in at:
                continue
            ours = at[OURS]
            cells = []
            for name in BACKENDS:
                if name in at:
                    x = at[name]["ms"] / ours["ms"]
                    ratios.setdefault((phase, name), []).append(x)
                    cells.append(f"{x:.2f}")
                else:
                    cells.append("n/a")
            lines.append(f"| {point} | {phase} | {ours['tflops']:.0f} | " + " | ".join(cells)
                         + f" | {ours.get('rel_l2', float('nan')):.1e} | {ours['bitwise']} |")
    lines += ["", "| phase | ÷ cuDNN | ÷ flash | ÷ efficient |", "|---|---|---|---|"]
    for phase in ("bwd", "fwd+bwd"):
        cells = []
        for name in BACKENDS:
            xs = ratios.get((phase, name), [])
            cells.append(f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f} "
                         f"(min {min(xs):.2f}, {len(xs)} shapes)" if xs else "n/a")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    return lines


def plot(records: list[dict], path: Path) -> None:
    """Bars: the backward's speed over cuDNN's and flash's per shape (a small palette PNG)."""
    at = {(r["point"], r["contender"]): float(r["ms"]) for r in records
          if r.get("phase") == "bwd" and r["status"] == "ok"}
    points = list(dict.fromkeys(r["point"] for r in records))
    fig = new_figure(figsize=(7, 4.4), layout="constrained")
    ax = fig.subplots()
    for i, (name, color) in enumerate((("torch-cudnn", "#4c72b0"), ("torch-flash", "#dd8452"))):
        ys = [at[(p, name)] / at[(p, OURS)] if (p, name) in at else 0 for p in points]
        ax.barh([j + 0.4 * i for j in range(len(points))], ys, height=0.4, color=color,
                label=f"÷ {name} (> 1: tiledattention faster)")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks([j + 0.2 for j in range(len(points))], points, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("backward time of torch's backend / tiledattention's", fontsize=8)
    fig.legend(fontsize=7, loc="outside lower center", ncol=2)
    save_png(fig, path, palette=True)


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for key in ("ms", "tflops", "rel_l2"):
            if r.get(key):
                r[key] = float(r[key])
        r["bitwise"] = r.get("bitwise") == "True"
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", type=int, default=None)
    parser.add_argument("--from-csv", type=Path, default=None,
                        help="no GPU: re-render DIR/<stem>.md and .png from this CSV")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_csv is not None:
        records = _read_csv(args.from_csv)
        stem = args.from_csv.stem
        (args.out / f"{stem}.md").write_text("\n".join(table(records)) + "\n")
        plot(records, args.out / f"{stem}.png")
        return 0
    require_gpu()
    records: list[dict] = []
    for shape in SHAPES[:args.only]:
        records += measure(shape, args.rounds)
        torch.cuda.empty_cache()
        print(f"done {problem_of(shape).describe()}", flush=True)
        fields = sorted({key for r in records for key in r})
        with open(args.out / "training.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fields)
            writer.writeheader()
            writer.writerows(records)
    lines = table(records)
    (args.out / "training.md").write_text("\n".join(lines) + "\n")
    try:
        plot(records, args.out / "training.png")
    except PlotsUnavailable as exc:
        print(f"no plot: {exc}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
