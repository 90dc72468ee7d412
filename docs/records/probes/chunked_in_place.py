"""Chunked prefill over pages against the contiguous call (issue 49's bar: within 5% at pages of 16
and 64): each page size as the call's route reads it (``p16``, ``p64``, ``p256``), and pages of
16 and 64 forced in place (a key tile walks as parts of a page's keys) or copied first
(``paged_mixed.pages_read``); ``--tiles64`` adds pages of 64 in place under 64-key tiles (one
page a tile), ``--held`` runs calls the route's rule was not chosen on, ``--cost`` adds pages of
256 and 64 in place in block order (no shuffle) and walking the grid of the longest's tiles
instead of a work table (``grid``); ``--once`` runs each form twice, untimed (for Nsight
Compute). bf16, bottom-right causal, equal query counts through
``varlen_attn(..., block_table=, seqused_k=)``; schedules forced at launch
(``packed_batches.with_schedule_fields``). GPU view (``time_interleaved``: L2 flushed,
interleaved, medians), then the isolated view (host counted); every contender checked against
the float32 reference first.

    source .devtk/setup.sh && python3 docs/records/probes/chunked_in_place.py [--rounds 9] \\
        [--tiles64] [--cost] [--once] [--held] [--only TEXT]
"""
import argparse
import contextlib
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from packed_batches import with_schedule_fields  # noqa: E402
from paged_mixed import DTYPE, pages_of, pages_read, reference  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention.entry_points import _paged  # noqa: E402
from tuner.measure import time_interleaved  # noqa: E402

#: name, (H_q, H_kv), sequences, queries each, keys each, head dim
POINTS = (("B4 H32/8 512 over 16k", (32, 8), 4, 512, 16384, 128),
          ("B2 H28/4 1024 over 9000", (28, 4), 2, 1024, 9000, 128),
          ("B8 H32/8 256 over 5000", (32, 8), 8, 256, 5000, 128))
#: ``--held``: calls the rule (``PAGE_PARTS_MAX_ROWS``) was not chosen on
HELD = (("B3 H32/8 384 over 12000", (32, 8), 3, 384, 12000, 128),
        ("B6 H28/4 400 over 3000", (28, 4), 6, 400, 3000, 128),
        ("B2 H16/2 512 over 7000", (16, 2), 2, 512, 7000, 128),
        ("B5 H16/16 1000 over 6000", (16, 16), 5, 1000, 6000, 128),
        ("B1 H32/8 2048 over 16000", (32, 8), 1, 2048, 16000, 128),
        ("B4 H32/8 640 over 10000 D64", (32, 8), 4, 640, 10000, 64))
#: contender: (page size or 0, how pages are read: as the call's route decides, or forced
#: "in place" / "copy", forced schedule fields)
FORMS = {"contiguous": (0, None, {}),
         "p16": (16, None, {}),
         "p16 in place": (16, "in place", {}),
         "p64": (64, None, {}),
         "p64 copy": (64, "copy", {}),
         "p64 in place": (64, "in place", {}),
         "p256": (256, None, {})}
#: ``--tiles64``: 64-key tiles (one page of 64 a tile), with and without two-CTA clusters
TILES64 = {"contiguous n64": (0, None, {"tile_n": 64}),
           "contiguous n64 c1": (0, None, {"tile_n": 64, "num_ctas": 1}),
           "p64 in place n64": (64, "in place", {"tile_n": 64}),
           "p64 in place n64 c1": (64, "in place", {"tile_n": 64, "num_ctas": 1})}

#: ``--cost``: what a paged forward costs beyond the contiguous one
COST = {"p256 ordered": (256, "in place ordered", {}), "p256 grid": (256, "in place grid", {}),
        "p64 in place ordered": (64, "in place ordered", {}),
        "p64 in place grid": (64, "in place grid", {})}
#: each forced mode's own signature: its block table padded by this many slots
PADS = {"in place": 1, "copy": 2, "in place ordered": 3, "in place grid": 4}


