"""Probe (issue 47): a training call with learnable sinks (GPT-OSS's attention), through the
public ``tiledattention.sdpa`` and autograd, against FlashAttention-4's ``learnable_sink``.

Before this probe's change the eager route computed the sinks' gradient in torch from dO and O
(float32 copies of both, a product and a sum: one more pass over 4 x B·H·S·D bytes); now it
reads the backward kernels' row sums. ``old`` re-runs the torch route
(``sink_grad``) beside the new one. Timed: ``torch.autograd.grad(out, (q, k, v, sinks), dO)``
on a kept forward graph (the backward alone), steady state (back-to-back calls between CUDA
events, median of interleaved rounds) and isolated calls (``time_interleaved(host=True)``: the
GPU drained and the L2 flushed, host time counted).

    source .devtk/setup.sh && python3 docs/records/probes/sinks_training.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

#: (label, B, H_q, H_kv, S, D, window left or None)
SHAPES = [("B2 H64/8 S4096 D64 causal w128 sinks", 2, 64, 8, 4096, 64, 127),
          ("B1 H64/8 S8192 D64 causal sinks", 1, 64, 8, 8192, 64, None),
          ("B4 H64/8 S2048 D64 causal w128 sinks", 4, 64, 8, 2048, 64, 127)]


def main() -> int:
    import torch

    import tiledattention
    from tiledattention.entry_points import _autograd
    from backward_onepass_timing import steady_ms  # (scripts/: the same steady state)
    from tuner.measure import time_interleaved

    rows = []
    for label, b, hq, hkv, s, d, left in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        sinks = torch.randn(hq, device="cuda", generator=gen)
        grad_out = torch.randn_like(q)
        window = None if left is None else (left, 0)
        leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
        out = tiledattention.sdpa(*leaves[:3], causal=True, window=window, sinks=leaves[3])

        def ours(out=out, leaves=leaves):
            return torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

        def old(out=out, leaves=leaves):
            real = _autograd.sink_grad_from_rows
            _autograd.sink_grad_from_rows = lambda delta, lse, s: real(
                (grad_out.float() * out.detach().float()).sum(-1), lse, s)
            try:
                return ours()
            finally:
                _autograd.sink_grad_from_rows = real
        runs = {"ours": ours, "ours, sinks' grad in torch": old}
        want = old()
        got = ours()
        err = ((got[3] - want[3]).norm() / want[3].norm()).item()
        try:
            from flash_attn.cute import flash_attn_func

            fl = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
            for dtype in (torch.float32, torch.bfloat16):  # its sink dtype varies by version
                fsink = sinks.to(dtype).requires_grad_()
                try:
                    fout = flash_attn_func(*fl, causal=True, learnable_sink=fsink,
                                           window_size=(left, 0) if left is not None
                                           else (None, None))
                    break
                except Exception as exc:  # noqa: BLE001 (tried with the other dtype)
                    print(f"{label}: FA4 with {dtype} sinks: {exc}", flush=True)
            fout = fout[0] if isinstance(fout, tuple) else fout
            g_bshd = grad_out.transpose(1, 2).contiguous()

            def fa4(fout=fout, fl=fl, fsink=fsink):
                return torch.autograd.grad(fout, (*fl, fsink), g_bshd, retain_graph=True)
            fgrads = fa4()
            ferr = ((fgrads[3].float() - want[3]).norm() / want[3].norm()).item()
            print(f"{label}: FA4 dsinks vs ours rel {ferr:.1e}", flush=True)
            runs["FA4"] = fa4
        except Exception as exc:  # not installed, or not this problem
            print(f"{label}: FA4 skipped: {exc}", flush=True)
        steady = steady_ms(runs, 9)
        isolated = {n: t.median_ms for n, t in time_interleaved(runs, rounds=9,
                                                                  host=True).items()}
        rows.append((label, steady, isolated, err))
        print(f"{label}: steady {steady}, isolated {isolated}, dsinks rel err {err:.1e}",
              flush=True)
    print("\nbackward of a training call with learnable sinks (bf16), ms; dsinks new vs old rel "
          "err last")
    print("| shape | ours | ours, sinks' grad in torch | FA4 | FA4 ÷ ours | old ÷ new | "
          "isolated: ours | old | FA4 | FA4 ÷ ours | err |")
    print("|---" * 11 + "|")
    for label, st, iso, err in rows:
        fa4 = st.get("FA4")
        ifa4 = iso.get("FA4")
        print(f"| {label} | {st['ours']:.3f} | {st[list(st)[1]]:.3f} | "
              + (f"{fa4:.3f} | {fa4 / st['ours']:.2f} | " if fa4 else "- | - | ")
              + f"{st[list(st)[1]] / st['ours']:.2f} | {iso['ours']:.3f} | "
              f"{iso[list(iso)[1]]:.3f} | "
              + (f"{ifa4:.3f} | {ifa4 / iso['ours']:.2f} | " if ifa4 else "- | - | ")
              + f"{err:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
