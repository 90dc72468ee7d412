"""Chunked prefill over small pages (issue 49): the forward reading pages of 16-64 keys in place,
a key tile's pages gathered by one load (``PAGE_GATHER``: one TMA load a page), against the
route before it (the pages copied into a contiguous cache, then the ragged forward) and the
contiguous call (``sdpa(q, k, v, "bottom_right")`` on the same keys), interleaved, the L2
flushed before each sample, medians.

    git checkout f85b502 && source .devtk/setup.sh && \
        python3 docs/records/probes/chunked_pages.py [--rounds 15]

It ran at f85b502, whose forward kernel had ``PAGE_GATHER`` (reverted next: the kernel has no
such constant since; ``docs/records/benchmarks/paged/issue49/README.md``, section 11).

Each point: a chunk of queries at the end of each entry's keys (bottom-right causal), entries'
key counts equal or mixed; pages shuffled in the pool. Contenders (each checked against the
float32 reference first):
- ``copy``: the pages gathered into a contiguous cache, then the ragged forward (the route for
  pages smaller than the key tile before PAGE_GATHER);
- ``g64``: in place, 64-row query tiles (no cluster: a cluster's kernel with gathered pages
  compiles to 100k+ instructions on sm_90), each 128-key tile's pages by one gathered load;
- ``n64`` (pages of 64): in place, 64-key tiles (one page a tile, no gather), the default's
  other fields;
- ``route``: ``paged_attention`` as the package routes it now;
- ``contig``: the contiguous call.
"""

import argparse

import torch

import tiledattention as ta
from tiledattention.core._runtime import runtime
from tiledattention.entry_points import _paged
from tuner.measure import time_interleaved

#: (batch, heads_q, heads_kv, keys per entry (a list: mixed), chunk queries, head dim)
POINTS = (
    (4, 32, 8, [16384] * 4, 512, 128),
    (1, 32, 8, [4096], 1024, 128),
    (2, 32, 8, [32768] * 2, 2048, 128),
    (3, 28, 4, [9001, 5000, 12003], 700, 128),
    (2, 40, 8, [12000, 7777], 1536, 128),
    (1, 32, 8, [8192], 2048, 64),
    (2, 8, 1, [6000, 3000], 333, 128),
)


def pools(caches, page, hkv, d, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    need = [-(-k.shape[0] // page) for k, _ in caches]
    order = torch.randperm(sum(need), generator=gen, device="cuda")
    k_pages = torch.full((sum(need), page, hkv, d), float("nan"), dtype=torch.bfloat16,
                         device="cuda")
    v_pages = torch.full_like(k_pages, float("nan"))
    table = torch.zeros(len(caches), max(need), dtype=torch.int32, device="cuda")
    used = 0
    for b, ((k, v), n) in enumerate(zip(caches, need)):
        ids = order[used:used + n]
        used += n
        table[b, :n] = ids.int()
        for i in range(n):
            rows = slice(i * page, min((i + 1) * page, k.shape[0]))
            width = rows.stop - rows.start
            k_pages[ids[i], :width] = k[rows]
            v_pages[ids[i], :width] = v[rows]
    return k_pages, v_pages, table


def reference(q, caches, sq):
    outs = []
    for b, (k, v) in enumerate(caches):
        kk = k.float().transpose(0, 1)[None]  # [1, H_kv, L, D]
        vv = v.float().transpose(0, 1)[None]
        group = q.shape[1] // kk.shape[1]
        kk, vv = kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1)
        s = q[b:b + 1].float() @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5
        rows = torch.arange(sq, device="cuda")[:, None] + kk.shape[2] - sq
        s = s.masked_fill(torch.arange(kk.shape[2], device="cuda")[None, :] > rows, float("-inf"))
        outs.append(torch.softmax(s, -1) @ vv)
    return torch.cat(outs)


def rel(x, ref):
    return float((x.float() - ref).norm() / ref.norm())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--pages", default="16,32,64")
    args = parser.parse_args()
    torch.manual_seed(0)
    rt = runtime()
    rows = []
    for b, hq, hkv, lengths, sq, d in POINTS:
        caches = [(torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda"),
                   torch.randn(n, hkv, d, dtype=torch.bfloat16, device="cuda")) for n in lengths]
        q = torch.randn(b, hq, sq, d, dtype=torch.bfloat16, device="cuda")
        seqused = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        ref = reference(q, caches, sq)
        longest = max(lengths)
        equal = len(set(lengths)) == 1
        if equal:  # the contiguous call on the same keys
            k = torch.stack([c[0] for c in caches]).transpose(1, 2).contiguous()
            v = torch.stack([c[1] for c in caches]).transpose(1, 2).contiguous()
        for page in (int(x) for x in args.pages.split(",")):
            k_pages, v_pages, table = pools(caches, page, hkv, d)
            problem, _ = _paged.paged_problem(q, k_pages, table, True, None, None, None, longest)
            base = ta.FORWARD.default_schedule("sm_90", problem)
            fns = {
                "copy": lambda: _paged._gathered_forward(rt, q, k_pages, v_pages, table, seqused,
                                                         longest, causal=True, scale=None,
                                                         window=None, softcap=None, sinks=None),
                "route": lambda: ta.paged_attention(q, k_pages, v_pages, table, seqused,
                                                    causal=True, max_k=longest),
            }
            g64 = base.replace(tile_m=64, tile_n=128, num_ctas=1)
            fns["g64"] = (lambda s=g64: _paged._forward_in_place(
                ta.FORWARD, problem, s, q, k_pages, v_pages, table, seqused, longest, None, None))
            if page == 64:
                n64 = base.replace(tile_n=64)
                fns["n64"] = (lambda s=n64: _paged._forward_in_place(
                    ta.FORWARD, problem, s, q, k_pages, v_pages, table, seqused, longest, None,
                    None))
            if equal:
                fns["contig"] = lambda: ta.sdpa(q, k, v, "bottom_right")
            errors = {}
            for name, fn in list(fns.items()):
                try:
                    errors[name] = rel(fn(), ref)
                except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                    print(f"  {name}: {type(exc).__name__}: {str(exc)[:200]}")
                    fns.pop(name)
            times = time_interleaved(fns, rounds=args.rounds)
            label = (f"B{b} H{hq}/{hkv} keys {lengths if not equal else lengths[0]} q{sq} "
                     f"D{d} page {page}")
            print(f"== {label}  (default: {base.describe()}; g64 {g64.describe()})")
            ms = {n: t.median_ms for n, t in times.items() if not isinstance(t, str)}
            for name, t in ms.items():
                print(f"  {name:7s} {t * 1e3:9.1f} us  err {errors[name]:.1e}  "
                      f"copy/this {ms['copy'] / t:.3f}"
                      + (f"  contig/this {ms['contig'] / t:.3f}" if "contig" in ms else ""))
            rows.append((label, ms))
    print("\nSUMMARY (us; ratio = contig or copy time / this)")
    for label, ms in rows:
        base = ms.get("contig", ms["copy"])
        print(label, "  ".join(f"{n}={t * 1e3:.1f}({base / t:.2f})" for n, t in ms.items()))


if __name__ == "__main__":
    main()
