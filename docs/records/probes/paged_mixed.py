"""A serving engine's mixed step over a paged cache (prefill chunks beside decode tokens, each
sequence its own query count) through ``varlen_attn(..., block_table=, seqused_k=)``, against
what a user has instead. bf16, D 128, bottom-right causal. Contenders, interleaved, median of
``--rounds``, in two views (``time_interleaved``): GPU time with the L2 flushed before each
sample (the host's launch time hidden), and an isolated call from an idle GPU with the host's
time counted:

- ``mixed-P``: ours, one call over pages of ``P`` (16, 64, 256: below a whole key tile the
  pages the chunks read copied into one packed copy first, else read in place);
- ``split-P``: ours as a serving engine would call it without the mixed route: the decode
  tokens through ``paged_attention`` (the split-KV decode kernels) and each prefill chunk
  through ``paged_attention`` of its own;
- ``contiguous``: ours on the same step over contiguous packed caches (``varlen_attn``);
- ``flash-attn-4``: ``flash_attn_varlen_func`` with ``cu_seqlens_q``, ``seqused_k`` and
  ``page_table`` (pages of 64), where it is importable and takes the step.

Every contender is checked against a float32 reference per sequence first. GB/s count the
valid K/V bytes read once; the copy rate of the same bytes is timed in the same run.

    source .devtk/setup.sh && python3 docs/records/probes/paged_mixed.py [--rounds 15]

``--in-place`` adds ``mixed-P-in-place`` for pages of 16 and 64: the same call with the forward
forced to read the pages in place (key tiles joined from page loads) instead of the copy.
``--only TEXT`` runs the steps whose names hold it; ``--kernels`` prints instead each
contender's kernels (``torch.profiler``, µs a step, five steps after an L2 flush each).
"""

import argparse
import contextlib
import itertools

import torch
import torch.nn.functional as F

import tiledattention
from tuner.bench._peers import PeerUnavailable, fa4_functions
from tuner.measure import time_interleaved

D, DTYPE = 128, torch.bfloat16
#: name, (H_q, H_kv), per sequence (query count, cache length)
POINTS = (
    ("chat B64: 63 decodes + a 512 chunk", (32, 8),
     [(1, 500 + 251 * i) for i in range(63)] + [(512, 2048)]),
    ("prefill-heavy: 4 chunks of 1024 + 12 decodes", (32, 8),
     [(1024, 1024 * (i + 1)) for i in range(4)] + [(1, 3000 + 900 * i) for i in range(12)]),
    ("speculative B32: 1-5 tokens", (28, 4), [(1 + i % 5, 1000 + 211 * i) for i in range(32)]),
    ("chunks of 64-700 beside 20 decodes", (28, 4),
     [(64 + 90 * i, 700 + 300 * i) for i in range(8)] + [(1, 9000 - 400 * i) for i in range(20)]),
    ("chunked prefill B4: 512 queries over 16k keys", (32, 8), [(512, 16384)] * 4),
    ("chunked prefill B6: 300-900 queries over 2k-11k keys", (28, 4),
     [(300 + 120 * i, 2000 + 1800 * i) for i in range(6)]),
)


