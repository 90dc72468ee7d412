"""Issue 33's ragged-batch benchmark (GPU): packed variable-length sequences, forward and
backward, against what a user has instead.

    python scripts/varlen_bench.py --out DIR [--rounds 10] [--only NAME]

Batches (``BATCHES``): a fixed token count split into sequences whose lengths are drawn from a
skewed distribution (a few long sequences among many short ones) or a uniform one, H 32/8,
D 128, bf16, causal (each sequence attends to itself). Contenders, on the same tokens:
- ``tiledattention``: ``tiledattention.varlen_attn`` on the packed batch;
- ``torch-varlen``: ``torch.nn.attention.varlen.varlen_attn`` (where the installed torch has it;
  K/V heads repeated where it takes no grouped heads);
- ``cudnn-padded``, ``efficient-padded``: ``F.scaled_dot_product_attention`` on the batch padded
  to its longest sequence, with the padding and causal mask as a boolean ``attn_mask`` (what a
  padded batch costs; cuDNN's backend where it takes the mask);
- ``flash-loop``: torch's flash backend called once per sequence;
- ``rectangle``: ``tiledattention.sdpa`` on a rectangular batch of the mean length and the same
  token count (the yardstick of the issue's 0.9x bar).
Forward: one call; backward: ``torch.autograd.grad`` on a kept graph. Timed interleaved
(``time_interleaved``, L2 flushed before each sample), median of ``--rounds``. TFLOP/s count the
valid tokens' causal work only: ``sum_i 2 * H * D * L_i * (L_i + 1)`` per forward (2.5x that for
the backward). Every contender's output (and our gradients) is checked against the per-sequence
float32 reference first. Writes ``DIR/varlen.csv``, ``DIR/varlen.md`` and ``DIR/varlen.png``
and prints the table last.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from _study import run_points
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention
from tiledattention.tooling import varlen_reference
from tuner.measure import time_interleaved

HQ, HKV, D = 32, 8, 128
#: name, total tokens, distribution, seed
BATCHES = (
    ("skewed-16k", 16384, "skewed", 0),
    ("skewed-32k", 32768, "skewed", 1),
    ("skewed-64k", 65536, "skewed", 2),
    ("uniform-16k", 16384, "uniform", 3),
    ("uniform-32k", 32768, "uniform", 4),
    ("one-long-32k", 32768, "one-long", 5),
    ("equal-1024-32k", 32768, "equal", 6),  # the rectangle itself, packed: the ragged overhead
)
OURS = "tiledattention"
#: the padded contenders' boolean mask holds B * S^2 bytes: batches beyond this leave them out
MASK_LIMIT = 1 << 31


def lengths_of(total: int, kind: str, seed: int) -> list[int]:
    """Sequence lengths adding up to ``total``: ``skewed`` (log-normal, median ~600, a long
    tail), ``uniform`` (100 to 2000), ``one-long`` (one sequence of half the tokens, the rest
    of 200 to 1200), ``equal`` (all 1024: the rectangle packed, which isolates what the ragged
    path costs)."""
    gen = torch.Generator().manual_seed(seed)
    lens: list[int] = []
    if kind == "equal":
        return [1024] * (total // 1024)
    if kind == "one-long":
        lens.append(total // 2)
    while sum(lens) < total:
        if kind == "skewed":
            n = int(math.exp(6.4 + 1.1 * torch.randn(1, generator=gen).item()))
        elif kind == "uniform":
            n = int(torch.randint(100, 2001, (1,), generator=gen))
        else:
            n = int(torch.randint(200, 1201, (1,), generator=gen))
        lens.append(max(1, min(n, total - sum(lens), 16384)))
    return lens


def causal_flops(lens: list[int]) -> float:
    return sum(2.0 * HQ * D * n * (n + 1) for n in lens)


def torch_varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, {}
    params = inspect.signature(varlen_attn).parameters
    kwargs = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    if "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    return varlen_attn, kwargs


def contenders(lens, q, k, v, cu, longest):
    """name -> f(q, k, v) on the packed tensors (padding and loops inside, untimed setup
    outside)."""
    found = {OURS: lambda q, k, v: tiledattention.varlen_attn(
        q, k, v, cu, cu, longest, longest, is_causal=True, enable_gqa=True)}
    theirs, kwargs = torch_varlen()
    if theirs is not None:
        group = 1 if "enable_gqa" in kwargs else HQ // HKV
        found["torch-varlen"] = lambda q, k, v: theirs(
            q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), cu, cu, longest,
            longest, **kwargs)
    b = len(lens)
    starts = cu[:-1].tolist()
    pos = torch.arange(longest, device="cuda")
    valid = pos[None, :] < torch.tensor(lens, device="cuda")[:, None]  # [B, S]
    mask = None
    if b * longest * longest <= MASK_LIMIT:
        mask = (valid[:, None, :, None] & valid[:, None, None, :]
                & (pos[None, None, None, :] <= pos[None, None, :, None]))
    index = torch.cat([torch.arange(s, s + n, device="cuda") for s, n in zip(starts, lens)])
    flat = torch.cat([torch.arange(i * longest, i * longest + n, device="cuda")
                      for i, n in enumerate(lens)])

    def pad(x):
        out = x.new_zeros(b * longest, x.shape[1], D)
        out = out.index_copy(0, flat, x[index])
        return out.view(b, longest, x.shape[1], D).transpose(1, 2)

    def padded(backend):
        # the efficient backend takes no grouped heads with a mask: K/V heads repeated, as
        # transformers' SDPA path does (repeat_kv)
        group = HQ // HKV if backend == SDPBackend.EFFICIENT_ATTENTION else 1

        def run(q, k, v):
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(
                    pad(q), pad(k).repeat_interleave(group, 1),
                    pad(v).repeat_interleave(group, 1), attn_mask=mask, enable_gqa=group == 1)
            return out.transpose(1, 2).reshape(b * longest, HQ, D)[flat]
        return run
    if b * longest * longest <= MASK_LIMIT:  # else the boolean mask alone would not fit
        found["cudnn-padded"] = padded(SDPBackend.CUDNN_ATTENTION)
        found["efficient-padded"] = padded(SDPBackend.EFFICIENT_ATTENTION)

    def loop(q, k, v):
        outs = []
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for s, n in zip(starts, lens):
                outs.append(F.scaled_dot_product_attention(
                    q[s:s + n].transpose(0, 1)[None], k[s:s + n].transpose(0, 1)[None],
                    v[s:s + n].transpose(0, 1)[None], is_causal=True, enable_gqa=True)[0])
        return torch.cat([o.transpose(0, 1) for o in outs])
    found["flash-loop"] = loop
    return found


def rel_l2(a, b) -> float:
    a = a.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


def measure(batch: tuple, rounds: int) -> list[dict]:
    name, total, kind, seed = batch
    lens = lengths_of(total, kind, seed)
    longest = max(lens)
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda h: torch.randn(total, h, D, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                                 generator=gen)
    q, k, v = make(HQ), make(HKV), make(HKV)
    grad_out = make(HQ)
    flops = causal_flops(lens)
    fns = contenders(lens, q, k, v, cu, longest)
    # the rectangle: the same tokens as B sequences of the mean length
    mean = max(1, round(total / len(lens)))
    rb = max(1, total // mean)
    rq = torch.randn(rb, HQ, mean, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    rk = torch.randn(rb, HKV, mean, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    rect_flops = rb * 2.0 * HQ * D * mean * (mean + 1)
    records = []
    leaves = [x.requires_grad_() for x in (q, k, v)]
    with torch.no_grad():
        want = varlen_reference(q, k, v, cu, cu, causal=True)
    # gradients by autograd through the reference up to 32k tokens (beyond, its saved scores
    # outgrow the memory left)
    ref = varlen_reference(*leaves, cu, cu, causal=True) if total <= 32768 else None
    want_grads = (torch.autograd.grad(ref, leaves, grad_out.float()) if ref is not None
                  else None)
    del ref
    fwd, bwd = {}, {}
    for who, f in fns.items():
        rec = dict(batch=name, contender=who, sequences=len(lens), longest=longest,
                   tokens=total)
        try:
            with torch.no_grad():
                rec["rel_l2"] = rel_l2(f(q, k, v), want)
            fwd[who] = (lambda f=f: f(q, k, v))
            out = f(*leaves)
            if who in (OURS, "torch-varlen", "cudnn-padded", "flash-loop"):
                grads = torch.autograd.grad(out, leaves, grad_out, retain_graph=True)
                if want_grads is not None:
                    rec["grad_rel_l2"] = max(rel_l2(g, w) for g, w in zip(grads, want_grads))
                bwd[who] = (lambda out=out: torch.autograd.grad(out, leaves, grad_out,
                                                                retain_graph=True))
            rec["status"] = "ok"
        except Exception as exc:  # a contender that cannot run the batch
            rec["status"] = f"{type(exc).__name__}: {exc}"[:120]
        records.append(rec)
    fwd["rectangle"] = lambda: tiledattention.sdpa(rq, rk, rk, True)
    records.append(dict(batch=name, contender="rectangle", sequences=rb, longest=mean,
                        tokens=rb * mean, status="ok"))
    for phase, fns_, scale in (("fwd", fwd, 1.0), ("bwd", bwd, 2.5)):
        times = time_interleaved(fns_, rounds=rounds)
        for r in records:
            t = times.get(r["contender"])
            if t is None or isinstance(t, str):
                continue
            work = rect_flops if r["contender"] == "rectangle" else flops
            r[f"{phase}_ms"] = t.median_ms
            r[f"{phase}_tflops"] = scale * work / (t.median_ms * 1e-3) / 1e12
    return records


def table(records: list[dict]) -> list[str]:
    lines = ["| batch | phase | tiledattention TFLOP/s | ÷ torch-varlen | ÷ cudnn-padded | "
             "÷ efficient-padded | ÷ flash-loop | ÷ rectangle (TFLOP/s) |",
             "|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {}
    for batch in dict.fromkeys(r["batch"] for r in records):
        rows = {r["contender"]: r for r in records if r["batch"] == batch}
        ours = rows.get(OURS, {})
        for phase in ("fwd", "bwd"):
            if f"{phase}_ms" not in ours:
                continue
            cells = []
            for other in ("torch-varlen", "cudnn-padded", "efficient-padded", "flash-loop"):
                t = rows.get(other, {}).get(f"{phase}_ms")
                if t is None:
                    cells.append("n/a")
                    continue
                ratio = t / ours[f"{phase}_ms"]
                ratios.setdefault(f"{phase} ÷ {other}", []).append(ratio)
                cells.append(f"{ratio:.2f}")
            rect = rows.get("rectangle", {}).get(f"{phase}_tflops")
            if rect:
                share = ours[f"{phase}_tflops"] / rect
                ratios.setdefault(f"{phase} ÷ rectangle", []).append(share)
                cells.append(f"{share:.2f}")
            else:
                cells.append("")
            lines.append(f"| {batch} ({ours['sequences']} seqs, longest {ours['longest']}) | "
                         f"{phase} | {ours[f'{phase}_tflops']:.0f} | {' | '.join(cells)} |")
    lines += ["", "| ratio | geometric mean | min | batches |", "|---|---|---|---|"]
    for key, values in ratios.items():
        geo = math.exp(sum(map(math.log, values)) / len(values))
        lines.append(f"| {key} | {geo:.3f} | {min(values):.2f} | {len(values)} |")
    return lines


def plot(records: list[dict], out: Path) -> None:
    """``out/varlen.png``: each batch's forward and backward TFLOP/s (valid tokens) per
    contender, a small palette PNG."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from PIL import Image
    except ImportError:
        return
    batches = list(dict.fromkeys(r["batch"] for r in records))
    names = [n for n in (OURS, "torch-varlen", "cudnn-padded", "flash-loop", "rectangle")
             if any(r["contender"] == n for r in records)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), dpi=80, sharey=True)
    width = 0.8 / len(names)
    for ax, phase in zip(axes, ("fwd", "bwd")):
        for i, who in enumerate(names):
            values = [next((float(r[f"{phase}_tflops"]) for r in records
                            if r["batch"] == b and r["contender"] == who
                            and r.get(f"{phase}_tflops") not in (None, "")), 0.0)
                      for b in batches]
            ax.bar([x + i * width for x in range(len(batches))], values, width, label=who)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(batches))], batches,
                      rotation=25, fontsize=7)
        ax.set_title(f"{phase} (TFLOP/s on valid tokens)", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "varlen.png")
    plt.close(fig)
    Image.open(out / "varlen.png").convert("P", palette=Image.ADAPTIVE, colors=64).save(
        out / "varlen.png", optimize=True)


def write(records: list[dict], out: Path) -> str:
    fields = sorted({key for r in records for key in r})
    with open(out / "varlen.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(records)
    failed = [f"- {r['batch']} {r['contender']}: {r['status']}" for r in records
              if r.get("status") != "ok"]
    errors = [f"- {r['batch']} {r['contender']}: rel L2 {r['rel_l2']:.1e}"
              + (f", gradients {r['grad_rel_l2']:.1e}" if "grad_rel_l2" in r else "")
              for r in records if r.get("status") == "ok" and "rel_l2" in r]
    text = "\n".join(table(records) + [""] + errors + ([""] + failed if failed else [])) + "\n"
    (out / "varlen.md").write_text(text)
    plot(records, out)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--only", action="append", default=[])
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    text = run_points(BATCHES, args.only, lambda batch: measure(batch, args.rounds),
                      lambda batch, why: dict(batch=batch[0], contender=OURS, status=why),
                      write, args.out)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
