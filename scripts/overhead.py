"""Host overhead of ``tiledattention.sdpa`` per warm call, and of the torch op under
``torch.compile(mode="reduce-overhead")`` against eager.

    python scripts/overhead.py [--out DIR] [--calls 2000] [--repeats 7] [--skip-compile]

Part 1, B=1, H=1, S=128, D=64, bf16, causal (tiny GPU work: the host side dominates). Each
figure is the median over ``--repeats`` rounds of ``--calls`` calls, the variants interleaved
round by round, in microseconds per call:

- (a) baseline: ``torch.empty`` of the output plus a bare ``ct.launch`` on
  ``torch.cuda.current_stream()`` of the kernel, grid and arguments sdpa's plan holds;
- (a') the same with the cheapest equivalents sdpa itself uses (``torch.empty_like(q)``, the
  raw current stream as an int);
- (b) ``tiledattention.sdpa(q, k, v, causal=True)``; (c) the same with ``out=`` a preallocated
  buffer; "bare": one prebuilt argument tuple (reused output) launched on a stream fetched once.

Target: (b) - (a) <= 3 µs. Then the parts of a call, one by one.

Part 2, a decode step (B=1, H_q=32, H_kv=8, S_q=1, S_k=4096, D=128, bf16): the op that
``tiledattention.integrations`` exposes (``attention``) eager, and compiled (default mode;
``reduce-overhead`` with plain inputs and with K/V marked static, as a static KV cache would be)
after warm-up calls, with the
evidence whether CUDA graphs replayed (graph replays per call, cudagraph skips counted by
inductor, graph breaks, recompiles) and two references: a hand-captured CUDA graph of the op
(no cudagraph-tree bookkeeping, no input copies) and the copies of q, k, v that cudagraph trees
make before each replay for inputs that are not static. Then torch.compile's own floor (``x * 2``
and torch's SDPA, each eager and under reduce-overhead) and a decode attention block (query
projection, attention over a static cache, output projection) eager and under reduce-overhead,
with the op and with torch's SDPA. Part 3 (``--layers L``, 0 to skip): a whole decode step of an
L-layer model (each layer: query projection, attention over its static 4096-key cache, output
projection, residual) eager, under reduce-overhead and as a hand-captured CUDA graph of the
eager step, with the op, with torch's SDPA and with no attention (the projections alone):
torch.compile's per-call floor is paid once a step, not once a layer. Logs (perf hints, cudagraphs,
recompiles, graph breaks) and a cProfile of compiled calls go to DIR (default ``$OUT`` or a
temporary directory). A failure of any compiled variant is reported in the table.

The table is printed last.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import os
import pstats
import statistics
import sys
import tempfile
import time
import traceback
from typing import Callable

from _gpu import require_gpu

import cuda.tile as ct
import torch
import torch.nn.functional as F

import tiledattention
from tiledattention import problem_from_arrays

Rows = list  # of (what, µs per call or text, note)


def interleaved(variants: dict[str, Callable[[], object]], calls: int, repeats: int
                ) -> dict[str, float]:
    """Median µs per call of each variant; rounds interleave the variants."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():  # warm
        fn()
    for _ in range(repeats):
        for name, fn in variants.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}


def fmt(x: object) -> str:
    return f"{x:.2f}" if isinstance(x, float) else str(x)


