"""The packed forward's kernel before and after a change, in one process (issue 50):
``varlen_attn``'s forward on packed batches of ``packed_batches.py``, each call once with the
kernel of this tree (``after``) and once with each forward kernel of ``--before`` (copies of
other ``tiledattention/kernels/forward/_kernel.py`` whose parameters match, named by their
files' stems: each is loaded beside this one and launched in its place on the same prepared
launch, grid and arguments),
FlashAttention-4's ``flash_attn_varlen_func`` beside where importable. Each output is checked
against the float32 reference first. Views: ``gpu`` (one call between events, L2 flushed, the
host's launch hidden) and ``loop`` (calls back to back, host counted, per call), contenders
interleaved (``tuner.measure.time_interleaved``).

    git show fae4fa3:tiledattention/kernels/forward/_kernel.py > before_kernel.py
    source .devtk/setup.sh && python3 docs/records/probes/packed_forward_ab.py \\
        --before before_kernel.py [--only a,b] [--set issue|new|all]
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

import tiledattention as ta  # noqa: E402
from tiledattention.kernels.forward import _launch  # noqa: E402
from tiledattention.tooling import varlen_reference  # noqa: E402
from tuner.measure import time_interleaved  # noqa: E402

BEFORE = {"on": None, "launches": 0}  # on: the name of the kernel launched in place


def load_before(path):
    """The ``attention_fwd`` of the kernel file at ``path``, imported inside the forward
    package (its relative imports resolve there)."""
    name = "tiledattention.kernels.forward._" + os.path.basename(path).removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.attention_fwd


def launch_before_when_asked(before):
    """Make every prepared forward launch run ``before[BEFORE["on"]]`` (with the same hints)
    while ``BEFORE["on"]`` names one."""
    run = _launch.PreparedLaunch.run
    twins = {}

    def patched(self, stream, arrays):
        if BEFORE["on"] is None:
            return run(self, stream, arrays)
        kernel = self.kernel
        key = (id(kernel), BEFORE["on"])
        if key not in twins:
            twins[key] = before[BEFORE["on"]].replace_hints(
                **dataclasses.asdict(kernel._compiler_options))
        self.kernel = twins[key]
        BEFORE["launches"] += 1
        try:
            return run(self, stream, arrays)
        finally:
            self.kernel = kernel

    _launch.PreparedLaunch.run = patched


def calls(lengths, hq, hkv, d, causal, dtype, names):
    """``{name: call}`` of the contenders on one packed batch, and each output's relative L2
    error against the float32 reference."""
    q, k, v, _, cu, longest, _ = packed_call(lengths, hq, hkv, d, causal, dtype)
    ref = varlen_reference(q.float(), k.float(), v.float(), cu, cu, causal=causal)

    def ours():
        return ta.varlen_attn(q, k, v, cu, cu, longest, longest, is_causal=causal,
                              enable_gqa=hq != hkv)

    def in_place(name):
        def call():
            BEFORE["on"] = name
            try:
                return ours()
            finally:
                BEFORE["on"] = None
        return call

    fns = {name: in_place(name) for name in names}
    fns["after"] = ours
    fa4 = fa4_call(cu, longest, causal)
    if fa4 is not None:
        fns["flash-attn-4"] = lambda: fa4(q, k, v)
    errs = {}
    with torch.no_grad():
        for name, fn in fns.items():
            errs[name] = rel(fn(), ref)
    return fns, errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="kernel files, comma-separated")
    ap.add_argument("--only", default="")
    ap.add_argument("--set", default="issue", choices=("issue", "new", "all"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--views", default="gpu,loop")
    args = ap.parse_args()
    before = {os.path.basename(p).removesuffix(".py"): load_before(p)
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
        fns, errs = calls(lengths, hq, hkv, d, causal, dtype, list(before))
        flops = pairs(lengths, causal) * 4 * hq * d
        print(f"# {name}: {len(lengths)} seqs {min(lengths)}-{max(lengths)}, H {hq}/{hkv} "
              f"D {d} causal {causal} {dtype}; errors " +
              ", ".join(f"{k} {e:.2e}" for k, e in errs.items()), flush=True)
        with torch.no_grad():
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
