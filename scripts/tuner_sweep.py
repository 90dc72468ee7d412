"""Issue 18, item 4 (GPU part): time a seeded uniform sample of the forward family's full search
space on held-out keys once, for ``scripts/tuner_replay.py`` to replay search strategies against.

Per key (default: three bf16 keys that are not in ``tiledattention/pretuned/sm_90.json``) the
sample is ``--count`` distinct *normalised* feasible schedules of the space the tuner searches
(``search_spaces`` "full", restricted to the problem): the architecture default and the tuner's
seeds (``tuner.search.seeds`` with the shipped table as the database: the default and
the nearest shipped winners; the one private name this script uses, so that the replay starts
from exactly the seeds the tuner would) first, then points drawn uniformly from the product
space, kept when they are their own normalisation and statically feasible (a uniform draw over the
normalised feasible schedules, as ``compile_sample`` draws), in a stream that is the same for
every key: keys whose spaces and normalisation agree get the same sample, and keys whose kernels
agree (same constants and array constraints: 3000 and 12008 tokens are both 8 mod 16) share
their compiles and JITs.

Then, within ``--budget`` seconds of wall time (default 420):

1. every distinct kernel compiles ahead in a ``CompilePool`` (``tuner.search.compile_job``:
   the compile-only build warms cuTile's disk cache for the launch); a failed compile is
   retried once, then recorded as ``compile-error``; one past ``--compile-timeout`` as
   ``timeout``; no new compile starts once the rest of the run (compiles in flight, checks,
   the timing rounds) would overrun the budget;
2. GPU worker processes (``--gpu-workers``, each an ``IsolatedExecutor``: a crash or a hang
   costs that candidate, not the run) JIT each compiled kernel (a disk-cache hit) and launch it
   once, then check its output against the float32 reference with the tuner's tolerance
   (``wrong`` otherwise);
3. every correct candidate is timed in ``--rounds`` interleaved rounds: per round, per key, each
   worker times each of its candidates once in a rotating order (CUDA events, L2 flushed
   and the GPU kept busy before each sample, as ``tuner.measure.time_interleaved`` samples),
   one worker at a time,
   after ``--warmup`` launches each before the first round; the median, interquartile spread,
   mean and minimum of its samples are kept.

Results go to ``--out`` (JSON, rewritten atomically as they come: a killed run leaves what it
had), progress to standard error, a short table per key to standard output last.

On the GPU machine (one H100, 16 cores; expect about 3-5 minutes, at most --budget + ~30 s):

    source .devtk/setup.sh && python scripts/tuner_sweep.py --out $OUT/sweep.json

Without a GPU, to see the sample and compile a few candidates for sm_90 on this CPU:

    python scripts/tuner_sweep.py --dry-run --dry-compile 6
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import queue
import random
import re
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import search_spaces  # noqa: E402
from tiledattention import FORWARD, Problem, Schedule, shipped_table  # noqa: E402
from tiledattention.kernels.forward import head_dim_parts  # noqa: E402
from tuner.measure import (CompilePool, IsolatedExecutor, TimingMode, WorkerDied,  # noqa: E402
                           WorkerTimeout, first_line, summarize)
from tuner.search import compile_job  # noqa: E402
from tuner.search import seeds as tuner_seeds  # noqa: E402

FORMAT = 1
DEFAULT_KEYS = ("2,32/8,3000,128,causal", "32,16,577,64,full", "1,32/8,12008,128,causal")
#: per-sample GPU time besides the kernel: the L2 flush (256 MB read) and the 0.2 ms spin
SAMPLE_OVERHEAD_MS = 0.35
#: the L2 flush before each sample reads at least this many bytes (twice the L2 where larger)
FLUSH_BYTES = 256 * 1024 * 1024
#: GPU cycles of the spin before each sample's start event (~0.2 ms at 2 GHz)
SPIN_CYCLES = 400_000
#: deadline of one check on a GPU worker (JIT, one launch, the reference comparison)
CHECK_S = 90.0
#: a launch's JIT when cuTile's disk cache has the cubin (~0.4 s: scripts/cache_probe.py, removed
#: after 361898e)
JIT_S = 0.5


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- keys and the sample -----------------------------------------------------------------------
def parse_key(text: str, dtype: str) -> Problem:
    """``B,H[/HKV],S[:SK],D,causal|full`` (the shape as ``tiledtune search --shape`` reads it)."""
    match = re.fullmatch(r"\s*(\d+),(\d+)(?:/(\d+))?,(\d+)(?::(\d+))?,(\d+),(causal|full)\s*",
                         text)
    if match is None or 0 in [int(g) for g in match.groups()[:6] if g is not None]:
        raise argparse.ArgumentTypeError(f"a key is B,H[/HKV],S[:SK],D,causal|full with "
                                         f"positive integers; got {text!r}")
    b, hq, hkv, sq, sk, d, mask = match.groups()
    return Problem(batch=int(b), heads_q=int(hq), heads_kv=int(hkv or hq), seqlen_q=int(sq),
                   seqlen_k=int(sk or sq), head_dim=int(d), dtype=dtype, causal=mask == "causal")


def key_space(problem: Problem, arch: str):
    spaces = search_spaces.family_space(FORWARD.name)
    return spaces.restrict(spaces.space(arch, "full"), problem)


def draw_sample(problem: Problem, space, first: list, count: int, seed: int
                ) -> tuple[list, float]:
    """``first`` (normalised, deduplicated), then uniformly drawn normalised feasible schedules
    until there are ``count``; and the estimated number of normalised feasible schedules of the
    space (from the acceptance rate of the draws). A point of the product space is kept when it
    is its own normalisation and statically feasible: every normalised feasible schedule is
    drawn with the same probability. The stream depends on ``seed`` and the space's dimensions
    only, so keys with the same space and normalisation draw the same points."""
    rng = random.Random(f"tuner-sweep:{seed}")
    names = list(space.choices)
    chosen = {s.key: s for s in first}
    draws = accepted = 0
    while len(chosen) < count:
        if draws > 2000 * count:
            raise SystemExit(f"{problem.describe()}: could not draw {count} distinct feasible "
                             f"schedules ({len(chosen)} after {draws:,} draws)")
        s = space.schedule({n: rng.choice(space.choices[n]) for n in names})
        draws += 1
        if FORWARD.normalise(problem, s).key != s.key:
            continue
        if space.infeasibility(space.arch, problem, s) is not None:
            continue
        accepted += 1
        chosen.setdefault(s.key, s)
    return list(chosen.values()), space.size * accepted / max(1, draws)


def compile_identity(problem: Problem, schedule: Schedule) -> str:
    """Schedules of two problems with equal identities compile to one kernel (what cuTile's
    caches key on), told from public facts: the normalised schedule (every hint and flag), the
    problem's facts the kernel's constants read (dtype, head-dim tiles, mask, whether the keys
    fill whole ``tile_n`` tiles) and those its arrays specialise on (dtype, each dim of q's and
    K/V's ``[B, H, S, D]`` shape a multiple of 16 or not). Should the kernel come to read
    another fact, two kernels could share an identity: the second then compiles at its check
    (the sweep is slower, its times the same)."""
    p = problem
    s = FORWARD.normalise(p, schedule)
    text = repr((s.key, p.dtype, head_dim_parts(p.head_dim, s.split_d), p.causal,
                 p.bottom_right, p.seqlen_k % s.tile_n == 0,
                 tuple(n % 16 == 0 for n in (p.batch, p.heads_q, p.seqlen_q, p.head_dim)),
                 tuple(n % 16 == 0 for n in (p.batch, p.heads_kv, p.seqlen_k, p.head_dim))))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def build_plan(args) -> dict:
    """The keys, each with its space, seeds and sample, and the compile jobs they need."""
    table = shipped_table(args.arch)
    shipped = [r.problem for r in (table or []) if r.family == FORWARD.name]
    keys = []
    for text in args.key or DEFAULT_KEYS:
        problem = parse_key(text, args.dtype)
        if problem in shipped and not args.allow_shipped:
            raise SystemExit(f"{problem.describe()} is in the shipped table: not held out "
                             "(--allow-shipped to sweep it anyway)")
        space = key_space(problem, args.arch)
        default = FORWARD.normalise(problem, FORWARD.default_schedule(args.arch, problem))
        seeds = tuner_seeds(FORWARD, table, args.arch, problem, space)
        start = time.monotonic()
        sample, feasible = draw_sample(problem, space, [default] + seeds, args.count,
                                       args.seed)
        keys.append({"problem": problem, "space": space, "default": default, "seeds": seeds,
                     "sample": sample, "feasible_estimate": feasible,
                     "draw_s": time.monotonic() - start})
    jobs: dict[str, dict] = {}  # compile identity -> job
    for k, key in enumerate(keys):
        for c, s in enumerate(key["sample"]):
            cid = compile_identity(key["problem"], s)
            job = jobs.setdefault(cid, {"id": cid, "problem": key["problem"], "schedule": s,
                                        "users": [], "priority": c})
            job["users"].append((k, c))
            job["priority"] = min(job["priority"], c)
    # the defaults and seeds first, then the sample in its order, keys interleaved: a run cut
    # short by the budget leaves every key with a like-sized sample
    order = sorted(jobs.values(), key=lambda j: (j["priority"], j["users"][0][0]))
    return {"keys": keys, "jobs": order}


# -- the GPU side (runs in the worker processes) -----------------------------------------------
class SweepExecutor:
    """In a GPU worker: each key's inputs and float32 reference, the launchers it has built (a
    restarted worker builds them again as they are asked for), and the tuner's sampler."""

    def __init__(self, problems: list[dict], device_index: int) -> None:
        import torch

        torch.cuda.set_device(device_index)
        self.problems = [Problem.from_dict(p) for p in problems]
        self.cases = [FORWARD.case(p, device_index) for p in self.problems]
        self.runs: dict[tuple[int, str], object] = {}
        l2 = getattr(torch.cuda.get_device_properties(device_index), "L2_cache_size", 0) or 0
        self.scratch = torch.zeros(max(FLUSH_BYTES, 2 * int(l2)) // 4, dtype=torch.int32,
                                   device="cuda")
        self.device = torch.cuda.get_device_name(device_index)

    def ready(self) -> str:
        """The device's name (the first request: the worker has started)."""
        return self.device

    def _run(self, k: int, schedule: dict):
        s = Schedule.from_dict(schedule)
        if (k, s.key) not in self.runs:
            self.runs[(k, s.key)] = self.cases[k].launcher(s)
        return self.runs[(k, s.key)]

    def check(self, k: int, schedule: dict) -> dict:
        """JIT and launch once, then the correctness check (as ``GpuExecutor.warm`` and
        ``measure`` do); one run's time with events, for the budget's estimates."""
        import torch

        start = time.perf_counter()
        try:
            run = self._run(k, schedule)
            run()
            torch.cuda.synchronize()
        except Exception as exc:  # cuTile raises several types for tileiras failures
            return {"status": "compile-error", "reason": first_line(exc),
                    "jit_s": time.perf_counter() - start}
        jit_s = time.perf_counter() - start
        err = self.cases[k].error(run)
        tolerance = FORWARD.tolerance(self.problems[k])
        if not math.isfinite(err) or err > tolerance:
            return {"status": "wrong", "reason": f"relative L2 error {err:.3g} > {tolerance:g}",
                    "rel_err": err if math.isfinite(err) else None, "jit_s": jit_s}
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run()
        end.record()
        torch.cuda.synchronize()
        return {"status": "ok", "rel_err": err, "jit_s": jit_s,
                "run_ms": begin.elapsed_time(end)}

    def sample(self, run) -> tuple:
        """Enqueue one sample of ``run``, as ``tuner.measure.time_interleaved`` takes it: the L2
        flushed (a read of the scratch buffer), a spin that keeps the GPU busy while the host
        enqueues, then ``run`` between two events; nothing waits for the GPU."""
        import torch

        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.scratch.max()
        torch.cuda._sleep(SPIN_CYCLES)
        begin.record()
        run()
        end.record()
        return begin, end

    def time_round(self, k: int, schedules: list[dict], warmup: int) -> list[float]:
        """One sample of each schedule, in the order given (after ``warmup`` launches each)."""
        import torch

        runs = [self._run(k, s) for s in schedules]
        for run in runs:
            for _ in range(warmup):
                self.sample(run)
        torch.cuda.synchronize()
        events = [self.sample(run) for run in runs]
        torch.cuda.synchronize()
        return [begin.elapsed_time(end) for begin, end in events]