def captured(fn: Callable[[], object]) -> tuple[Callable[[], object], object]:
    """A hand-captured CUDA graph of ``fn`` (warmed on a side stream): its replay, and the
    output the capture holds."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph.replay, out


# -- part 1 -------------------------------------------------------------------------------------
def forward_overhead(calls: int, repeats: int) -> Rows:
    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    resolution = tiledattention.explain(q, k, v, causal=True)
    assert resolution.family == "forward", resolution
    reference = tiledattention.sdpa(q, k, v, causal=True)  # keeps the plan
    problem, _ = problem_from_arrays(q, k, v, True, None)
    # the plan sdpa built: validate -> choose the family -> resolve -> plan, as sdpa does (the
    # same resolution, normalised schedule, grid and constants)
    runtime = tiledattention.runtime()
    index = q.get_device()
    family = tiledattention.choose_family(tiledattention.device_info(index).arch, problem)
    schedule = runtime.resolution(family, family.plan_problem(problem), index).schedule
    plan = family.plan(tiledattention.Call.of(problem, causal=True), schedule, index)
    grid, kernel, scalars, shape = plan.grid, plan.kernel, plan.scalars, plan.out_shape
    dtype, device = q.dtype, q.device
    raw_stream = torch._C._cuda_getCurrentRawStream
    reused = torch.empty_like(q)
    prebuilt = (q, k, v, reused) + scalars
    stream_once = torch.cuda.current_stream()
    preallocated = torch.empty_like(q)

    def baseline():  # (a)
        out = torch.empty(shape, dtype=dtype, device=device)
        ct.launch(torch.cuda.current_stream(), grid, kernel, (q, k, v, out) + scalars)

    def cheapest():  # (a')
        out = torch.empty_like(q)
        ct.launch(raw_stream(0), grid, kernel, (q, k, v, out) + scalars)

    def bare():
        ct.launch(stream_once, grid, kernel, prebuilt)

    sdpa = tiledattention.sdpa

    def full():  # (b)
        sdpa(q, k, v, causal=True)

    def into():  # (c)
        sdpa(q, k, v, causal=True, out=preallocated)

    t = interleaved({"bare": bare, "a": baseline, "a'": cheapest, "b": full, "c": into},
                    calls, repeats)
    torch.cuda.synchronize()
    same = (torch.equal(sdpa(q, k, v, causal=True), reference)
            and torch.equal(sdpa(q, k, v, causal=True, out=preallocated), reference))

    def signature():  # a copy of sdpa's warm-path signature (tiledattention.sdpa)
        return (q.shape, q.stride(), q.dtype, index, k.dtype, k.get_device(), v.dtype,
                v.get_device(), True, bool, None, type(None), None)

    def clear_of(out, q, k, v):  # a copy of sdpa's out= overlap check (byte spans of 1)
        o = out.data_ptr()
        end = o + 1
        p = q.data_ptr()
        if p < end and o < p + 1:
            return False
        p = k.data_ptr()
        if p < end and o < p + 1:
            return False
        p = v.data_ptr()
        return not (p < end and o < p + 1)

    key = family.plan_key(signature(), k, v)
    if runtime.plan(key) is None:
        raise SystemExit("the signature copy no longer matches sdpa's: no plan kept under it")
    parts = interleaved({
        "signature tuple": signature,
        "plan key (K/V shapes and strides)": lambda: family.plan_key(key[0], k, v),
        "plan lookup (hash and dict hit)": lambda: runtime.plan(key),
        "torch.empty(shape, dtype=, device=)": lambda: torch.empty(shape, dtype=dtype,
                                                                   device=device),
        "q.new_empty(shape)": lambda: q.new_empty(shape),
        "torch.empty_like(q)": lambda: torch.empty_like(q),
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "torch._C._cuda_getCurrentRawStream(0)": lambda: raw_stream(0),
        "(q, k, v, out) + scalars": lambda: (q, k, v, reused) + scalars,
        "out= overlap check": lambda: clear_of(preallocated, q, k, v),
    }, calls, repeats)

    describe = resolution.schedule.describe()
    rows: Rows = [
        (f"**forward B1 H1 S128 D64 bf16 causal** ({describe}, {resolution.source})", "", ""),
        ("bare ct.launch, prebuilt args, reused output, stream fetched once", t["bare"], ""),
        ("(a) torch.empty + ct.launch(torch.cuda.current_stream())", t["a"], "baseline"),
        ("(a') torch.empty_like(q) + ct.launch(raw stream int)", t["a'"], ""),
        ("(b) tiledattention.sdpa", t["b"], "" if same else "RESULT DIFFERS"),
        ("(c) tiledattention.sdpa(out=preallocated)", t["c"], ""),
        ("**(b) - (a)**", t["b"] - t["a"], "target <= 3: " + ("met" if t["b"] - t["a"] <= 3
                                                              else "NOT met")),
        ("(b) - (a')", t["b"] - t["a'"], "against sdpa's own allocation and stream"),
        ("(c) - bare", t["c"] - t["bare"], "out= against a bare launch"),
    ]
    rows += [(f"part: {name}", us, "") for name, us in parts.items()]
    return rows


# -- part 2 -------------------------------------------------------------------------------------
class ReplayCounter:
    """Counts torch.cuda.CUDAGraph.replay calls (cudagraph trees replay through it)."""

    def __init__(self) -> None:
        self.count = 0
        self._original = torch.cuda.CUDAGraph.replay

    def __enter__(self) -> "ReplayCounter":
        original = self._original

        def replay(graph):
            self.count += 1
            return original(graph)

        torch.cuda.CUDAGraph.replay = replay
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.CUDAGraph.replay = self._original


def capture_logs(path: str) -> logging.Handler:
    """Send torch's logs (with perf hints, cudagraphs, recompiles, graph breaks on) to
    ``path`` as well."""
    try:
        torch._logging.set_logs(perf_hints=True, cudagraphs=True, recompiles=True,
                                graph_breaks=True)
    except Exception as exc:  # a torch without one of these names
        print(f"torch._logging.set_logs: {exc!r}", file=sys.stderr)
    handler = logging.FileHandler(path, mode="w")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    handler.addFilter(lambda record: bool(str(record.getMessage()).strip()))
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith("torch") and isinstance(logger, logging.Logger) and logger.handlers:
            logger.addHandler(handler)
    return handler


def compile_overhead(calls: int, repeats: int, out_dir: str) -> Rows:
    import tiledattention.integrations as ti
    from torch._dynamo.utils import counters

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn_like(k)
    family = tiledattention.explain(q, k, v).family
    log_path = os.path.join(out_dir, "compile_logs.txt")
    handler = capture_logs(log_path)
    attention = ti.attention

    # distinct functions: Dynamo keeps its compiled code per code object
    def eager_fn(q, k, v):
        return attention(q, k, v)

    def default_fn(q, k, v):
        return attention(q, k, v)

    def overhead_fn(q, k, v):
        return attention(q, k, v)

    def static_fn(q, k, v):
        return attention(q, k, v)

    # torch.compile's own floor: one trivial op, and torch's SDPA, compiled the same way
    x = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)

    def double(x):
        return x * 2

    def torch_sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    # a decode attention block: query projection, attention over a static cache, output
    # projection (one function per attention, so each is compiled on its own)
    hidden = 32 * 128
    w_q, w_o = (torch.randn(hidden, hidden, device="cuda", dtype=torch.bfloat16,
                            generator=gen) * hidden ** -0.5 for _ in range(2))
    h = torch.randn(1, 1, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)

    def block_ours(h, k, v):
        out = attention((h @ w_q).view(1, 1, 32, 128).transpose(1, 2), k, v)
        return out.transpose(1, 2).reshape(1, 1, hidden) @ w_o

    def block_torch(h, k, v):
        out = torch_sdpa((h @ w_q).view(1, 1, 32, 128).transpose(1, 2), k, v)
        return out.transpose(1, 2).reshape(1, 1, hidden) @ w_o

    rows: Rows = [("**decode step B1 Hq32/Hkv8 Sq1 Sk4096 D128 bf16** "
                   f"(family {family}; the op of tiledattention.integrations)", "", "")]
    variants: dict[str, Callable[[], object]] = {}
    notes: dict[str, str] = {}
    reference = None
    with torch.no_grad():
        reference = eager_fn(q, k, v)
        variants["eager tiledattention.sdpa (no torch op)"] = lambda: tiledattention.sdpa(q, k, v)
        variants["eager integrations.attention"] = lambda: eager_fn(q, k, v)
        variants["eager, the op dispatched (torch.ops.tiledattention.sdpa_fwd)"] = (
            lambda: torch.ops.tiledattention.sdpa_fwd(q, k, v, False, None))
        variants["eager x * 2"] = lambda: double(x)
        variants["eager torch SDPA"] = lambda: torch_sdpa(q, k, v)
        variants["block, eager: integrations.attention"] = lambda: block_ours(h, k, v)
        variants["block, eager: torch SDPA"] = lambda: block_torch(h, k, v)

        k_static, v_static, q_static = k.clone(), v.clone(), q.clone()
        compiled = [("compiled, mode=default", default_fn, {}, (q, k, v)),
                    ("compiled, mode=reduce-overhead", overhead_fn,
                     {"mode": "reduce-overhead"}, (q, k, v)),
                    ("compiled, reduce-overhead, k/v marked static (a static KV cache)", static_fn,
                     {"mode": "reduce-overhead"}, (q_static, k_static, v_static)),
                    ("compiled x * 2, reduce-overhead (torch.compile's floor)", double,
                     {"mode": "reduce-overhead"}, (x,)),
                    ("compiled torch SDPA, reduce-overhead, k/v static", torch_sdpa,
                     {"mode": "reduce-overhead"}, (q_static, k_static, v_static)),
                    ("block, reduce-overhead: integrations.attention, k/v static", block_ours,
                     {"mode": "reduce-overhead"}, (h, k_static, v_static)),
                    ("block, reduce-overhead: torch SDPA, k/v static", block_torch,
                     {"mode": "reduce-overhead"}, (h, k_static, v_static))]
        for name, fn, kwargs, args in compiled:
            skips = counters["inductor"]["cudagraph_skips"]
            breaks = sum(counters["graph_break"].values())
            graphs = counters["stats"]["unique_graphs"]
            try:
                if args[0] is q_static:  # the cache is static; each step's query is new
                    torch._dynamo.mark_static_address(k_static)
                    torch._dynamo.mark_static_address(v_static)
                run = torch.compile(fn, **kwargs)
                for _ in range(10):  # cudagraph trees: warm-up, record, then replays
                    result = run(*args)
                torch.cuda.synchronize()
                if fn in (default_fn, overhead_fn, static_fn) and not torch.equal(result,
                                                                             reference):
                    notes[name] = "RESULT DIFFERS from eager; "
                with ReplayCounter() as replays:
                    for _ in range(100):
                        run(*args)
                    torch.cuda.synchronize()
                notes[name] = notes.get(name, "") + (
                    f"graph replays per call {replays.count / 100:.2f}, cudagraph skips "
                    f"+{counters['inductor']['cudagraph_skips'] - skips}, graph breaks "
                    f"+{sum(counters['graph_break'].values()) - breaks}, graphs compiled "
                    f"+{counters['stats']['unique_graphs'] - graphs}")
                variants[name] = (lambda run, args: lambda: run(*args))(run, args)
            except Exception as exc:
                traceback.print_exc()
                rows.append((name, "failed", f"{type(exc).__name__}: {exc}"[:300]))

        try:  # a hand-captured CUDA graph of the op: no tree bookkeeping, no input copies
            replay, held = captured(lambda: eager_fn(q_static, k_static, v_static))
            notes["CUDA graph of the op, replayed"] = ("" if torch.equal(held, reference)
                                                       else "RESULT DIFFERS from eager")
            variants["CUDA graph of the op, replayed"] = replay
        except Exception as exc:
            traceback.print_exc()
            rows.append(("CUDA graph of the op, replayed", "failed",
                         f"{type(exc).__name__}: {exc}"[:300]))
        sources, targets = [q, k, v], [q_static, k_static, v_static]
        variants["copy of q, k, v into static buffers (torch._foreach_copy_)"] = (
            lambda: torch._foreach_copy_(targets, sources))

        times = interleaved(variants, calls, repeats)

        profile_path = os.path.join(out_dir, "compile_profile.txt")
        with open(profile_path, "w") as f:
            for name in ("compiled, mode=reduce-overhead",
                         "eager, the op dispatched (torch.ops.tiledattention.sdpa_fwd)"):
                if name not in variants:
                    continue
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(500):
                    variants[name]()
                torch.cuda.synchronize()
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
                f.write(f"== {name}: 500 calls\n{text.getvalue()}\n")
    for logger in logging.root.manager.loggerDict.values():
        if isinstance(logger, logging.Logger) and handler in logger.handlers:
            logger.removeHandler(handler)
    handler.close()

    # each compiled variant against the same function run eagerly
    eager_of = {"compiled x * 2": "eager x * 2", "compiled torch SDPA": "eager torch SDPA",
                "block, reduce-overhead: integrations": "block, eager: integrations.attention",
                "block, reduce-overhead: torch SDPA": "block, eager: torch SDPA",
                "compiled": "eager integrations.attention"}
    for name, us in times.items():
        note = notes.get(name, "")
        eager = next((times.get(e) for c, e in eager_of.items() if name.startswith(c)), None)
        if eager is not None:
            note = f"{us / eager:.2f}x eager" + (f"; {note}" if note else "")
        rows.append((name, us, note))
    eager, overhead = (times.get("eager integrations.attention"),
                       times.get("compiled, mode=reduce-overhead"))
    if overhead is not None and eager is not None:
        rows.append(("**reduce-overhead <= eager?**", overhead - eager,
                     ("yes" if overhead <= eager else "NO") + " (µs above eager)"))
    with open(log_path) as f:
        hints = [line.strip() for line in f if "cudagraph" in line.lower() or "skipping" in line]
    rows.append(("log lines mentioning cudagraphs", len(hints),
                 (hints[0][:200] if hints else "none") + f" ({log_path}; {profile_path})"))
    return rows


# -- part 3 -------------------------------------------------------------------------------------
def model_step_overhead(calls: int, repeats: int, layers: int) -> Rows:
    import tiledattention.integrations as ti
    from torch._dynamo.utils import counters

    gen = torch.Generator(device="cuda").manual_seed(3)
    hidden = 32 * 128

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen) * scale
    caches = [(rand(1, 8, 4096, 128), rand(1, 8, 4096, 128)) for _ in range(layers)]
    weights = [(rand(hidden, hidden, scale=hidden ** -0.5),
                rand(hidden, hidden, scale=hidden ** -0.5)) for _ in range(layers)]
    h = rand(1, 1, hidden)

    def torch_sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    def step(h, attend):  # the caches and weights are closed over: static addresses
        for (k, v), (w_q, w_o) in zip(caches, weights):
            out = attend((h @ w_q).view(1, 1, 32, 128).transpose(1, 2), k, v)
            h = h + out.transpose(1, 2).reshape(1, 1, hidden) @ w_o
        return h

    def step_ours(h):
        return step(h, ti.attention)

    def step_torch(h):
        return step(h, torch_sdpa)

    def step_none(h):  # the projections alone (attention's output: its query)
        return step(h, lambda q, k, v: q)

    rows: Rows = [(f"**decode step of a {layers}-layer model** (per layer: query projection, "
                   "attention over a static B1 Hq32/Hkv8 4096-key D128 bf16 cache, output "
                   "projection, residual)", "", "")]
    variants: dict[str, Callable[[], object]] = {}
    notes: dict[str, str] = {}
    with torch.no_grad():
        for label, fn in (("tiledattention (integrations.attention)", step_ours),
                          ("torch SDPA", step_torch), ("no attention", step_none)):
            reference = fn(h)
            variants[f"step eager: {label}"] = (lambda fn: lambda: fn(h))(fn)
            name = f"step reduce-overhead: {label}"
            try:
                skips = counters["inductor"]["cudagraph_skips"]
                breaks = sum(counters["graph_break"].values())
                run = torch.compile(fn, mode="reduce-overhead")
                for _ in range(10):  # cudagraph trees: warm-up, record, then replays
                    result = run(h)
                torch.cuda.synchronize()
                with ReplayCounter() as replays:
                    for _ in range(20):
                        run(h)
                    torch.cuda.synchronize()
                err = ((result.float() - reference.float()).norm() / reference.float().norm())
                notes[name] = (f"rel. L2 vs eager {err.item():.1e}, graph replays per call "
                               f"{replays.count / 20:.2f}, cudagraph skips "
                               f"+{counters['inductor']['cudagraph_skips'] - skips}, graph "
                               f"breaks +{sum(counters['graph_break'].values()) - breaks}")
                variants[name] = (lambda run: lambda: run(h))(run)
            except Exception as exc:
                traceback.print_exc()
                rows.append((name, "failed", f"{type(exc).__name__}: {exc}"[:300]))
            name = f"step CUDA graph, replayed: {label}"
            try:
                variants[name] = captured(lambda fn=fn: fn(h))[0]
            except Exception as exc:
                traceback.print_exc()
                rows.append((name, "failed", f"{type(exc).__name__}: {exc}"[:300]))
        times = interleaved(variants, calls, repeats)
    for name, us in times.items():
        label = name.split(": ", 1)[1]
        eager, graph = (times.get(f"step eager: {label}"),
                        times.get(f"step CUDA graph, replayed: {label}"))
        note = notes.get(name, "")
        if "eager" not in name and eager:
            note = f"{us / eager:.2f}x eager" + (f", {us / graph:.2f}x the graph"
                                                  if graph and "graph" not in name else "") + (
                f"; {note}" if note else "")
        rows.append((name, us, note))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp(),
                        help="directory for the compile logs and profile (default $OUT)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--layers", type=int, default=16,
                        help="layers of the model whose decode step part 3 times (0: skip)")
    parser.add_argument("--only-model", action="store_true", help="part 3 alone")
    args = parser.parse_args(argv)
    require_gpu()
    os.makedirs(args.out, exist_ok=True)
    started = time.perf_counter()
    rows = [] if args.only_model else forward_overhead(args.calls, args.repeats)
    if args.layers and not args.skip_compile:
        try:
            rows += model_step_overhead(max(10, args.calls // 20), args.repeats, args.layers)
        except Exception as exc:
            traceback.print_exc()
            rows.append(("model step part", "failed", f"{type(exc).__name__}: {exc}"[:300]))
    if not args.skip_compile and not args.only_model:
        try:
            rows += compile_overhead(args.calls, max(3, args.repeats - 2), args.out)
        except Exception as exc:
            traceback.print_exc()
            rows.append(("torch.compile part", "failed", f"{type(exc).__name__}: {exc}"[:300]))
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{time.perf_counter() - started:.0f} s\n")
    print("| what | µs per call | note |\n|---|---|---|")
    for what, us, note in rows:
        print(f"| {what} | {fmt(us)} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
