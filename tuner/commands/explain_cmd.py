"""``tiledtune explain``: the schedule ``tiledattention.sdpa`` would run for a problem on an
architecture, the lookup step that chose it and why; no GPU needed.

    tiledtune explain --device sm_90 --shape 4,32/8,4096,128 --causal yes
    tiledtune explain --device sm_90 --shape 1,32/8,1:30000,128       # decode: S_q 1, 30000 keys
    tiledtune explain --device sm_90 --shape 4,16,4096,128 --training      # + the backward
    tiledtune explain --device sm_90 --kernel backward --shape 4,16,4096,128 --json
    tiledtune explain --device sm_120 --shape 1,32/8,8192,128 --resources  # + what it compiles to

The lookup is the runtime's own (``tiledattention.tooling.Resolver`` over the user database,
``--db``, and the shipped table of ``--device``), asked for a device described by its architecture and,
with ``--device-name``, its name (without one, no row is this device's: the ``exact-device``
step cannot answer). The family is the one ``sdpa`` picks by shape (``choose_family``; a decode
problem is looked up at its power-of-two cache-length band, as ``sdpa`` does), or ``--kernel``'s.
``--training`` explains a call that needs gradients: the forward family (such a call runs it
whatever the shape) and the backward family, with whether its schedule is bitwise reproducible
(the backward's ``dq_mode``) and what a deterministic run (``torch.use_deterministic_algorithms``)
runs instead. ``--resources`` compiles each schedule for the architecture (tileiras, on the CPU)
and says what each of its kernels asks of an SM, as its cubin says (``kernel_resources``):
registers a thread, threads and static shared memory a CTA, the stack a thread keeps in local
memory (above zero: spilled registers), how many of its CTAs an SM holds and what limits
them (``resident_ctas``), and how many CTAs it launches for the looked-up problem, in waves on
the SMs the architecture's defaults assume (``Family.launch_ctas``; none for a ragged batch,
whose call sizes its grids). Exit status: 0 explained, 2 bad input.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

from tiledattention import DTYPES, families
from tiledattention.tooling import launch_path, page_tile

from ..errors import UsageError

from ._report import add_json_option, print_json, say
from ._problems import (SHAPE_SYNTAX, parse_arch, parse_problem_fields, parse_shape,
                        problems_from)

__all__ = ["configure", "run", "WHY", "add_problem_options", "problem_of"]

#: What each lookup step means (``Resolution.source`` -> a sentence); ``{arch}`` and
#: ``{device}`` are filled in.
WHY = {
    "exact-device": "a row of the user database for this exact problem, measured on this device "
                    "({device})",
    "exact-arch": "a row of the user database for this exact problem, measured on another "
                  "{arch} GPU (the fastest of them)",
    "shipped": "the shipped table's row for this exact problem (no user row for it)",
    "nearest": "no row for this exact problem: the closest tuned problem of {arch} in the user "
               "database or the shipped table that shares its bucket, by the family's distance, "
               "whose row transfers to this one (ties: the faster row)",
    "default": "no tuned row on {arch} in the user database or the shipped table for this "
               "problem, nor a near one that transfers to it (the detail says why the nearest "
               "does not): the family's per-architecture default (the decode family's refined "
               "by the device's name where devices of one architecture measured apart)",
}
_CAUSAL = {"yes": (True, False), "true": (True, False), "top_left": (True, False),
           "no": (False, False), "false": (False, False), "bottom_right": (True, True)}


def _causal(text: str) -> tuple[bool, bool]:
    try:
        return _CAUSAL[text.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"expected yes, no or bottom_right; got {text!r}") from None


def add_problem_options(parser: argparse.ArgumentParser) -> None:
    """``--shape`` / ``--dtype`` / ``--causal`` or ``--problem``: the one problem a command
    names (read back by :func:`problem_of`; ``explain`` and ``profile`` share them)."""
    parser.add_argument("--shape", type=parse_shape, default=None, metavar="B,HQ/HKV,SQ:SK,D",
                        help=f"the attention problem: {SHAPE_SYNTAX} (with --dtype, --causal)")
    parser.add_argument("--dtype", choices=DTYPES, default=DTYPES[0],
                        help="the input dtype (default %(default)s; a family takes its own: "
                             "Family.tolerances)")
    parser.add_argument("--causal", type=_causal, default=(False, False),
                        metavar="{yes,no,bottom_right}",
                        help="mask: yes (top-left, torch's is_causal), no (default), "
                             "bottom_right")
    parser.add_argument("--problem", type=parse_problem_fields, default=None,
                        metavar="FIELD=VALUE,...",
                        help="the problem with every field named (any family), instead of "
                             "--shape")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", type=parse_arch, required=True, metavar="SM_XX",
                        help="architecture whose lookup to explain, e.g. sm_90 (no GPU needed)")
    parser.add_argument("--device-name", default="", metavar="NAME",
                        help="the GPU's name as torch reports it (e.g. 'NVIDIA H100 80GB "
                             "HBM3'): its own rows then answer first; default: none")
    parser.add_argument("--db", default=None, metavar="PATH_OR_URL",
                        help="user schedule database (default: $TILEDATTN_DB or "
                             "~/.cache/tiledattention/schedules.sqlite)")
    parser.add_argument("--kernel", default=None, metavar="NAME",
                        help="explain this family's lookup (known: "
                             + ", ".join(f.name for f in families())
                             + "); default: the family sdpa picks by shape")
    parser.add_argument("--training", action="store_true",
                        help="a call that needs gradients: its forward and its backward")
    parser.add_argument("--resources", action="store_true",
                        help="compile each schedule for --device and show its kernels' "
                             "registers, shared memory, stack (spills), CTAs an SM and waves")
    add_problem_options(parser)
    add_json_option(parser, "the explanation")


class _Recording:
    """A row source (``db.ScheduleDB`` / ``db.RowTable``) that keeps what the resolver asked it
    and what it answered, so the answer's row (its time, device and distance) can be shown."""

    def __init__(self, name: str, source: Any, asked: list) -> None:
        self.name, self.source, self._asked = name, source, asked

    def candidates(self, family: str, arch: str, problem: Any, **kwargs: Any) -> Any:
        found = self.source.candidates(family, arch, problem, **kwargs)
        self._asked.append((self, family, problem, found))
        return found

    def __str__(self) -> str:
        return str(self.source)


