"""Where the host time of a backward call goes (issue 47's lean host path), on the GPU: µs per
call with no synchronisation in the loop (the GPU drained before each round of calls), and the
phases of one call, synchronised around it.

For each shape (bf16, causal, ``[B, H, S, D]``), with autograd's worker threads on (torch's
default: a CUDA node's backward runs on the device's engine thread) and off
(``torch.autograd.set_multithreading_enabled(False)``: on the calling thread):

- ``ours bwd`` / ``cudnn bwd``: ``torch.autograd.grad`` of one kept output (``retain_graph``);
- ``ours fwd+bwd`` / ``cudnn fwd+bwd``: both, on a fresh graph each call;
- ``empty bwd``: the same through a Python ``autograd.Function`` whose forward is one torch op
  and whose backward returns the gradient (autograd's own cost of a Python node);
- ``ours bwd general`` / ``ours fwd+bwd general``: the same with the node on its general path
  (the forward hands it no kept call, so it builds the backward's signature every call: the
  route before the kept backward plan);
- ``ours direct``: our backward's body (``_autograd._backward``) called on the main thread, no
  autograd;
- phases of one ``ours bwd`` call: from ``torch.autograd.grad`` to our node's ``backward``
  entered (``to node``), inside it (``in node``), and from its return to ``grad``'s
  (``back``), medians of 50 synchronised calls;
- ``direct, grad leaves`` / ``direct, no_grad``: the body on the tensors that require grad (as
  the node passes them), and under ``torch.no_grad`` as well (as the node runs); ``fwd
  no_grad`` and ``fwd no_grad detached``: a no-grad forward on those tensors and on detached
  ones; then a cProfile of 200 ``ours bwd`` calls with the threads off (the second shape).

    source .devtk/setup.sh && python3 docs/records/probes/backward_host.py [--ab | --launch-ab]

``--ab``: in one process, threads on, the training route as it is (``new``) against the route
of 84b330a (``old``: the node on its general path, the kept calls launching through
``Family.forward_with_lse`` / ``Family.backward`` as they did), and cuDNN, interleaved round
by round (15 rounds of 50 calls; medians); a table. ``--launch-ab``: the same, ``old`` being
the route as it is but for the kept backward's launch, made as before its argument tuples were
built once (``launch`` with its checks and a scratch dict every call).
"""

import cProfile
import pstats
import statistics
import sys
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tiledattention as ta
from tiledattention.entry_points import _autograd, _training

SHAPES = [(1, 8, 8, 256, 64), (8, 16, 16, 577, 64), (1, 32, 8, 4096, 128)]


