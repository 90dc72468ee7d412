"""Where a training step's host time goes (issue 47/50), on the GPU: a packed step, a dense
step of ours and of torch's cuDNN backend (forward + ``torch.autograd.grad`` on a fresh graph)
and our dense no-grad forward, µs a call (host clock of 20 calls without a synchronisation, and
with the final one), as they are, with autograd's worker threads off, and with a 1 µs GIL
switch interval.

    source .devtk/setup.sh && python3 docs/records/probes/training_step_host.py
"""
import sys, time, torch, tiledattention as ta
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
g = torch.Generator().manual_seed(50)
lengths = [int(torch.randint(30, 513, (1,), generator=g)) for _ in range(64)]
q = torch.randn(sum(lengths), 12, 64, device="cuda", dtype=torch.bfloat16)
do = torch.randn_like(q)
cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
L = max(lengths)
leaves = [torch.randn_like(q).requires_grad_() for _ in range(3)]
def fb():
    out = ta.varlen_attn(*leaves, cu, cu, L, L)
    torch.autograd.grad(out, leaves, do)
dl = [torch.randn(8, 16, 577, 64, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
ddo = torch.randn_like(dl[0])
def dfb():
    out = ta.sdpa(*dl)
    torch.autograd.grad(out, dl, ddo)
def cfb():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(*dl)
    torch.autograd.grad(out, dl, ddo)
def dfwd():
    with torch.no_grad():
        ta.sdpa(*dl)
def host(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize(); s = time.perf_counter()
    for _ in range(n): fn()
    e = time.perf_counter(); torch.cuda.synchronize(); e2 = time.perf_counter()
    return (e - s) / n * 1e6, (e2 - s) / n * 1e6
def report(tag):
    for name, f in (("varlen fwd+bwd", fb), ("ours dense B8H16S577 fwd+bwd", dfb), ("cudnn dense fwd+bwd", cfb), ("ours dense fwd only", dfwd)):
        print(f"{tag:28s} {name:32s} host/wall us: %.1f %.1f" % host(f))
report("default")
torch.autograd.set_multithreading_enabled(False)
report("no autograd threads")
torch.autograd.set_multithreading_enabled(True)
sys.setswitchinterval(1e-6)
report("switchinterval 1us")