def pages_of(caches, page, seed=0, shuffled=True):
    """Pools and block table holding ``caches`` (per sequence ``(k, v)``, ``[L, H_kv, D]``) in
    shuffled pages (else in block order); unused table slots -1."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    need = [-(-k.shape[0] // page) for k, _ in caches]
    order = (torch.randperm(sum(need), generator=gen, device="cuda") if shuffled
             else torch.arange(sum(need), device="cuda"))
    hkv, d = caches[0][0].shape[1:]
    k_pages = torch.zeros(sum(need), page, hkv, d, dtype=DTYPE, device="cuda")
    v_pages = torch.zeros_like(k_pages)
    table = torch.full((len(caches), max(need)), -1, dtype=torch.int32, device="cuda")
    used = 0
    for b, ((k, v), n) in enumerate(zip(caches, need)):
        ids = order[used:used + n]
        used += n
        table[b, :n] = ids.int()
        pad = n * page - k.shape[0]
        k_pages[ids] = F.pad(k, (0, 0, 0, 0, 0, pad)).view(n, page, hkv, d)
        v_pages[ids] = F.pad(v, (0, 0, 0, 0, 0, pad)).view(n, page, hkv, d)
    return k_pages, v_pages, table


def reference(query, cu, caches):
    out = torch.zeros(query.shape, dtype=torch.float32, device="cuda")
    for b, (k, v) in enumerate(caches):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        n, sk = rows.stop - rows.start, k.shape[0]
        group = query.shape[1] // k.shape[1]
        kk, vv = (x.float().transpose(0, 1).repeat_interleave(group, 0) for x in (k, v))
        keep = (torch.arange(sk, device="cuda")[None, :]
                <= torch.arange(n, device="cuda")[:, None] + sk - n)
        out[rows] = F.scaled_dot_product_attention(query[rows].float().transpose(0, 1), kk, vv,
                                                   attn_mask=keep).transpose(0, 1)
    return out


@contextlib.contextmanager
def pages_read(in_place):
    """The forward family reads pages of any size in place (``in_place``) or copies them while
    inside."""
    family = type(tiledattention.FORWARD)
    kept = family.reads_pages_with
    family.reads_pages_with = lambda self, problem, schedule: in_place
    try:
        yield
    finally:
        family.reads_pages_with = kept


def contenders(query, cu, caches, counts, lengths, in_place=False):
    hq = query.shape[1]
    used = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    fns = {}
    for page in (16, 64, 256):
        k_pages, v_pages, table = pages_of(caches, page)
        fns[f"mixed-{page}"] = (lambda k=k_pages, v=v_pages, t=table: tiledattention.varlen_attn(
            query, k, v, cu, None, max(counts), max(lengths), is_causal=True, enable_gqa=True,
            seqused_k=used, block_table=t))
        if in_place and page < 128:
            def forced(mixed=fns[f"mixed-{page}"]):
                with pages_read(True):
                    return mixed()
            fns[f"mixed-{page}-in-place"] = forced
        # the same step as separate calls (their tables and queries held apart, as an engine
        # would hold them): the decode tokens together, each chunk alone
        dec = [b for b, n in enumerate(counts) if n == 1]
        rows = torch.tensor([int(cu[b]) for b in dec], dtype=torch.long, device="cuda")
        q_dec, t_dec, used_dec = query[rows][:, :, None], table[dec], used[dec]
        chunks = [(slice(int(cu[b]), int(cu[b + 1])),
                   query[int(cu[b]):int(cu[b + 1])].transpose(0, 1)[None], table[b:b + 1],
                   used[b:b + 1], lengths[b]) for b, n in enumerate(counts) if n > 1]

        def split(k=k_pages, v=v_pages, rows=rows, q_dec=q_dec, t_dec=t_dec,
                  used_dec=used_dec, chunks=chunks):
            out = torch.empty_like(query)
            if rows.numel():
                out[rows] = tiledattention.paged_attention(
                    q_dec, k, v, t_dec, used_dec, max_k=max(lengths))[:, :, 0]
            for where, q, t, n, longest in chunks:
                out[where] = tiledattention.paged_attention(q, k, v, t, n,
                                                            max_k=longest)[0].transpose(0, 1)
            return out
        fns[f"split-{page}"] = split
        if page == 64:
            try:
                _, flash_attn_varlen_func = fa4_functions()

                def fa4(k=k_pages, v=v_pages, t=table.clamp(min=0)):
                    out = flash_attn_varlen_func(query, k, v, cu_seqlens_q=cu,
                                                 max_seqlen_q=max(counts), seqused_k=used,
                                                 page_table=t, max_seqlen_k=max(lengths),
                                                 causal=True, softmax_scale=D ** -0.5)
                    return out[0] if isinstance(out, tuple) else out
                fns["flash-attn-4"] = fa4
            except PeerUnavailable as exc:  # not installed
                print(f"  flash-attn-4: {type(exc).__name__}: {str(exc)[:100]}")
    kc = torch.cat([k for k, _ in caches])
    vc = torch.cat([v for _, v in caches])
    cu_k = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32,
                        device="cuda")
    fns["contiguous"] = lambda: tiledattention.varlen_attn(
        query, kc, vc, cu, cu_k, max(counts), max(lengths), is_causal=True,
        enable_gqa=hq != kc.shape[1])
    return fns


def kernels(fns, steps=5):
    """Each contender's GPU time a step by kernel (the flush's fill left out)."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for who, f in fns.items():
        f()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                flush.zero_()
                f()
            torch.cuda.synchronize()
        table = {}
        for e in prof.events():
            if e.device_type.name == "CUDA" and not ("FillFunctor" in e.name
                                                    and e.device_time_total > 20):
                table[e.name[:60]] = table.get(e.name[:60], 0.0) + e.device_time_total / steps
        print(f"  {who}: " + "; ".join(f"{n} {us:.1f}" for n, us in
                                       sorted(table.items(), key=lambda kv: -kv[1])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--in-place", action="store_true")
    parser.add_argument("--only", default="", help="the steps whose names hold this text")
    parser.add_argument("--kernels", action="store_true", help="each contender's kernels")
    args = parser.parse_args()
    lines = ["| step | contender | µs | GB/s | % of copy | ÷ mixed-64 (time) | isolated µs "
             "| rel L2 |", "|---|---|---|---|---|---|---|---|"]
    for name, (hq, hkv), seqs in (p for p in POINTS if args.only in p[0]):
        counts, lengths = [n for n, _ in seqs], [s for _, s in seqs]
        gen = torch.Generator(device="cuda").manual_seed(1)
        caches = [tuple(torch.randn(s, hkv, D, generator=gen, dtype=DTYPE, device="cuda")
                        for _ in range(2)) for s in lengths]
        query = torch.randn(sum(counts), hq, D, generator=gen, dtype=DTYPE, device="cuda")
        cu = torch.tensor([0] + list(itertools.accumulate(counts)), dtype=torch.int32,
                          device="cuda")
        want = reference(query, cu, caches)
        valid = sum(lengths) * hkv * D * 2 * 2
        fns, errors = {}, {}
        with torch.no_grad():
            for who, f in contenders(query, cu, caches, counts, lengths, args.in_place).items():
                try:
                    got = f().float()
                    errors[who] = ((got - want).norm() / want.norm()).item()
                    fns[who] = f
                except Exception as exc:  # a contender that cannot run the step
                    print(f"  {who}: {type(exc).__name__}: {str(exc)[:160]}")
            if args.kernels:
                print(name)
                kernels(fns)
                continue
            src = torch.empty(valid // 2, dtype=DTYPE, device="cuda")
            dst = torch.empty_like(src)
            fns["copy"] = lambda: dst.copy_(src)
            times = time_interleaved(fns, rounds=args.rounds)
            # the isolated view: each call from an idle GPU, the host's time counted
            isolated = time_interleaved({w: f for w, f in fns.items() if w != "copy"},
                                        rounds=args.rounds, host=True)
        copy_gbps = 2 * valid / (times["copy"].median_ms * 1e-3) / 1e9
        base = times.get("mixed-64")
        for who, t in times.items():
            if who == "copy":
                continue
            gbps = valid / (t.median_ms * 1e-3) / 1e9
            ratio = f"{t.median_ms / base.median_ms:.3f}" if base else ""
            lines.append(f"| {name} | {who} | {1e3 * t.median_ms:.1f} | {gbps:.0f} | "
                         f"{100 * gbps / copy_gbps:.0f} | {ratio} | "
                         f"{1e3 * isolated[who].median_ms:.1f} | {errors[who]:.1e} |")
        print("\n".join(lines[-len(times) + 1:]), flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