class _Lookup:
    """The runtime's resolver over ``location`` and the shipped tables, recording its sources'
    answers; ``close()`` closes the database."""

    def __init__(self, location: str) -> None:
        from tiledattention import open_database, shipped_table
        from tiledattention.tooling import Resolver

        self.location = location
        self.asked: list = []
        self.opened: dict[str, Any] = {}

        def open_user():
            database = open_database(location, read_only=True)
            self.opened["user"] = database
            return None if database is None else _Recording("user", database, self.asked)

        def open_shipped(arch: str):
            table = shipped_table(arch)
            self.opened["shipped"] = table
            return None if table is None else _Recording("shipped", table, self.asked)

        self.resolve = Resolver(open_user=open_user, open_shipped=open_shipped)

    def row_behind(self, resolution: Any, family: Any, problem: Any, device_name: str):
        """(row, source) the resolution came from, or ``None`` (a default)."""
        if resolution.source == "default":
            return None
        wanted = {"exact-device": ("user",), "exact-arch": ("user",),
                  "shipped": ("shipped",), "nearest": ("user", "shipped")}[resolution.source]
        found = []
        for source, name, asked, answer in self.asked:
            if source.name not in wanted or name != family.name or asked != problem:
                continue
            rows = answer.nearest if resolution.source == "nearest" else answer.exact
            found += [(r, source) for r in rows if r.schedule == resolution.schedule
                      and (resolution.source != "exact-device" or r.device_name == device_name)
                      and (resolution.source != "nearest"
                           or resolution.detail.startswith(r.problem.describe()))]
        if not found:
            return None
        return min(found, key=lambda rs: (family.distance(rs[0].problem, problem),
                                          rs[0].median_ms))

    def sources(self) -> dict[str, dict[str, Any]]:
        """What the lookup read: the user database (``found``: false when there is none at
        its location) and the shipped table (``None`` when none is packaged for the arch)."""
        user, shipped = self.opened.get("user"), self.opened.get("shipped")
        return {"user": {"location": self.location if user is None else str(user),
                         "found": user is not None},
                "shipped": None if shipped is None else {"table": str(shipped),
                                                         "rows": len(shipped)}}

    def close(self) -> None:
        user = self.opened.get("user")
        if user is not None:
            user.close()


