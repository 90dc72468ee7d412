"""Host time of a warm ``varlen_attn`` call (issue 50), on the GPU: the encoder batch of
``packed_batches`` (64 sequences of 30-512 tokens, H 12, D 64, bf16), the calls enqueued back
to back without a synchronisation (the GPU's time is shorter than the host's), µs per call:
the forward, a forward+backward on a fresh graph, and a dense ``sdpa`` call for comparison;
then cProfile's view of where the host's time goes.

    source .devtk/setup.sh && python3 docs/records/probes/varlen_host.py
"""

import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

import tiledattention as ta

sys.path.insert(0, str(Path(__file__).parent))
from packed_ranges_host import encoder_batch, host  # noqa: E402


def host_us(fn, n):
    return host(fn, n)[0]


def main():
    q, do, cu, longest, leaves = encoder_batch()
    k, v = torch.randn_like(q), torch.randn_like(q)

    def fwd():
        return ta.varlen_attn(q, k, v, cu, cu, longest, longest)

    def fwd_bwd():
        out = ta.varlen_attn(*leaves, cu, cu, longest, longest)
        torch.autograd.grad(out, leaves, do)
    dense = torch.randn(64, 12, 256, 64, device="cuda", dtype=torch.bfloat16)
    print("fwd host us/call", host_us(fwd, 200))
    print("fwd+bwd host us/call", host_us(fwd_bwd, 100))
    print("dense sdpa host us/call", host_us(lambda: ta.sdpa(dense, dense, dense), 200))
    for name, fn, n in (("fwd", fwd, 300), ("fwd+bwd", fwd_bwd, 100)):
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(n):
            fn()
        profile.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(22)
        print("#####", name, n, "calls")
        print(text.getvalue()[:5000])


if __name__ == "__main__":
    main()
