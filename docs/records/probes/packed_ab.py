"""A packed-batch kernel file before and after a change, in one process (issue 50):
``varlen_attn``'s forward (or, ``--kernel backward``, its backward on a kept forward) on packed
batches of ``packed_batches.py``, each call once with the kernels of this tree (``after``) and
once with those of each file of ``--before`` (copies of other
``tiledattention/kernels/<kernel>/_kernel.py`` whose kernels' parameters match, named by their
files' stems: each is loaded beside this one and every kernel of it launched in place of the
same-named one, with the same grid and arguments), FlashAttention-4's
``flash_attn_varlen_func`` beside where importable. Each output (or each gradient) is checked
against the float32 reference first. Views: ``gpu`` (one call between events, L2 flushed, the
host's launch hidden) and ``loop`` (calls back to back, host counted, per call), contenders
interleaved (``tuner.measure.time_interleaved``).

    git show fae4fa3:tiledattention/kernels/forward/_kernel.py > before_kernel.py
    source .devtk/setup.sh && python3 docs/records/probes/packed_ab.py \\
        --before before_kernel.py [--kernel forward|backward] [--only a,b] [--set issue|new|all]
"""

import argparse
import dataclasses
import importlib.util
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from packed_batches import (batches, fa4_call, new_batches, packed_call, pairs,  # noqa: E402
                            rel)

import cuda.tile as ct  # noqa: E402
import tiledattention as ta  # noqa: E402
from tiledattention.core import _aot  # noqa: E402
from tiledattention.tooling import varlen_reference  # noqa: E402
from tuner.measure import time_interleaved  # noqa: E402

BEFORE = {"on": None, "launches": 0}  # on: the name of the kernel launched in place


def load_before(path, kernel):
    """The kernels (``ct.kernel`` objects by name) of the kernel file at ``path``, imported
    inside the ``kernel`` family's package (its relative imports resolve there)."""
    name = f"tiledattention.kernels.{kernel}._" + os.path.basename(path).removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {n: k for n, k in vars(module).items() if isinstance(k, ct.kernel)}


def launch_before_when_asked(before):
    """Make every launch (``_aot.launch``) of a kernel that ``before[BEFORE["on"]]`` has by
    name run that one instead (with the same hints) while ``BEFORE["on"]`` names a file."""
    run = _aot.launch
    twins = {}

    def patched(stream, grid, kernel, args, **options):
        name = getattr(getattr(kernel, "_pyfunc", None), "__name__", None)
        if BEFORE["on"] is None or name not in before[BEFORE["on"]]:
            return run(stream, grid, kernel, args, **options)
        key = (id(kernel), BEFORE["on"])
        if key not in twins:
            twins[key] = before[BEFORE["on"]][name].replace_hints(
                **dataclasses.asdict(kernel._compiler_options))
        BEFORE["launches"] += 1
        return run(stream, grid, twins[key], args, **options)

    _aot.launch = patched


