"""The packed training call's host path before and after e2a717e (issue 50), in one process,
interleaved round by round, with FlashAttention-4 beside: ``old`` launches as 9b1deaf did (the
backward's two work tables and three row clears in five launches, views as unsqueeze +
transpose, the ranges in six ops), with this tree's kernels; ``new`` is this tree (one prologue
launch, views in one op, the ranges in three). Per batch and contender, forward (with grad) and
backward (``torch.autograd.grad``): ``host``, the host's time a call with the GPU kept busy
(``torch.cuda._sleep`` ahead, 30 calls, nothing synchronising), and ``loop``, 20 calls back to
back between two events; medians and minima over the rounds. ``same grads``: the two paths'
gradients bit for bit equal.

    source .devtk/setup.sh && taskset -c 4 python3 docs/records/probes/packed_host_ab.py \
        encoder,bert-short,pretrain,short-gqa7,skewed-gqa8,chat
"""
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, "docs/records/probes")
import packed_batches as pb  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention.core import _aot, _ragged  # noqa: E402
from tiledattention.core._problem import padded_head_dim  # noqa: E402
from tiledattention.core._work_table import CHUNK, CLEAR_TILE_ROWS  # noqa: E402
from tiledattention.entry_points import _varlen  # noqa: E402
from tiledattention.kernels.backward import _launch  # noqa: E402

ROUNDS = 15


def old_view(x):
    return x.unsqueeze(0).transpose(1, 2)


def old_ranges(cu_seq_q, cu_seq_k):
    sequences = cu_seq_q.shape[0] - 1
    ranges = torch.empty((4, sequences), dtype=torch.int32, device=cu_seq_q.device)
    pairs = cu_seq_q.unfold(0, 2, 1).t()
    if cu_seq_k is cu_seq_q:
        ranges.view(2, 2, sequences).copy_(pairs.expand(2, 2, sequences))
    else:
        ranges[0:2] = pairs
        ranges[2:4] = cu_seq_k.unfold(0, 2, 1).t()
    return ranges


def old_prologue(stream, plan, ranges, tables, cleared):
    from tiledattention.core._work_kernel import clear_outside, fill_work_table
    for keys, (table, tile) in enumerate(zip(tables, plan.tiles)):
        if table is not None:
            _aot.launch(stream, (ranges.shape[1] + 1,), fill_work_table,
                        (ranges, table, tile, CHUNK, bool(keys)))
    if cleared:
        for grad, which in zip(cleared, (0, 2, 2)):
            _aot.launch(stream, (132,), clear_outside,
                        (grad, ranges, which, CLEAR_TILE_ROWS, padded_head_dim(grad.shape[3])))


NEW = (_varlen._view, _ragged.packed_ranges, _launch._launch_prologue)


def use(old):
    view, ranges, prologue = (old_view, old_ranges, old_prologue) if old else NEW
    _varlen._view = view
    _varlen.packed_ranges = ranges
    _launch._launch_prologue = prologue


def host_once(fn, calls=30):
    torch.cuda._sleep(200_000_000)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    took = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return took


def loop_once(fn, calls=20):
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / calls


def main():
    names = sys.argv[1].split(",")
    every = {**pb.batches(), **pb.new_batches()}
    for name in names:
        lengths, hq, hkv, d, causal, dtype = every[name]
        q, k, v, do, cu, longest, _ = pb.packed_call(lengths, hq, hkv, d, causal, dtype)
        ours = lambda *xs: ta.varlen_attn(*xs, cu, cu, longest, longest, is_causal=causal,
                                          enable_gqa=hq != hkv)
        contenders = {"old": (ours, True), "new": (ours, False)}
        fa4 = pb.fa4_call(cu, longest, causal)
        if fa4 is not None:
            contenders["fa4"] = (fa4, False)
        calls = {}
        for who, (fn, old) in contenders.items():
            use(old)
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            out = fn(*leaves)
            grads = torch.autograd.grad(out, leaves, do, retain_graph=True)
            calls[who] = (old, lambda fn=fn, leaves=leaves: fn(*leaves),
                          lambda out=out, leaves=leaves:
                          torch.autograd.grad(out, leaves, do, retain_graph=True))
            if who == "new":  # same gradients as the old path, bit for bit
                same = all(torch.equal(a, b) for a, b in zip(grads, before))
            before = grads
        samples = {f"{w} {p} {v}": [] for w in calls for p in ("fwd", "bwd")
                   for v in ("host", "loop")}
        for r in range(ROUNDS):
            order = list(calls)[r % len(calls):] + list(calls)[:r % len(calls)]
            for who in order:
                old, fwd, bwd = calls[who]
                use(old)
                for part, fn in (("fwd", fwd), ("bwd", bwd)):
                    fn()
                    samples[f"{who} {part} host"].append(host_once(fn))
                    samples[f"{who} {part} loop"].append(loop_once(fn))
        use(False)
        row = {"batch": name, "same grads": same}
        row.update({key: round(statistics.median(v), 1) for key, v in samples.items()})
        row.update({f"min {key}": round(min(v), 1) for key, v in samples.items()})
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
