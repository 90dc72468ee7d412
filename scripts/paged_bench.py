"""Issue 34's paged-cache benchmark (GPU): attention over a paged K/V cache against the same
lengths in contiguous caches and against what a serving user has instead. H 32/8, D 128, bf16.

    python scripts/paged_bench.py --out DIR [--rounds 15] [--only NAME]

Points (``POINTS``):
- ``decode-B*-S*``: a decode step (one query per entry) over caches of one length, paged at
  16, 64, 128 and 256 tokens a page (shuffled pages) and contiguous
  (``tiledattention.sdpa(q, k, v, "bottom_right")`` on ``[B, H_kv, S, D]`` caches);
- ``continuous-B*``: a continuous-batching decode step, cache lengths drawn from 100 to 32k,
  paged at 64, against the device copy rate on its valid bytes (read plus written, the
  ceiling), torch's cuDNN backend on the batch padded to its longest cache with a boolean
  key-padding mask, and torch's ``varlen_attn`` with a block table where the installed torch
  has one;
- ``chunk-*``: chunked prefill, a chunk of queries (bottom-right causal) over a cache that
  already holds earlier chunks, paged at 16 to 256 (read in place where a page holds a whole
  key tile, else gathered) and contiguous (``sdpa(..., "bottom_right")``).
Every contender is checked against the float32 reference over the gathered caches first.
Timed interleaved (``time_interleaved``, L2 flushed before each sample), median of
``--rounds``. GB/s count the valid K/V bytes read once. Writes ``DIR/paged.csv``,
``DIR/paged.md`` and ``DIR/paged.png``, and prints the table last.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from _study import run_points
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention
from tuner.measure import time_interleaved

HQ, HKV, D = 32, 8, 128
DTYPE = torch.bfloat16
PAGES = (16, 64, 128, 256)
#: name, batch, cache lengths ("uniform": S for all; "draw": 100..32k), query rows
POINTS = (
    ("decode-B1-S32768", 1, 32768, 1),
    ("decode-B8-S8192", 8, 8192, 1),
    ("decode-B32-S4096", 32, 4096, 1),
    ("decode-B64-S2048", 64, 2048, 1),
    ("continuous-B64", 64, "draw", 1),
    ("continuous-B16", 16, "draw", 1),
    ("chunk-B4-S16384-q512", 4, 16384, 512),
    ("chunk-B1-S4096-q1024", 1, 4096, 1024),
    ("chunk-B2-S32768-q2048", 2, 32768, 2048),
)


def lengths_of(batch: int, spec, seed: int = 0) -> list[int]:
    if spec == "draw":
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(100, 32769, (batch,), generator=gen).tolist()
    return [spec] * batch


def paged(caches, page: int, seed: int = 0):
    """Pools and block table holding ``caches`` (per entry ``(k, v)``, ``[L, H_kv, D]``) in
    shuffled pages."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    need = [-(-k.shape[0] // page) for k, _ in caches]
    order = torch.randperm(sum(need), generator=gen, device="cuda").int()
    k_pages = torch.zeros(sum(need), page, HKV, D, dtype=DTYPE, device="cuda")
    v_pages = torch.zeros_like(k_pages)
    table = torch.zeros(len(caches), max(need), dtype=torch.int32, device="cuda")
    used = 0
    for b, ((k, v), n) in enumerate(zip(caches, need)):
        ids = order[used:used + n].long()
        used += n
        table[b, :n] = ids.int()
        pad = n * page - k.shape[0]
        k_pages[ids] = F.pad(k, (0, 0, 0, 0, 0, pad)).view(n, page, HKV, D)
        v_pages[ids] = F.pad(v, (0, 0, 0, 0, 0, pad)).view(n, page, HKV, D)
    return k_pages, v_pages, table