def reference_gradients(q, k, v, do, cu, causal):
    """The float32 reference's ``dq, dk, dv`` for the packed batch, one query head at a time
    (a long sequence's float32 scores for every head at once would not fit)."""
    dq, dk, dv = (torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    for h in range(q.shape[1]):
        g = h // rep
        leaves = [x[:, i:i + 1].float().requires_grad_() for x, i in ((q, h), (k, g), (v, g))]
        out = varlen_reference(*leaves, cu, cu, causal=causal)
        grads = torch.autograd.grad(out, leaves, do[:, h:h + 1].float())
        dq[:, h:h + 1] = grads[0]
        dk[:, g:g + 1] += grads[1]
        dv[:, g:g + 1] += grads[2]
    return dq, dk, dv


def calls(lengths, hq, hkv, d, causal, dtype, names, kernel):
    """``{name: call}`` of the contenders on one packed batch (``kernel``: ``forward`` or
    ``backward``), and each one's relative L2 error against the float32 reference (the
    backward's: the largest of its three gradients')."""
    q, k, v, do, cu, longest, _ = packed_call(lengths, hq, hkv, d, causal, dtype)

    def ours(q, k, v):
        return ta.varlen_attn(q, k, v, cu, cu, longest, longest, is_causal=causal,
                              enable_gqa=hq != hkv)

    def backward_of(fn):
        """``fn``'s backward on one kept forward of it."""
        kept = [x.detach().requires_grad_() for x in (q, k, v)]
        out = fn(*kept)
        return lambda: torch.autograd.grad(out, kept, do, retain_graph=True)

    fns = {"after": ours}
    fa4 = fa4_call(cu, longest, causal)
    if fa4 is not None:
        fns["flash-attn-4"] = fa4
    if kernel == "forward":
        ref = varlen_reference(q.float(), k.float(), v.float(), cu, cu, causal=causal)
        fns = {name: (lambda fn=fn: fn(q, k, v)) for name, fn in fns.items()}
    else:
        ref = reference_gradients(q, k, v, do, cu, causal)
        fns = {name: backward_of(fn) for name, fn in fns.items()}  # (this tree's forward)
    after = fns["after"]

    def in_place(name):
        def call():
            BEFORE["on"] = name
            try:
                return after()
            finally:
                BEFORE["on"] = None
        return call

    fns = {**{name: in_place(name) for name in names}, **fns}
    errs = {}
    for name, fn in fns.items():
        with torch.set_grad_enabled(kernel == "backward"):
            got = fn()
        errs[name] = (rel(got, ref) if kernel == "forward" else
                      max(rel(g, r) for g, r in zip(got, ref)))
    return fns, errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="kernel files, comma-separated")
    ap.add_argument("--kernel", default="forward", choices=("forward", "backward"))
    ap.add_argument("--only", default="")
    ap.add_argument("--set", default="issue", choices=("issue", "new", "all"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--views", default="gpu,loop")
    args = ap.parse_args()
    before = {os.path.basename(p).removesuffix(".py"): load_before(p, args.kernel)
              for p in args.before.split(",")}
    launch_before_when_asked(before)
    first = next(iter(before))  # the table's "before"
    chosen = {}
    if args.set in ("issue", "all"):
        chosen.update(batches())
    if args.set in ("new", "all"):
        chosen.update(new_batches())
    names = args.only.split(",") if args.only else list(chosen)
    rows = []
    for name in names:
        lengths, hq, hkv, d, causal, dtype = chosen[name]
        fns, errs = calls(lengths, hq, hkv, d, causal, dtype, list(before), args.kernel)
        flops = pairs(lengths, causal) * 4 * hq * d * (2.5 if args.kernel == "backward" else 1)
        print(f"# {name}: {len(lengths)} seqs {min(lengths)}-{max(lengths)}, H {hq}/{hkv} "
              f"D {d} causal {causal} {dtype}; errors " +
              ", ".join(f"{k} {e:.2e}" for k, e in errs.items()), flush=True)
        with torch.set_grad_enabled(args.kernel == "backward"):
            for view in args.views.split(","):
                times = time_interleaved(fns, rounds=args.rounds, flush_l2=view == "gpu",
                                         loop=view == "loop")
                us = {k: t.median_ms * 1e3 for k, t in times.items()}
                rows.append((name, view, us, flops))
                print(f"  {view}: " + ", ".join(f"{k} {u:.1f} us" for k, u in us.items()),
                      flush=True)
    print(f"# launches of the kernels in place: {BEFORE['launches']}")
    names = [*before, "after"]
    print(f"\n({first}: before; speed-ups over it; ÷ FA4: FA4's time over each)\n\n"
          "| batch | view | " + " | ".join(f"{n} µs" for n in names) + " | " +
          " | ".join(f"{n} speed-up" for n in names[1:]) + " | after TF/s | " +
          " | ".join(f"÷ FA4 {n}" for n in names) + " |\n" +
          "|---" * (3 + 2 * len(names) + len(names) - 1) + "|")
    for name, view, us, flops in rows:
        fa = us.get("flash-attn-4")
        ratio = (lambda x: f"{fa / x:.2f}") if fa else (lambda x: "-")
        print(f"| {name} | {view} | " + " | ".join(f"{us[n]:.1f}" for n in names) + " | " +
              " | ".join(f"{us[first] / us[n]:.2f}x" for n in names[1:]) +
              f" | {flops / us['after'] / 1e6:.0f} | " +
              " | ".join(ratio(us[n]) for n in names) + " |")


if __name__ == "__main__":
    main()