class SweepFactory:
    """Picklable factory of the worker's executor."""

    def __init__(self, problems: list[dict], device_index: int) -> None:
        self.problems = problems
        self.device_index = device_index

    def __call__(self) -> SweepExecutor:
        return SweepExecutor(self.problems, self.device_index)


# -- the run -------------------------------------------------------------------------------------
class Sweep:
    def __init__(self, args, plan: dict) -> None:
        self.args = args
        self.plan = plan
        self.start = time.monotonic()
        self.end = self.start + args.budget
        self.lock = threading.Lock()
        self.keys = plan["keys"]
        self.records = [[self._record(key, s) for s in key["sample"]] for key in self.keys]
        self.check_deadline = self.end
        self.compile_s: list[float] = []
        self.check_s: list[float] = []
        self.phase = "compile"
        self.rounds_done = 0
        self.last_write = 0.0
        self.device = "unknown"
        self.stuck: set[int] = set()  # GPU workers whose thread never came back from a check
        self.rejit_s: dict[int, float] = {}  # per restarted GPU worker: its JITs to redo

    @staticmethod
    def _record(key: dict, s: Schedule) -> dict:
        role = ("default" if s.key == key["default"].key
                else "seed" if any(s.key == x.key for x in key["seeds"]) else "sample")
        return {"key": s.key, "schedule": s.to_dict(), "describe": s.describe(), "role": role,
                "status": "queued", "reason": "not reached within the budget", "samples": []}

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    # -- estimates for the budget --
    def _run_ms(self, k: int) -> float:
        known = [r["run_ms"] for r in self.records[k] if "run_ms" in r]
        return sum(known) / len(known) if known else 5.0

    def timing_estimate(self, live) -> float:
        """Seconds the timing rounds take for the candidates ``live(record)`` selects."""
        a = self.args
        total_ms = 0.0
        for k, records in enumerate(self.records):
            mean = self._run_ms(k)
            for r in records:
                if live(r):
                    total_ms += (r.get("run_ms", mean) + SAMPLE_OVERHEAD_MS) * (a.rounds +
                                                                                  a.warmup)
        calls = a.rounds * len(self.records) * a.gpu_workers
        return total_ms / 1000 + 0.05 * calls + sum(self.rejit_s.values()) + 5

    # -- output --
    def document(self) -> dict:
        from tiledattention.tooling import current_provenance

        a = self.args
        keys = []
        for key, records in zip(self.keys, self.records):
            keys.append({
                "problem": key["problem"].to_dict(), "describe": key["problem"].describe(),
                "space": {n: list(v) for n, v in key["space"].choices.items()},
                "space_size": key["space"].size,
                "feasible_estimate": round(key["feasible_estimate"]),
                "default": key["default"].key, "seeds": [s.key for s in key["seeds"]],
                "candidates": [{k: v for k, v in r.items() if k != "samples"}
                               | {"samples_ms": [round(x, 5) for x in r["samples"]]}
                               for r in records]})
        return {"format": FORMAT, "kind": "tiledattention tuner sweep", "family": FORWARD.name,
                "arch": a.arch, "device": self.device,
                "provenance": current_provenance(FORWARD).to_dict(),
                "seed": a.seed, "count": a.count, "space": "full",
                "seeds_from": "shipped table", "rounds": a.rounds, "warmup": a.warmup,
                # stream launches, L2 flushed before each sample: the tuner's default mode
                "timing_mode": TimingMode().to_dict(),
                "rounds_done": self.rounds_done, "budget_s": a.budget,
                "wall_s": round(self.elapsed(), 1), "phase": self.phase, "keys": keys}

    def write(self, force: bool = False) -> None:
        if not force and time.monotonic() - self.last_write < 15:
            return
        self.last_write = time.monotonic()
        with self.lock:
            doc = self.document()
        out = Path(self.args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, out)

    def progress(self) -> None:
        with self.lock:
            counts: dict[str, int] = {}
            for records in self.records:
                for r in records:
                    counts[r["status"]] = counts.get(r["status"], 0) + 1
        text = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        log(f"[{self.elapsed():5.0f} s] {self.phase}: {text}")

    # -- phase 1: compile ahead, check on the GPU workers --
    def compile_and_check(self, pool: CompilePool, workers: list) -> None:
        a = self.args
        todo = list(self.plan["jobs"])
        queues = [queue.Queue() for _ in workers]
        owner: dict[str, int] = {}
        in_flight: dict = {}  # future -> (job, submitted at, attempt)
        checks_queued = [0]
        stop = threading.Event()

        def worker_loop(i: int) -> None:
            executor = workers[i]
            broken = ""
            try:  # start the worker while the first compiles run
                self.device = executor.call("ready", deadline=300)
                log(f"[{self.elapsed():5.0f} s] GPU worker {i} ready on {self.device}")
            except (WorkerDied, WorkerTimeout, RuntimeError) as exc:
                broken = f"GPU worker {i} did not start: {first_line(exc)}"
                log(broken)
            while True:
                item = queues[i].get()
                if item is None:
                    return
                k, c, schedule = item
                record = self.records[k][c]
                if stop.is_set() or time.monotonic() > self.check_deadline or broken:
                    with self.lock:
                        if broken:
                            record.update(status="crash", reason=broken)
                        checks_queued[0] -= 1
                    continue
                started = time.monotonic()
                try:  # a disk-cache hit takes ~0.5 s; a hang or a runaway JIT ends here
                    answer = executor.call("check", k, schedule.to_dict(), deadline=CHECK_S)
                except WorkerTimeout as exc:
                    answer = {"status": "timeout", "reason": str(exc)}
                except WorkerDied as exc:
                    answer = {"status": "crash", "reason": str(exc)}
                except RuntimeError as exc:
                    last = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
                    answer = {"status": "crash", "reason": f"worker raised: {last}"[:500]}
                with self.lock:
                    if answer["status"] in ("crash", "timeout"):
                        # the worker was killed: timing round 0 JITs its correct ones again
                        self.rejit_s[i] = JIT_S * sum(
                            1 for rs in self.records for r in rs
                            if r.get("worker") == i and r["status"] == "ok")
                    record.update(answer)
                    if answer["status"] == "ok":
                        record.pop("reason", None)
                    record["worker"] = i
                    self.check_s.append(time.monotonic() - started)
                    checks_queued[0] -= 1

        threads = [threading.Thread(target=worker_loop, args=(i,), daemon=True)
                   for i in range(len(workers))]
        for t in threads:
            t.start()

        def resolve(job: dict, status: str, reason: str) -> None:
            with self.lock:
                for k, c in job["users"]:
                    self.records[k][c].update(status=status, reason=reason[:500])

        def submit(job: dict, attempt: int) -> None:
            future = pool.submit(compile_job, FORWARD, job["problem"], job["schedule"], a.arch)
            in_flight[future] = (job, time.monotonic(), attempt)
            resolve(job, "compiling", "")

        def room_for_more() -> bool:
            mean_compile = (sorted(self.compile_s)[len(self.compile_s) // 2]
                            if self.compile_s else 3.0)
            mean_check = sum(self.check_s) / len(self.check_s) if self.check_s else 1.0
            with self.lock:
                backlog = (checks_queued[0] + len(in_flight)) * mean_check / len(workers)
                timing = self.timing_estimate(
                    lambda r: r["status"] in ("ok", "compiling", "checking"))
            need = mean_compile + backlog + timing * 1.15 + 10
            return self.elapsed() + need < a.budget

        last_progress = 0.0
        submitting = True
        while todo or in_flight or checks_queued[0] > 0:
            while submitting and todo and len(in_flight) < a.compile_workers + 2:
                if not room_for_more():
                    submitting = False
                    log(f"[{self.elapsed():5.0f} s] budget: no new compiles "
                        f"({len(todo)} candidates left out)")
                    break
                submit(todo.pop(0), 1)
            if not submitting:
                todo.clear()
            done, _ = wait(list(in_flight), timeout=0.5, return_when=FIRST_COMPLETED) \
                if in_flight else (set(), set())
            for future in done:
                job, _, attempt = in_flight.pop(future)
                try:
                    seconds, _, error = future.result()
                except Exception as exc:  # pool trouble: let the GPU worker's JIT try
                    seconds, error = 0.0, None
                    log(f"compile process failed for {job['schedule'].describe()}: "
                        f"{first_line(exc)}")
                if error is not None and attempt == 1 and seconds < 30:
                    submit(job, 2)  # once more: a transient failure is not the schedule's
                    continue
                if error is not None:
                    resolve(job, "compile-error", error)
                    continue
                self.compile_s.append(seconds)
                i = owner.setdefault(job["id"], len(owner) % len(workers))
                resolve(job, "checking", "")
                with self.lock:
                    for k, c in job["users"]:
                        self.records[k][c]["compile_s"] = round(seconds, 2)
                        checks_queued[0] += 1
                        queues[i].put((k, c, self.keys[k]["sample"][c]))
            now = time.monotonic()
            for future, (job, submitted, _) in list(in_flight.items()):
                if now - submitted > a.compile_timeout:
                    in_flight.pop(future)
                    future.cancel()
                    resolve(job, "timeout", f"compile exceeded {a.compile_timeout:.0f} s")
            # checks wait for nothing past the point where the timing rounds need the rest
            with self.lock:
                reserve = self.timing_estimate(lambda r: r["status"] == "ok")
            self.check_deadline = self.end - reserve * 1.1 - 5
            if now > self.check_deadline:  # compiles still running are of no use now
                break
            if now - last_progress > 5:
                last_progress = now
                self.progress()
            self.write()
        stop.set()
        for q in queues:
            q.put(None)
        for i, t in enumerate(threads):
            t.join(timeout=CHECK_S + 10)
            if t.is_alive():  # still inside a call: its worker cannot time anything now
                log(f"GPU worker {i} is stuck in a check; its candidates stay untimed")
                self.stuck.add(i)
        with self.lock:
            for records in self.records:
                for r in records:
                    if r["status"] in ("queued", "compiling", "checking"):
                        r.update(status="skipped", reason="not reached within the budget")

    # -- phase 2: interleaved timing rounds --
    def time_rounds(self, workers: list) -> None:
        a = self.args
        self.phase = "timing"
        plan = []  # per key, per worker: the (candidate index) list it times
        for k, records in enumerate(self.records):
            per_worker = [[c for c, r in enumerate(records)
                           if r["status"] == "ok" and r.get("worker") == i]
                          for i in range(len(workers))]
            plan.append(per_worker)
        dead: set[int] = set(self.stuck)
        round_s = 0.0
        for rnd in range(a.rounds):
            late = self.elapsed() + round_s > a.budget
            if late and (rnd >= 3 or self.elapsed() > a.budget + 30):
                log(f"[{self.elapsed():5.0f} s] budget: stopping after {rnd} timing rounds")
                break
            began = time.monotonic()
            for k, per_worker in enumerate(plan):
                order = list(range(len(workers)))
                order = order[rnd % len(order):] + order[:rnd % len(order)]
                for i in order:
                    cands = per_worker[i]
                    if not cands or i in dead:
                        continue
                    shift = rnd % len(cands)
                    cands = cands[shift:] + cands[:shift]
                    try:
                        times = workers[i].call(
                            "time_round", k,
                            [self.keys[k]["sample"][c].to_dict() for c in cands],
                            a.warmup if rnd == 0 else 0,
                            deadline=120 + len(cands) * (5 if rnd == 0 else 1))
                    except (WorkerDied, WorkerTimeout, RuntimeError) as exc:
                        log(f"worker {i} failed timing key {k}: {first_line(exc)}; its "
                            "candidates are left untimed")
                        dead.add(i)
                        continue
                    with self.lock:
                        for c, t in zip(cands, times):
                            self.records[k][c]["samples"].append(t)
            self.rounds_done = rnd + 1
            round_s = time.monotonic() - began
            log(f"[{self.elapsed():5.0f} s] timing round {rnd + 1}/{a.rounds}: {round_s:.1f} s")
            self.summarise()
            self.write(force=True)
        self.phase = "done"
        self.summarise()

    def summarise(self) -> None:
        with self.lock:
            for records in self.records:
                for r in records:
                    if r["status"] in ("ok", "untimed") and r["samples"]:
                        t = summarize(r["samples"])
                        r.update(status="ok", median_ms=t.median_ms, spread_ms=t.spread_ms,
                                 mean_ms=t.mean_ms, min_ms=t.min_ms, samples_n=t.samples)
                    elif r["status"] == "ok":
                        r.update(status="untimed", reason="correct, but no timing round ran")

    def run(self) -> None:
        a = self.args
        problems = [key["problem"].to_dict() for key in self.keys]
        log(f"{len(self.plan['jobs'])} kernels to compile for "
            f"{sum(len(k['sample']) for k in self.keys)} candidates of {len(self.keys)} keys; "
            f"{a.compile_workers} compile processes, {a.gpu_workers} GPU workers, "
            f"budget {a.budget:.0f} s")
        workers = [IsolatedExecutor(SweepFactory(problems, a.device_index),
                                    name=f"sweep-gpu-{i}") for i in range(a.gpu_workers)]
        try:
            with CompilePool(a.compile_workers) as pool:
                try:
                    self.compile_and_check(pool, workers)
                finally:
                    pool.kill()  # compiles left running (timeouts) die with their tileiras
            self.time_rounds(workers)
        finally:
            if self.phase != "done":
                self.phase = f"stopped in {self.phase}"
            self.summarise()
            self.write(force=True)
            for w in workers:
                w.close()


# -- report ------------------------------------------------------------------------------------
def print_table(doc: dict) -> None:
    print(f"sweep of {doc['arch']} on {doc['device']}: {doc['rounds_done']} timing rounds, "
          f"{doc['wall_s']:.0f} s wall, phase {doc['phase']}")
    print("| key | sampled | timed | failed | not reached | best ms | default/best | "
          "seeds' best/best | best schedule |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in doc["keys"]:
        cands = key["candidates"]
        ok = [c for c in cands if c["status"] == "ok" and "median_ms" in c]
        failed: dict[str, int] = {}
        for c in cands:
            if c["status"] not in ("ok", "skipped", "untimed"):
                failed[c["status"]] = failed.get(c["status"], 0) + 1
        left = sum(1 for c in cands if c["status"] in ("skipped", "untimed"))
        failed_text = ", ".join(f"{n} {s}" for s, n in sorted(failed.items())) or "0"
        cells = [key["describe"], str(len(cands)), str(len(ok)), failed_text, str(left)]
        if ok:
            best = min(ok, key=lambda c: c["median_ms"])["median_ms"]
            default = [c["median_ms"] for c in ok if c["role"] == "default"]
            seeds = [c["median_ms"] for c in ok if c["role"] in ("default", "seed")]
            cells += [f"{best:.4f}", f"{default[0] / best:.3f}" if default else "-",
                      f"{min(seeds) / best:.3f}" if seeds else "-",
                      min(ok, key=lambda c: c["median_ms"])["describe"]]
        else:
            cells += ["-"] * 4
        print("| " + " | ".join(cells) + " |")


def dry_run(args, plan: dict) -> int:
    keys, jobs = plan["keys"], plan["jobs"]
    print(f"{'key':34} {'space':>8} {'feasible~':>10} {'sample':>6} {'seeds':>5} draw s")
    for key in keys:
        print(f"{key['problem'].describe():34} {key['space'].size:>8,} "
              f"{key['feasible_estimate']:>10,.0f} {len(key['sample']):>6} "
              f"{len(key['seeds']):>5} {key['draw_s']:.1f}")
        for s in key["seeds"]:
            print(f"    seed: {s.describe()}")
    shared = sum(1 for j in jobs if len(j["users"]) > 1)
    total = sum(len(k["sample"]) for k in keys)
    print(f"{total} candidates, {len(jobs)} distinct kernels to compile "
          f"({shared} shared by two or more keys)")
    compile_s = args.assume_compile_s
    if args.dry_compile:
        picked = jobs[:args.dry_compile]
        with CompilePool(min(args.compile_workers, len(picked))) as pool:
            futures = [pool.submit(compile_job, FORWARD, j["problem"], j["schedule"], args.arch)
                       for j in picked]
            outcomes = [f.result() for f in futures]
        for j, (seconds, kernels, error) in zip(picked, outcomes):
            shared_kib = kernels[0].shared_bytes // 1024 if kernels else 0
            print(f"  compiled {j['schedule'].describe():50} {seconds:5.1f} s "
                  f"{f'ok, {shared_kib} KiB smem' if error is None else error[:120]}")
        good = [s for s, _, e in outcomes if e is None]
        if good:
            compile_s = sorted(good)[len(good) // 2]
    for where, workers in (("here", args.compile_workers),
                           ("on 16 cores", 16 - args.gpu_workers)):
        print(f"estimate {where}: compiles ~{len(jobs) * compile_s / workers:.0f} s "
              f"({compile_s:.1f} s each, {workers} processes), overlapped with the GPU "
              f"workers' JITs and checks (~{len(jobs) * 0.45 / args.gpu_workers:.0f} s at "
              f"~0.45 s each on {args.gpu_workers} workers); then {args.rounds} timing rounds "
              f"(~10-60 s); --budget caps the whole at {args.budget:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    cores = os.cpu_count() or 4
    parser = argparse.ArgumentParser(
        description="Time a seeded uniform sample of the forward family's full space on "
                    "held-out keys (issue 18, item 4); scripts/tuner_replay.py replays search "
                    "strategies against the result.")
    parser.add_argument("--key", action="append",
                        help="B,H[/HKV],S[:SK],D,causal|full (repeat; default: "
                             + "; ".join(DEFAULT_KEYS) + ")")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--count", type=int, default=300,
                        help="distinct normalised schedules per key (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--budget", type=float, default=420.0,
                        help="wall-clock budget of the whole run in seconds (default 420)")
    parser.add_argument("--rounds", type=int, default=12, help="timing rounds (default 12)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="launches of each candidate before the first round (default 3)")
    parser.add_argument("--gpu-workers", type=int, default=3,
                        help="GPU worker processes that JIT and check in parallel (default 3)")
    parser.add_argument("--compile-workers", type=int, default=None,
                        help="compile processes (default: cores - GPU workers)")
    parser.add_argument("--compile-timeout", type=float, default=120.0,
                        help="seconds one compile may take (default 120)")
    parser.add_argument("--device-index", type=int, default=0)
    parser.add_argument("--allow-shipped", action="store_true",
                        help="allow keys the shipped table holds")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "sweep.json"),
                        help="the JSON results (default $OUT/sweep.json)")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: draw the samples, print their sizes and an estimate")
    parser.add_argument("--dry-compile", type=int, default=0,
                        help="with --dry-run: compile this many kernels for --arch here")
    parser.add_argument("--assume-compile-s", type=float, default=2.5,
                        help="with --dry-run and no --dry-compile: seconds per compile")
    args = parser.parse_args(argv)
    if args.count < 1 or args.rounds < 1 or args.gpu_workers < 1 or args.budget <= 0:
        parser.error("--count, --rounds, --gpu-workers and --budget must be positive")
    if args.compile_workers is None:
        args.compile_workers = max(1, cores - args.gpu_workers)
    # tileiras itself stops at the compile timeout (cuTile's own setting, inherited by the
    # compile processes and the GPU workers)
    os.environ.setdefault("CUDA_TILE_COMPILER_TIMEOUT_SEC", str(args.compile_timeout))
    start = time.monotonic()
    plan = build_plan(args)
    log(f"sampled {sum(len(k['sample']) for k in plan['keys'])} candidates in "
        f"{time.monotonic() - start:.1f} s")
    if args.dry_run:
        return dry_run(args, plan)
    sweep = Sweep(args, plan)
    sweep.start = start
    sweep.end = start + args.budget
    try:
        sweep.run()
    finally:
        with sweep.lock:
            doc = sweep.document()
        print_table(doc)
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