def reference(q, caches):
    out = torch.empty(q.shape, dtype=torch.float32, device="cuda")
    sq = q.shape[2]
    for b, (k, v) in enumerate(caches):
        n = k.shape[0]
        kk = k.float().transpose(0, 1).repeat_interleave(HQ // HKV, 0)
        vv = v.float().transpose(0, 1).repeat_interleave(HQ // HKV, 0)
        keep = (torch.arange(n, device="cuda")[None, :]
                <= torch.arange(sq, device="cuda")[:, None] + n - sq)
        out[b] = F.scaled_dot_product_attention(q[b].float(), kk, vv, attn_mask=keep)
    return out


def rel_l2(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def torch_paged_varlen():
    """torch's ``varlen_attn`` where it takes a block table, else ``None``."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    return varlen_attn if "block_table" in params else None


def contenders(lens, sq, q, caches):
    """name -> (f(), K/V bytes it must read at least)."""
    valid = sum(lens) * HKV * D * 2 * 2
    longest = max(lens)
    fns = {}
    pages = PAGES if len(set(lens)) == 1 else (64,)
    for page in pages:
        k_pages, v_pages, table = paged(caches, page)
        used = torch.tensor(lens, dtype=torch.int32, device="cuda")
        fns[f"paged-{page}"] = (lambda k_pages=k_pages, v_pages=v_pages, table=table, used=used:
                                tiledattention.paged_attention(q, k_pages, v_pages, table, used,
                                                               max_k=longest))
        if page == 64:
            varlen = torch_paged_varlen()
            if varlen is not None:
                flat = q.transpose(1, 2).reshape(-1, HQ, D)
                cu = torch.arange(0, flat.shape[0] + 1, sq, dtype=torch.int32, device="cuda")

                def theirs(k_pages=k_pages, v_pages=v_pages, table=table, used=used,
                           flat=flat, cu=cu):
                    out = varlen(flat, k_pages, v_pages, cu, None, sq, longest,
                                 window_size=(-1, 0), enable_gqa=True, seqused_k=used,
                                 block_table=table)
                    return out.view(len(lens), sq, HQ, D).transpose(1, 2)
                fns["torch-varlen-paged"] = theirs
    if len(set(lens)) == 1:  # one length: the contiguous caches
        k = torch.stack([c[0] for c in caches]).transpose(1, 2)
        v = torch.stack([c[1] for c in caches]).transpose(1, 2)
        fns["contiguous"] = lambda: tiledattention.sdpa(q, k, v, "bottom_right")
    else:  # the batch padded to its longest cache, a boolean key-padding mask
        kp = torch.zeros(len(lens), HKV, longest, D, dtype=DTYPE, device="cuda")
        vp = torch.zeros_like(kp)
        for b, (k, v) in enumerate(caches):
            kp[b, :, :k.shape[0]] = k.transpose(0, 1)
            vp[b, :, :v.shape[0]] = v.transpose(0, 1)
        mask = (torch.arange(longest, device="cuda")[None, :]
                < torch.tensor(lens, device="cuda")[:, None])[:, None, None, :]

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, kp, vp, attn_mask=mask,
                                                      enable_gqa=True)
        fns["cudnn-padded"] = cudnn
        src = torch.empty(valid // 2, dtype=DTYPE, device="cuda")
        dst = torch.empty_like(src)
        fns["copy-valid-bytes"] = lambda: dst.copy_(src)
    return fns, valid


def measure(point: tuple, rounds: int) -> list[dict]:
    name, batch, spec, sq = point
    lens = lengths_of(batch, spec)
    gen = torch.Generator(device="cuda").manual_seed(1)
    caches = [(torch.randn(n, HKV, D, generator=gen, dtype=DTYPE, device="cuda"),
               torch.randn(n, HKV, D, generator=gen, dtype=DTYPE, device="cuda")) for n in lens]
    q = torch.randn(batch, HQ, sq, D, generator=gen, dtype=DTYPE, device="cuda")
    want = reference(q, caches)
    fns, valid = contenders(lens, sq, q, caches)
    records, timed = [], {}
    with torch.no_grad():
        for who, f in fns.items():
            rec = dict(point=name, contender=who, batch=batch, query_rows=sq,
                       longest=max(lens), mean=round(sum(lens) / len(lens)))
            try:
                if who != "copy-valid-bytes":
                    rec["rel_l2"] = rel_l2(f(), want)
                timed[who] = f
                rec["status"] = "ok"
            except Exception as exc:  # a contender that cannot run the point
                rec["status"] = f"{type(exc).__name__}: {exc}"[:160]
            records.append(rec)
        times = time_interleaved(timed, rounds=rounds)
    for rec in records:
        t = times.get(rec["contender"])
        if t is None or isinstance(t, str):
            continue
        rec["us"] = t.median_ms * 1e3
        if rec["contender"] == "copy-valid-bytes":  # read + written
            rec["gbps"] = 2 * valid / (t.median_ms * 1e-3) / 1e9
        else:
            rec["gbps"] = valid / (t.median_ms * 1e-3) / 1e9
    return records


def table(records: list[dict]) -> list[str]:
    lines = ["| point | contender | µs | GB/s (valid K/V read) | vs paged-64 (time ÷) | rel L2 |",
             "|---|---|---|---|---|---|"]
    for point in dict.fromkeys(r["point"] for r in records):
        rows = [r for r in records if r["point"] == point]
        base = next((r for r in rows if r["contender"] == "paged-64" and "us" in r), None)
        for r in rows:
            if "us" not in r:
                lines.append(f"| {point} | {r['contender']} | {r['status']} | | | |")
                continue
            ratio = f"{r['us'] / base['us']:.2f}" if base else ""
            err = f"{r['rel_l2']:.1e}" if "rel_l2" in r else ""
            lines.append(f"| {point} | {r['contender']} | {r['us']:.1f} | {r['gbps']:.0f} | "
                         f"{ratio} | {err} |")
    return lines


def plot(records: list[dict], out: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    points = [p for p in dict.fromkeys(r["point"] for r in records)]
    names = sorted({r["contender"] for r in records if "gbps" in r})
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=80)
    width = 0.8 / max(len(names), 1)
    for i, who in enumerate(names):
        values = [next((r["gbps"] for r in records if r["point"] == p and r["contender"] == who
                        and "gbps" in r), 0.0) for p in points]
        ax.bar([x + i * width for x in range(len(points))], values, width, label=who)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(points))], points, rotation=20,
                  fontsize=7)
    ax.set_ylabel("GB/s of valid K/V read")
    ax.legend(fontsize=6, ncol=3)
    fig.tight_layout()
    fig.savefig(out / "paged.png")
    plt.close(fig)
    try:  # a small palette PNG
        from PIL import Image
        Image.open(out / "paged.png").convert("P", palette=Image.ADAPTIVE, colors=64).save(
            out / "paged.png", optimize=True)
    except ImportError:
        pass


def write(records: list[dict], out: Path) -> str:
    fields = sorted({key for r in records for key in r})
    with open(out / "paged.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(records)
    text = "\n".join(table(records)) + "\n"
    (out / "paged.md").write_text(text)
    plot(records, out)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", action="append", default=[])
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    text = run_points(POINTS, args.only, lambda point: measure(point, args.rounds),
                      lambda point, why: dict(point=point[0], contender="paged-64", status=why),
                      write, args.out)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
