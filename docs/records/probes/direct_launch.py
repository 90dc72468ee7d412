"""Prepared training calls launched straight through the driver (``core/_direct.py``) against
``ct.launch``, beside cuDNN: host µs per call (issue 47's lean host path).

For each shape (bf16, causal, ``[B, H, S, D]``): the training forward (``ta.sdpa`` on leaves
that require grad), the backward (``torch.autograd.grad`` of a kept output) and both on a fresh
graph, with our prepared launches going to the driver (``direct``) or through ``ct.launch``
(``ct.launch``: each direct launch refused, so the prepared launcher falls back, as every
launch went before), and torch's cuDNN backend; the three interleaved round by round, 15
rounds of 50 calls with no synchronisation inside a round (the GPU drained before each),
medians. Checked first: the direct route's output and gradients equal the ``ct.launch``
route's bit for bit (the backward's default two-kernel path is deterministic), and how many
launches each route made directly.

    source .devtk/setup.sh && python3 docs/records/probes/direct_launch.py
"""

import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention as ta
from tiledattention.core import _direct

SHAPES = [(1, 8, 8, 256, 64), (8, 16, 16, 577, 64), (1, 32, 8, 4096, 128),
          (2, 16, 16, 2048, 128), (4, 28, 4, 1024, 64)]
CALLS, ROUNDS = 50, 15

_direct_call = _direct.DirectLaunch.__call__
ROUTE = {"direct": True}


def _switchable(self, stream, args):
    """DirectLaunch.__call__, or a refusal (the fallback to ct.launch) when the route is off."""
    return ROUTE["direct"] and _direct_call(self, stream, args)


_direct.DirectLaunch.__call__ = _switchable


def inputs(b, hq, hkv, s, d):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16,
                           generator=gen).requires_grad_() for h in (hq, hkv, hkv))
    g = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    return q, k, v, g


def host_us(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    us = (time.perf_counter() - start) / CALLS * 1e6
    torch.cuda.synchronize()
    return us


def check(q, k, v, g):
    """The largest difference between the routes' output and gradients (0: bit for bit), and
    the launches each route made directly and by ct.launch."""
    results = {}
    for route in (True, False):
        ROUTE["direct"] = route
        before = _direct.launched()
        for _ in range(3):
            out = ta.sdpa(q, k, v, causal=True)
            grads = torch.autograd.grad(out, (q, k, v), g)
        torch.cuda.synchronize()
        after = _direct.launched()
        results[route] = ((out, *grads), {key: after[key] - before[key] for key in after})
    ROUTE["direct"] = True
    worst = max((a.float() - b.float()).abs().max().item()
                for a, b in zip(results[True][0], results[False][0]))
    return worst, results[True][1], results[False][1]


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"driver route available: {bool(_direct._get_driver())}")
    table = []
    for shape in SHAPES:
        q, k, v, g = inputs(*shape)
        leaves = (q, k, v)
        enable_gqa = shape[1] != shape[2]
        worst, on, off = check(q, k, v, g)

        def ours_fwd():
            return ta.sdpa(q, k, v, causal=True)

        def cudnn_fwd():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                      enable_gqa=enable_gqa)

        kept = {"ours": ours_fwd(), "cudnn": cudnn_fwd()}
        forms = {"direct": ("ours", True), "ct.launch": ("ours", False),
                 "cuDNN": ("cudnn", True)}
        fwd = {"ours": ours_fwd, "cudnn": cudnn_fwd}
        samples = {(form, phase): [] for form in forms for phase in ("fwd", "bwd", "fwd+bwd")}
        for _ in range(ROUNDS):
            for form, (who, route) in forms.items():
                ROUTE["direct"] = route
                out = kept[who]
                samples[form, "fwd"].append(host_us(fwd[who]))
                samples[form, "bwd"].append(host_us(
                    lambda: torch.autograd.grad(out, leaves, g, retain_graph=True)))
                samples[form, "fwd+bwd"].append(host_us(
                    lambda: torch.autograd.grad(fwd[who](), leaves, g)))
        ROUTE["direct"] = True
        med = {key: statistics.median(v) for key, v in samples.items()}
        b, hq, hkv, s, d = shape
        name = f"B{b} H{hq}/{hkv} S{s} D{d}"
        print(f"\n{name}: direct vs ct.launch max |diff| {worst:.3g}; launches (3 fwd+bwd) "
              f"direct route {on}, ct.launch route {off}", flush=True)
        for form in forms:
            print(f"  {form:9s} fwd {med[form, 'fwd']:7.1f}  bwd {med[form, 'bwd']:7.1f}  "
                  f"fwd+bwd {med[form, 'fwd+bwd']:7.1f}", flush=True)
        table.append((name, med))
    print("\n| shape | route | fwd | bwd | fwd+bwd | bwd ÷ cuDNN | fwd+bwd ÷ cuDNN |")
    print("|---|---|---|---|---|---|---|")
    for name, med in table:
        for form in ("direct", "ct.launch", "cuDNN"):
            ratios = ""
            if form != "cuDNN":
                ratios = (f" {med[form, 'bwd'] / med['cuDNN', 'bwd']:.2f} |"
                          f" {med[form, 'fwd+bwd'] / med['cuDNN', 'fwd+bwd']:.2f} |")
            else:
                ratios = " | |"
            print(f"| {name if form == 'direct' else ''} | {form} | {med[form, 'fwd']:.1f} | "
                  f"{med[form, 'bwd']:.1f} | {med[form, 'fwd+bwd']:.1f} |{ratios}")


if __name__ == "__main__":
    main()
