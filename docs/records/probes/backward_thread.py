"""Where a backward call's host time goes on autograd's device thread (issue 47's lean host
path): the same work timed on the main thread and on another Python thread.

An earlier probe (``backward_host.py``) found that our autograd node loses 46-123 µs a call to
autograd's device thread where an empty Python node loses 19-25 and cuDNN's C++ node 21-49.
This one asks which part of our node's work costs more off the main thread. For each shape
(bf16, causal, ``[B, H, S, D]``), host µs per call with no synchronisation inside a round of
50 calls (the GPU drained before each round), median of 7 rounds, on the main thread and on a
``threading.Thread`` (``main`` / ``thread``):

- ``grad ours`` / ``grad cudnn`` / ``grad empty``: ``torch.autograd.grad`` of one kept output
  (threads on: the nodes run on the device thread; main thread only);
- ``body``: the kept backward (``kept.backward_plan.backward``: the four allocations and the
  prepared launches), called directly;
- ``alloc``: its four allocations alone (three gradients like q, k, v and the row sums);
- ``launch``: its prepared launches alone, into buffers made once;
- ``ct.launch`` (one kernel, the dQ or dK/dV kernel, its arguments built once) per launch.

Then, inside ``grad ours``, the mean µs of each ``ct.launch`` as it runs on the device thread
(``cuda.tile.launch`` wrapped with a clock; the wrapper's own cost is in every column).

    source .devtk/setup.sh && python3 docs/records/probes/backward_thread.py
"""

import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention as ta

sys.path.insert(0, str(Path(__file__).parent))
from backward_host import _Empty, host  # noqa: E402

SHAPES = [(1, 8, 8, 256, 64), (8, 16, 16, 577, 64), (1, 32, 8, 4096, 128), (4, 12, 4, 1000, 96)]
CALLS, ROUNDS = 50, 7


def per_call(fn, on_thread=False):
    """Median over ROUNDS of the host µs per call of CALLS calls of ``fn`` (no sync inside),
    on the main thread or on a new thread."""
    result = {}

    def body():
        result["us"] = host(fn, CALLS, ROUNDS)

    if on_thread:
        worker = threading.Thread(target=body)
        worker.start()
        worker.join()
    else:
        body()
    return result["us"]


class _Launches:
    """``cuda.tile.launch`` wrapped for the whole run (before any plan takes it): with
    ``capture`` a list, each launch's arguments go into it; with ``clock`` a dict, each
    launch's µs add up per thread name. The wrapper's own cost is in every column."""

    def __init__(self):
        import cuda.tile as ct

        self.module, self.original = ct, ct.launch
        self.capture = None
        self.clock = None
        ct.launch = self

    def __call__(self, *args, **kwargs):
        if self.capture is not None:
            self.capture.append((args, kwargs))
        if self.clock is None:
            return self.original(*args, **kwargs)
        start = time.perf_counter()
        try:
            return self.original(*args, **kwargs)
        finally:
            name = threading.current_thread().name
            total, count = self.clock.get(name, (0.0, 0))
            self.clock[name] = (total + (time.perf_counter() - start) * 1e6, count + 1)


LAUNCHES = _Launches()