@contextlib.contextmanager
def grid_walk():
    """The paged forward walks the grid of the longest sequence's tiles where the plain rule
    (``use_work_table``) says so, not always a work table."""
    kept = _paged.RaggedLayout
    _paged.RaggedLayout = lambda *a, table=True, **k: kept(*a, table=False, **k)
    try:
        yield
    finally:
        _paged.RaggedLayout = kept


def call(query, cu, caches, page, mode, fields, counts, lengths):
    hq, hkv = query.shape[1], caches[0][0].shape[1]
    if page:
        k, v, table = pages_of(caches, page, shuffled=mode != "in place ordered")
        if mode:  # a signature of its own (a repeat runs what its first call decided)
            table = torch.nn.functional.pad(table, (0, PADS[mode]), value=-1)
        used = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        extra = {"seqused_k": used, "block_table": table}
        cu_k = None
    else:
        k, v = (torch.cat([c[i] for c in caches]) for i in (0, 1))
        cu_k = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32,
                            device="cuda")
        extra = {}

    def run():
        return ta.varlen_attn(query, k, v, cu, cu_k, max(counts), max(lengths), is_causal=True,
                              enable_gqa=hq != hkv, **extra)
    fn = with_schedule_fields(run, **fields) if fields else run
    if not mode:
        return fn

    def forced():
        grid = grid_walk() if mode == "in place grid" else contextlib.nullcontext()
        with pages_read(mode != "copy"), grid:
            return fn()
    return forced


def inputs(hq, hkv, n, sq, sk, d):
    """``n`` sequences' ``(k, v)`` caches of ``sk`` keys, their ``sq`` queries each packed
    ``[n * sq, hq, d]``, the queries' offsets and the float32 reference (seed 2)."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    caches = [tuple(torch.randn(sk, hkv, d, generator=gen, dtype=DTYPE, device="cuda")
                    for _ in range(2)) for _ in range(n)]
    query = torch.randn(n * sq, hq, d, generator=gen, dtype=DTYPE, device="cuda")
    cu = torch.arange(0, n * sq + 1, sq, dtype=torch.int32, device="cuda")
    return caches, query, cu, reference(query, cu, caches)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tiles64", action="store_true")
    ap.add_argument("--cost", action="store_true")
    ap.add_argument("--once", action="store_true", help="each form checked, run once more and "
                    "not timed: for Nsight Compute")
    ap.add_argument("--held", action="store_true", help="the held-out calls instead")
    ap.add_argument("--only", default="", help="the calls whose names hold this text")
    args = ap.parse_args()
    forms = {**FORMS, **(TILES64 if args.tiles64 else {}), **(COST if args.cost else {})}
    rows = ["| call | contender | µs | ÷ contiguous | isolated µs | ÷ contiguous | rel L2 |",
            "|---|---|---|---|---|---|---|"]
    for name, (hq, hkv), n, sq, sk, d in HELD if args.held else POINTS:
        if args.only not in name:
            continue
        caches, query, cu, want = inputs(hq, hkv, n, sq, sk, d)
        fns, errs = {}, {}
        with torch.no_grad():
            for who, (page, mode, fields) in forms.items():
                try:
                    f = call(query, cu, caches, page, mode, fields, [sq] * n, [sk] * n)
                    errs[who] = ((f().float() - want).norm() / want.norm()).item()
                    fns[who] = f
                except Exception as exc:  # a form that cannot run: said so
                    print(f"  {name} {who}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            if args.once:
                for f in fns.values():
                    f()
                torch.cuda.synchronize()
                continue
            gpu = time_interleaved(fns, rounds=args.rounds)
            host = time_interleaved(fns, rounds=args.rounds, host=True)
        for who in fns:
            g, h = gpu[who].median_ms, host[who].median_ms
            rows.append(f"| {name} | {who} | {1e3 * g:.1f} | "
                        f"{g / gpu['contiguous'].median_ms:.3f} | {1e3 * h:.1f} | "
                        f"{h / host['contiguous'].median_ms:.3f} | {errs[who]:.1e} |")
        print("\n".join(rows[-len(fns):]), flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