def inputs(b, hq, hkv, s, d):
    """``(q, k, v, g, ours, cudnn)``: bf16 leaves that require grad, a gradient of the output,
    and our causal attention and torch's cuDNN backend's on them."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16,
                           generator=gen).requires_grad_() for h in (hq, hkv, hkv))
    g = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)

    def ours():
        return ta.sdpa(q, k, v, causal=True)
    return q, k, v, g, ours, cudnn


class _Empty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, g):
        return g


def host(fn, calls=50, rounds=5):
    """Median over ``rounds`` of the host µs per call of ``calls`` calls, no sync inside."""
    fn()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def phases(out, leaves, g, calls=50):
    """Medians (µs) of: grad called -> our backward entered, inside it, its return ->
    grad returned; and the name of the thread it ran on."""
    stamps = {}
    original = _autograd._EagerForwardLse.backward

    def timed(ctx, grad_out):
        stamps["in"] = time.perf_counter()
        stamps["thread"] = threading.current_thread().name
        result = original(ctx, grad_out)
        stamps["out"] = time.perf_counter()
        return result

    _autograd._EagerForwardLse.backward = staticmethod(timed)
    parts = {"to node": [], "in node": [], "back": []}
    try:
        for _ in range(calls + 3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            torch.autograd.grad(out, leaves, g, retain_graph=True)
            end = time.perf_counter()
            parts["to node"].append((stamps["in"] - start) * 1e6)
            parts["in node"].append((stamps["out"] - stamps["in"]) * 1e6)
            parts["back"].append((end - stamps["out"]) * 1e6)
    finally:
        _autograd._EagerForwardLse.backward = original
    return {k: statistics.median(v[3:]) for k, v in parts.items()}, stamps["thread"]


class general_route:
    """Until ``undo``: the eager forward hands its node no kept call (the general path)."""

    def __init__(self):
        self.original = _training.training_forward
        _training.training_forward = lambda *a, **kw: (*self.original(*a, **kw)[:2], None)

    def undo(self):
        _training.training_forward = self.original


def no_grad(fn):
    return torch.no_grad()(fn)


class old_route:
    """Until ``undo``: the training route of 84b330a (the general path in the node; the kept
    forward and backward calls launching through the family's ``forward_with_lse`` /
    ``backward`` on every call, as ``_training._Resolved`` did)."""

    def __init__(self):
        resolved = _training._Resolved
        self.saved = (resolved.forward, resolved.backward)
        self.general = general_route()

        def forward(kept, q, k, v, sinks):
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
            lse = _training._row_stat(kept.problem, q.device)
            stream = torch._C._cuda_getCurrentRawStream(kept.device)
            kept.family.forward_with_lse(stream, q, k, v, out, lse, kept.problem, kept.schedule,
                                         kept.scale, kept.device, sinks=sinks)
            return out, lse

        def backward(kept, grad_out, q, k, v, out, lse, grads, with_row_sums=False):
            grads = tuple(torch.empty_like(x, memory_format=torch.contiguous_format)
                          for x in (q, k, v))
            delta = _training._row_stat(kept.problem, q.device)
            stream = torch._C._cuda_getCurrentRawStream(kept.device)
            kept.family.backward(stream, kept.problem, kept.schedule, kept.scale, q, k, v, out,
                                 grad_out, lse, delta, grads)
            return (*grads, delta) if with_row_sums else grads
        resolved.forward, resolved.backward = forward, backward

    def undo(self):
        _training._Resolved.forward, _training._Resolved.backward = self.saved
        self.general.undo()


class generic_launch:
    """Until ``undo``: the kept backward launches as before its argument tuples were built once
    (``launch`` with its checks and a scratch dict, the plan kept per call), all else alike."""

    def __init__(self):
        from tiledattention.core import _plans as hot
        from tiledattention.kernels.backward._family import allocate_scratch
        from tiledattention.kernels.backward._launch import launch, launches

        resolved = _training._Resolved
        self.saved = resolved.backward
        plans = {}

        def backward(kept, grad_out, q, k, v, out, lse, grads, with_row_sums=False):
            form = hot.contiguous_format
            grads = (hot.empty_like(q, memory_format=form), hot.empty_like(k, memory_format=form),
                     hot.empty_like(v, memory_format=form))
            delta = _training._row_stat(kept.problem, q.device)
            plan = plans.get(id(kept))
            if plan is None:
                plan = plans[id(kept)] = launches(kept.problem, kept.schedule, kept.scale)
            launch(hot.raw_stream(kept.device), plan, q, k, v, out, grad_out, lse, delta,
                   *grads, allocate_scratch(plan, q.device))
            return (*grads, delta) if with_row_sums else grads
        resolved.backward = backward

    def undo(self):
        _training._Resolved.backward = self.saved


def ab(rounds=15, calls=50, old=None):
    """The ``--ab`` table (``--launch-ab``: ``old`` is :class:`generic_launch`)."""
    print("| shape | route | fwd | bwd | fwd+bwd |\n|---|---|---|---|---|")
    for b, hq, hkv, s, d in SHAPES:
        q, k, v, g, ours, cudnn = inputs(b, hq, hkv, s, d)
        routes = {"new": (ours, None), "old": (ours, old or old_route), "cudnn": (cudnn, None)}
        kept, times = {}, {}
        for name, (fn, route) in routes.items():
            patch = route() if route else None
            kept[name] = fn()
            for _ in range(3):  # warm: the first backward resolves the kept one
                torch.autograd.grad(fn(), (q, k, v), g)
            if patch:
                patch.undo()
        for _ in range(rounds):
            for name, (fn, route) in routes.items():
                patch = route() if route else None
                out = kept[name]
                for what, step in (("fwd", fn),
                                   ("bwd", lambda: torch.autograd.grad(out, (q, k, v), g,
                                                                       retain_graph=True)),
                                   ("fwd+bwd", lambda: torch.autograd.grad(fn(), (q, k, v), g))):
                    times.setdefault((name, what), []).append(host(step, calls, rounds=1))
                if patch:
                    patch.undo()
        for name in routes:
            print(f"| B{b} H{hq}/{hkv} S{s} D{d} | {name} | " + " | ".join(
                f"{statistics.median(times[(name, w)]):.1f}" for w in ("fwd", "bwd", "fwd+bwd"))
                + " |")


def main():
    if "--ab" in sys.argv:
        ab()
        return
    if "--launch-ab" in sys.argv:
        ab(old=generic_launch)
        return
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    rows = []
    for b, hq, hkv, s, d in SHAPES:
        q, k, v, g, ours, cudnn = inputs(b, hq, hkv, s, d)
        leaves = (q, k, v)
        o_ours, o_cudnn, o_empty = ours(), cudnn(), _Empty.apply(q)
        with torch.no_grad():
            _, lse = ta.sdpa_with_lse(q, k, v, causal=True)
        shape = f"B{b} H{hq}/{hkv} S{s} D{d}"
        for threads in (True, False):
            torch.autograd.set_multithreading_enabled(threads)
            general = general_route()
            o_general = ours()
            row = {
                "ours bwd general": host(lambda: torch.autograd.grad(o_general, leaves, g,
                                                                     retain_graph=True)),
                "ours fwd+bwd general": host(lambda: torch.autograd.grad(ours(), leaves, g)),
            }
            general.undo()
            row = {
                "ours bwd": host(lambda: torch.autograd.grad(o_ours, leaves, g,
                                                             retain_graph=True)),
                **row,
                "cudnn bwd": host(lambda: torch.autograd.grad(o_cudnn, leaves, g,
                                                              retain_graph=True)),
                "empty bwd": host(lambda: torch.autograd.grad(o_empty, (q,), g,
                                                              retain_graph=True)),
                "ours fwd+bwd": host(lambda: torch.autograd.grad(ours(), leaves, g)),
                "cudnn fwd+bwd": host(lambda: torch.autograd.grad(cudnn(), leaves, g)),
                "ours direct": host(lambda: _autograd._backward(
                    g, q.detach(), k.detach(), v.detach(), o_ours.detach(), lse, True, None,
                    False, -1, -1, 0.0, None)),
                "direct, grad leaves": host(lambda: _autograd._backward(
                    g, q, k, v, o_ours, lse, True, None, False, -1, -1, 0.0, None)),
                "direct, no_grad": host(lambda: no_grad(_autograd._backward)(
                    g, q, k, v, o_ours, lse, True, None, False, -1, -1, 0.0, None)),
                "fwd no_grad": host(lambda: no_grad(ta.sdpa)(q, k, v, causal=True)),
                "fwd no_grad detached": host(lambda: no_grad(ta.sdpa)(
                    q.detach(), k.detach(), v.detach(), causal=True)),
            }
            split, thread = phases(o_ours, leaves, g)
            if not threads and s == 577:  # the node on this thread: cProfile sees it
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(200):
                    torch.autograd.grad(o_ours, leaves, g, retain_graph=True)
                profiler.disable()
                torch.cuda.synchronize()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
            print(f"== {shape} threads {'on' if threads else 'off'} (node ran on {thread})")
            for name, us in {**row, **{f"phase {k}": x for k, x in split.items()}}.items():
                print(f"  {name:20s} {us:8.1f} us")
            rows.append((shape, threads, row, split))
        torch.autograd.set_multithreading_enabled(True)
    names = list(rows[0][2]) + [f"phase {k}" for k in rows[0][3]]
    print("\n| shape | threads | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for shape, threads, row, split in rows:
        values = list(row.values()) + list(split.values())
        print(f"| {shape} | {'on' if threads else 'off'} | "
              + " | ".join(f"{x:.1f}" for x in values) + " |")


if __name__ == "__main__":
    main()
