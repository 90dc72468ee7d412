"""What reading a paged batch's valid K/V pages costs a cuTile kernel with nothing else to do
(issue 49: "paged decode at pages of 16 ... at least 80% of the copy rate on valid bytes"): the
default decode of `paged_balance.py`'s held-out batches (pages of 16, both length mixes) beside a
kernel that streams every valid page of every sequence, the work spread evenly: the valid pages'
ids in one list, each CTA (K/V head, share) walking an equal share of it, one TMA load of a
page's 16 keys for K and one for V a step, folded into a float32 tile by a product with ones.
It balances the work as no decode can (a decode's CTA walks one sequence's keys), so it is the
floor a paged decode of those bytes could reach. Interleaved, L2 flushed, GPU time; shares of
the 1 GiB copy rate on the valid bytes read once (the read loads whole pages: at most 15 keys a
sequence more).

    source .devtk/setup.sh && python3 docs/records/probes/paged_read_floor.py [--rounds 15]
    python3 docs/records/probes/paged_read_floor.py --export   # CPU: the forms, for sm_90
"""

import argparse
import sys
from pathlib import Path

import cuda.tile as ct

sys.path.insert(0, str(Path(__file__).parent))
from read_floor import WIDTH  # noqa: E402

ConstInt = ct.Constant[int]
#: (loads in flight, CTAs an SM)
FORMS = ((4, 1), (4, 2), (8, 2))


@ct.kernel
def stream_pages(k, v, flat, out, pages: int, PAGE: ConstInt, LATENCY: ConstInt):
    """CTA ``(h, s)`` of ``(H_kv, g)`` folds head ``h``'s rows of the pages ``flat[s*pages//g ..
    (s+1)*pages//g)`` of the ``[pages, PAGE, H_kv, WIDTH]`` pools into a float32 tile and
    stores its column sums as row ``h * g + s``."""
    h = ct.bid(0)
    s = ct.bid(1)
    g = ct.num_blocks(1)
    ones = ct.full((16, PAGE), 1.0, dtype=ct.bfloat16)
    acc = ct.zeros((16, WIDTH), dtype=ct.float32)
    for i in range(s * pages // g, (s + 1) * pages // g):
        page = ct.gather(flat, i)
        key = ct.load(k, (page, 0, h, 0), (1, PAGE, 1, WIDTH), latency=LATENCY,
                      padding_mode=ct.PaddingMode.ZERO)
        acc = ct.mma(ones, key.reshape((PAGE, WIDTH)), acc)
        value = ct.load(v, (page, 0, h, 0), (1, PAGE, 1, WIDTH), latency=LATENCY,
                        padding_mode=ct.PaddingMode.ZERO)
        acc = ct.mma(ones, value.reshape((PAGE, WIDTH)), acc)
    ct.store(out, (h * g + s, 0), ct.sum(acc, axis=0, keepdims=True) * (1.0 / 16))


def export_all():
    """Compile every form for sm_90 on the CPU (no GPU)."""
    from cuda.tile import compilation as ctc

    from tiledattention.core._compile import array_constraint, export_cubin

    pool = array_constraint("bf16", (4096, 16, 8, WIDTH))
    flat = array_constraint("int32", (4096,))
    out = array_constraint("fp32", (264, WIDTH))
    for latency, occupancy in FORMS:
        result = export_cubin(stream_pages.replace_hints(occupancy=occupancy),
                              [pool, pool, flat, out, ctc.ScalarConstraint(ct.int32), 16,
                               latency], "sm_90", f"stream_pages {latency} {occupancy}")
        print(f"latency {latency} occupancy {occupancy}: {result.cubin_size} bytes, shared "
              f"{result.shared_bytes}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--export", action="store_true")
    args = parser.parse_args()
    if args.export:
        export_all()
        return
    import torch

    import tiledattention as ta
    from tiledattention.core import _case
    from tiledattention.core._device import device_info
    from tuner.measure import time_interleaved

    from compile_ahead import compile_ahead  # noqa: E402
    from paged_balance import HELD_POINTS, MIXES  # noqa: E402
    from paged_defaults import copy_rate  # noqa: E402

    def problem(b, hq, hkv, sk, page):
        return ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk,
                          head_dim=WIDTH, dtype="bf16", causal=True, bottom_right=True,
                          ragged=True, page_size=page)

    compile_ahead([(p, ta.DECODE.default_schedule("sm_90", p))
                   for p in (problem(*point) for point in HELD_POINTS)])

    copy_gbps = copy_rate()
    stream = torch.cuda.current_stream()
    sms = device_info(0).sm_count
    original = _case.paged_lengths
    table = []
    for b, hq, hkv, sk, page in HELD_POINTS:
        p = problem(b, hq, hkv, sk, page)
        for mix, lengths in MIXES.items():
            _case.paged_lengths = lengths
            case = ta.DECODE.case(p, 0)
            _case.paged_lengths = original
            used = case.seqused.tolist()
            flat = torch.cat([case.table[i, :-(-n // page)] for i, n in enumerate(used)])
            k = torch.nan_to_num(case.k_pages)  # (the pools' unused rows are NaN)
            v = torch.nan_to_num(case.v_pages)
            valid = sum(used) * hkv * WIDTH * 2 * 2
            default = ta.DECODE.default_schedule("sm_90", p)
            fns = {"default decode": case.launcher(default)}
            error = case.error(fns["default decode"])
            reference = sum(x[flat.long()].float().sum((0, 1)) for x in (k, v))  # [H_kv, D]
            for latency, occupancy in FORMS:
                splits = occupancy * sms // hkv
                out = torch.full((hkv * splits, WIDTH), float("nan"), device="cuda")
                kernel = stream_pages.replace_hints(occupancy=occupancy)

                def run(kernel=kernel, out=out, splits=splits, latency=latency):
                    ct.launch(stream, (hkv, splits, 1), kernel,
                              (k, v, flat, out, flat.numel(), page, latency))
                run()
                got = out.view(hkv, splits, WIDTH).sum(1)
                wrong = ((got - reference).norm() / reference.norm()).item()
                if not wrong < 1e-3:
                    print(f"  read L{latency} occ{occupancy}: wrong sums ({wrong:.1e}), left out")
                    continue
                fns[f"read L{latency} occ{occupancy}"] = run
            times = {n: t.median_ms * 1e-3 for n, t
                     in time_interleaved(fns, rounds=args.rounds).items()}
            print(f"== {p.describe()} {mix}: {len(used)} caches of {min(used)}-{max(used)} keys, "
                  f"{flat.numel()} pages, valid {valid / 1e6:.1f} MB; default "
                  f"{default.describe()} (err {error:.1e})")
            for name, t in sorted(times.items(), key=lambda kv: kv[1]):
                print(f"  {name:18s} {t * 1e6:8.1f} us "
                      f"{100 * valid / t / 1e9 / copy_gbps:5.1f}% of copy")
            reads = {n: t for n, t in times.items() if n.startswith("read")}
            best = min(reads, key=reads.get)
            table.append((f"{p.describe()} {mix}", valid, times["default decode"], best,
                          reads[best]))
    print("\n| batch (pages of 16) | valid MB | default µs (% of copy) | fastest read | "
          "its µs (% of copy) |\n|---|---|---|---|---|")
    for name, nbytes, ours, best, read in table:
        def pct(seconds):
            return f"{seconds * 1e6:.1f} ({100 * nbytes / seconds / 1e9 / copy_gbps:.1f})"
        print(f"| {name} | {nbytes / 1e6:.1f} | {pct(ours)} | {best} | {pct(read)} |")


if __name__ == "__main__":
    main()