def problem_of(args: argparse.Namespace) -> Any:
    """The one problem :func:`add_problem_options`' arguments name (search's parsing:
    ``problems_from``), for ``--kernel`` (default: forward, backward with ``--training``)."""
    if (args.shape is None) == (args.problem is None):
        raise UsageError(f"give one problem: --shape {SHAPE_SYNTAX} or --problem "
                         "FIELD=VALUE,...")
    causal, bottom_right = args.causal
    kernel = args.kernel or ("backward" if args.training else "forward")
    spec = argparse.Namespace(kernel=kernel, shape=[] if args.shape is None else [args.shape],
                              preset=[], kv_heads=None, seqlen_k=None,
                              dtype=[args.dtype], causal=[causal],
                              problem=[] if args.problem is None else [args.problem])
    (problem,) = problems_from(spec)
    if bottom_right and args.shape is not None:
        from tiledattention import get_family

        data = {**problem.to_dict(), "bottom_right": True}
        problem = get_family(kernel).problem_type.from_dict(data)
    return problem


def _steps(args: argparse.Namespace, problem: Any) -> list[tuple[str, Any, Any, str]]:
    """(role, family, problem looked up, why this family) for each lookup to explain; a family
    looks its schedule up for its plan's problem (decode: the cache-length band's)."""
    from tiledattention import Problem, choose_family, explain_choice, get_family

    def step(role: str, family: Any, why: str) -> tuple[str, Any, Any, str]:
        return (role, family, family.plan_problem(problem), why)

    if args.training:
        if not isinstance(problem, Problem):
            raise UsageError("--training explains attention problems (--shape)")
        forward = choose_family(args.device, problem, "sdpa_with_lse")
        backward = choose_family(args.device, problem, "sdpa_backward")
        return [step(forward.name, forward, "a call that needs gradients runs the family that "
                     "keeps the log-sum-exp (sdpa_with_lse), whatever the shape"),
                step(backward.name, backward, "dQ, dK, dV of the same problem (sdpa_backward)")]
    if args.kernel is not None:
        family = get_family(args.kernel)
        why = "--kernel"
        if isinstance(problem, Problem) and "sdpa" in family.serves:
            chosen = choose_family(args.device, problem)
            if chosen is not family:
                why += f" (sdpa itself would run {chosen.name} for this shape)"
        return [step(family.name, family, why)]
    if not isinstance(problem, Problem):
        raise UsageError("without --kernel, explain needs an attention problem")
    family, why = explain_choice(args.device, problem)
    looked_up = family.paged_lookup(problem, problem) if getattr(problem, "page_size", 0) else None
    if looked_up is not None and looked_up != family.plan_problem(problem):
        # a long query run looks its schedule up without pages (tiledattention.paged_attention)
        why = (f"{why}; a long query run over pages of {problem.page_size} keys looks up the "
               f"schedule of the same call without pages, reads the pages in place where one "
               f"holds a whole key tile of it (tile_n <= {page_tile(problem.page_size)}) and "
               f"otherwise copies first the pages whose keys its queries read")
        problem = looked_up
    return [step("sdpa", family, why)]


def run(args: argparse.Namespace) -> int:
    from tiledattention import DeviceInfo, database_location

    from tiledattention import UnsupportedOperationError

    problem = problem_of(args)  # a bad option: tuner.cli prints the UsageError, exit status 2
    try:
        steps = _steps(args, problem)
    except UnsupportedOperationError as exc:  # no family serves it there (FP8 before sm_90)
        raise UsageError(str(exc)) from None
    device = DeviceInfo(index=-1, arch=args.device, name=args.device_name, sm_count=0)
    lookup = _Lookup(args.db or database_location())
    answers = []
    try:
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            for role, family, key, why in steps:
                resolution = lookup.resolve(family, key, device)
                found = lookup.row_behind(resolution, family, key, device.name)
                answers.append(_answer(role, family, key, why, resolution, found, device))
                if args.resources:
                    answers[-1]["kernels"] = _kernels(family, key, resolution.schedule,
                                                      device.arch)
        sources = lookup.sources()
    finally:
        lookup.close()
    for warning in told:  # stale rows, an unreadable database: the runtime's own warnings
        say("explain", f"warning: {warning.message}")
    if args.json:
        print_json("explain", {"device": {"arch": device.arch, "name": device.name or None},
                               "problem": problem, "sources": sources, "lookups": answers})
        return 0
    _print(problem, device, sources, answers)
    return 0