def shape_rows(b, hq, hkv, s, d):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16,
                           generator=gen).requires_grad_() for h in (hq, hkv, hkv))
    g = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    leaves = (q, k, v)
    out = ta.sdpa(q, k, v, causal=True)
    torch.autograd.grad(out, leaves, g, retain_graph=True)  # resolves the kept backward
    node = out.grad_fn
    kept = node.kept.backward_plan
    lse = node.lse
    qd, kd, vd, od = (x.detach() for x in (q, k, v, out))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
    x = torch.randn(4, device="cuda", requires_grad=True)
    empty = _Empty.apply(x)
    ge = torch.ones_like(empty)

    grads = tuple(torch.empty_like(t) for t in (qd, kd, vd))
    delta = torch.empty_like(lse)
    run = kept._launch_backward
    stream = torch.cuda.current_stream().cuda_stream

    def alloc():
        like = torch.empty_like
        form = torch.contiguous_format
        return (like(qd, memory_format=form), like(kd, memory_format=form),
                like(vd, memory_format=form), torch.empty_like(lse))

    # one ct.launch: the first launch's arguments of the prepared run
    LAUNCHES.capture = captured = []
    run(stream, qd, kd, vd, od, g, lse, delta, grads)
    LAUNCHES.capture = None
    torch.cuda.synchronize()
    first_args, first_kwargs = captured[0]
    original = LAUNCHES.original

    fns = {
        "body": lambda: kept.backward(g, qd, kd, vd, od, lse, None),
        "alloc": alloc,
        "launch": lambda: run(stream, qd, kd, vd, od, g, lse, delta, grads),
        "ct.launch": lambda: original(*first_args, **first_kwargs),
    }
    rows = {
        "grad ours": per_call(lambda: torch.autograd.grad(out, leaves, g, retain_graph=True)),
        "grad cudnn": per_call(lambda: torch.autograd.grad(ref, leaves, g, retain_graph=True)),
        "grad empty": per_call(lambda: torch.autograd.grad(empty, (x,), ge, retain_graph=True)),
    }
    for name, fn in fns.items():
        rows[name] = (per_call(fn), per_call(fn, on_thread=True))
    LAUNCHES.clock = clock = {}
    for _ in range(5 * CALLS):
        torch.autograd.grad(out, leaves, g, retain_graph=True)
    torch.cuda.synchronize()
    for _ in range(5 * CALLS):
        kept.backward(g, qd, kd, vd, od, lse, None)
    torch.cuda.synchronize()
    LAUNCHES.clock = None
    per_thread = {name: total / count for name, (total, count) in clock.items()}
    return rows, per_thread, len(captured)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    table = []
    for shape in SHAPES:
        rows, per_thread, launches = shape_rows(*shape)
        b, hq, hkv, s, d = shape
        name = f"B{b} H{hq}/{hkv} S{s} D{d}"
        print(f"\n{name}: {launches} launches a backward", flush=True)
        for key, value in rows.items():
            if isinstance(value, tuple):
                print(f"  {key:11s} main {value[0]:7.1f}  thread {value[1]:7.1f}")
            else:
                print(f"  {key:11s} {value:7.1f}")
        for thread, us in per_thread.items():
            print(f"  ct.launch inside, on {thread}: {us:.1f} µs a launch")
        table.append((name, rows, per_thread))
    print("\n| shape | grad ours | grad cuDNN | grad empty | body main / thread | alloc main / "
          "thread | launch main / thread | one ct.launch main / thread |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows, _ in table:
        cells = [f"{rows['grad ours']:.1f}", f"{rows['grad cudnn']:.1f}",
                 f"{rows['grad empty']:.1f}"]
        cells += [f"{rows[k][0]:.1f} / {rows[k][1]:.1f}"
                  for k in ("body", "alloc", "launch", "ct.launch")]
        print(f"| {name} | " + " | ".join(cells) + " |")


class _Shell(torch.autograd.Function):
    """A node shaped like ours (q, k, v in, out alone out) whose backward does ``level``
    parts of our node's work and returns gradients made once: 0 nothing saved, 1 the five
    saved tensors read back, 2 also ctx's attributes read and the eager-route checks."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, call):
        out = torch.empty_like(q)
        level, grads = call
        ctx.level, ctx.grads = level, grads
        if level >= 1:
            ctx.save_for_backward(q, k, v, out, sinks)
        ctx.lse, ctx.kept, ctx.flags = None, None, (True, None, False, -1, -1, 0.0)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.level >= 1:
            q, k, v, out, sinks = ctx.saved_tensors
            if ctx.level >= 2:
                from tiledattention.entry_points._autograd import eager
                kept, lse, flags = ctx.kept, ctx.lse, ctx.flags
                _ = sinks is None and grad_out.stride() == out.stride() and eager(grad_out)
        return (*ctx.grads, None, None)


def nodes():
    """Host µs per ``torch.autograd.grad`` through :class:`_Shell` at each level, beside an
    empty one-input node, ours and cuDNN's, threads on and off (B8 H16 S577 D64 bf16)."""
    b, hq, hkv, s, d = 8, 16, 16, 577, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16,
                           generator=gen).requires_grad_() for h in (hq, hkv, hkv))
    g = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    leaves = (q, k, v)
    grads = tuple(torch.zeros_like(t) for t in leaves)
    outs = {f"shell {level}": _Shell.apply(q, k, v, None, (level, grads)) for level in (0, 1, 2)}
    outs["ours"] = ta.sdpa(q, k, v, causal=True)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        outs["cudnn"] = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = torch.randn(4, device="cuda", requires_grad=True)
    empty = _Empty.apply(x)
    rows = {"empty (1 input)": lambda: torch.autograd.grad(empty, (x,), torch.ones_like(empty),
                                                           retain_graph=True)}
    for name, out in outs.items():
        rows[name] = (lambda out=out: torch.autograd.grad(out, leaves, g, retain_graph=True))
    print("\nnode forms, B8 H16/16 S577 D64: host µs a torch.autograd.grad, threads on / off")
    for name, fn in rows.items():
        on = per_call(fn)
        torch.autograd.set_multithreading_enabled(False)
        off = per_call(fn)
        torch.autograd.set_multithreading_enabled(True)
        print(f"  {name:16s} {on:7.1f} / {off:7.1f}", flush=True)


if __name__ == "__main__":
    import sys

    nodes() if "--nodes" in sys.argv else main()