def _answer(role: str, family: Any, key: Any, why_family: str, resolution: Any,
            found: Any, device: Any) -> dict[str, Any]:
    answer = {"role": role, "family": family.name, "why_family": why_family,
              "problem": key, "problem_text": key.describe(),
              "schedule": resolution.schedule, "schedule_text": resolution.schedule.describe(),
              "source": resolution.source, "detail": resolution.detail,
              "why": WHY[resolution.source].format(arch=device.arch,
                                                   device=device.name or "-"),
              "row": None, "determinism": family.determinism(key, resolution.schedule),
              "deterministic_schedule_text": None,
              "launch": launch_path(family, key, resolution.schedule, device.arch)}
    deterministic = family.deterministic_schedule(device.arch, key, resolution.schedule)
    if family.normalise(key, deterministic) != family.normalise(key, resolution.schedule):
        answer["deterministic_schedule_text"] = deterministic.describe()
    if found is not None:
        row, source = found
        answer["row"] = {"source": source.name, "where": str(source), "problem": row.problem,
                         "problem_text": row.problem.describe(), "device": row.device_name,
                         "median_ms": row.median_ms, "trials": row.trials,
                         "distance": family.distance(row.problem, key)}
    return answer


def _kernels(family: Any, problem: Any, schedule: Any, arch: str) -> list[dict] | str:
    """What each kernel ``schedule`` launches asks of an SM of ``arch`` (compiled here) and
    its CTAs and waves where the family says, or why it did not compile."""
    from tiledattention import CompileError
    from tiledattention.tooling import SM_COUNTS, generation, resident_ctas

    try:
        built = family.compile(problem, schedule, arch)
    except CompileError as exc:
        return f"not compiled: {exc}"
    sms = SM_COUNTS[generation(arch)]
    resources = built.resources()
    counts = family.launch_ctas(problem, schedule, sms) or (None,) * len(resources)
    kernels = []
    for kernel, ctas in zip(resources, counts, strict=True):
        residency = resident_ctas(kernel, arch)
        per_sm = None if residency is None else residency.ctas
        kernels.append({**kernel.to_dict(), "ctas_per_sm": per_sm,
                        "limited_by": None if residency is None else list(residency.limited_by),
                        "residency": ("limits of this architecture not known" if residency is None
                                      else residency.describe()),
                        "ctas": ctas, "sms": sms,
                        "waves": None if ctas is None or not per_sm else ctas / (per_sm * sms)})
    return kernels


def _kernel_line(k: dict) -> str:
    stack = (f"{k['stack_bytes']} B of stack (spills)" if k["stack_bytes"] else "no stack")
    threads = "?" if k["threads"] is None else k["threads"]
    grid = ("" if k["ctas"] is None else f"; {k['ctas']} CTAs" + (
        "" if k["waves"] is None else f", {k['waves']:.2f} waves on {k['sms']} SMs"))
    return (f"{k['name']}: {k['registers']} registers, {threads} threads, "
            f"{k['shared_bytes'] / 1024:.1f} KiB shared, {stack}; {k['residency']}{grid}")


def _print(problem: Any, device: Any, sources: dict[str, Any], answers: list[dict]) -> None:
    name = device.name or "no device name given: no row counts as this device's"
    print(f"device     {device.arch} ({name})")
    print(f"problem    {problem.describe()}")
    user, shipped = sources["user"], sources["shipped"]
    print(f"user db    {user['location']}{'' if user['found'] else ' (no database there)'}")
    print("shipped    " + (f"{shipped['table']} ({shipped['rows']} rows)" if shipped
                           else f"none for {device.arch}"))
    for a in answers:
        print()
        print(f"{a['role']:<10} family {a['family']}: {a['why_family']}")
        if a["problem_text"] != problem.describe():
            print(f"  looked up as {a['problem_text']}")
        print(f"  schedule {a['schedule_text']}")
        print(f"  source   {a['source']}: {a['why']}")
        print(f"  detail   {a['detail']}")
        print(f"  launch   {a['launch']}")
        if a["determinism"] is not None:
            print(f"  mode     {a['determinism']}")
        if a["deterministic_schedule_text"] is not None:
            print(f"  deterministic run: {a['deterministic_schedule_text']}")
        kernels = a.get("kernels")
        if isinstance(kernels, str):
            print(f"  kernels  {kernels}")
        elif kernels is not None:
            for i, k in enumerate(kernels):
                print(f"  {'kernels' if i == 0 else '':8} {_kernel_line(k)}")
        row = a["row"]
        if row is not None:
            print(f"  row      {row['problem_text']} on {row['device']}: "
                  f"{row['median_ms']:.4g} ms, {row['trials']} trials ({row['source']})")
            if a["source"] == "nearest":
                print(f"  distance {row['distance']:.3g} (0: the same on every term)")
