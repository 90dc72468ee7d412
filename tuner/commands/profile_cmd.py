"""``tiledtune profile``: a family's kernels for one problem under Nsight Compute, one schedule
or two side by side (``--compare``; or one schedule beside a PyTorch backend's kernels for the
same call, ``--compare torch-cudnn``), as a table and a roofline PNG (``tuner.profile``).

Exit status: 0 with the profile; 2 where this machine cannot profile (no GPU, no ``ncu``, no
permission to read the performance counters: one line saying which and how to fix it) or an
option is wrong."""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from tiledattention import families

from ..errors import UsageError
from ._problems import parse_arch
from ._report import add_json_option, print_json, print_table, results_console, say
from .explain_cmd import add_problem_options, problem_of

__all__ = ["configure", "run"]

#: how the name of a PyTorch baseline (a family case's ``baselines()`` key) starts
BASELINE = "torch-"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", type=parse_arch, required=True, metavar="SM_XX",
                        help="the architecture of this machine's GPU, e.g. sm_90")
    parser.add_argument("--kernel", default=None, metavar="NAME",
                        help="the family to profile (known: "
                             + ", ".join(f.name for f in families())
                             + "); default: the family sdpa picks by shape")
    add_problem_options(parser)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--schedule", default=None, metavar="JSON",
                       help="profile this schedule (the family's fields as a JSON object)")
    which.add_argument("--looked-up", dest="source", action="store_const", const="looked-up",
                       help="profile the schedule sdpa's lookup gives (the default)")
    which.add_argument("--default", dest="source", action="store_const", const="default",
                       help="profile the family's per-architecture default schedule")
    parser.add_argument("--compare", default=None, metavar="OTHER",
                        help="a second schedule, side by side: looked-up, default or a JSON "
                             "object; or one of PyTorch's backends the family's tuner "
                             "measures beside it (torch-cudnn, torch-flash; a window's "
                             "torch-efficient-mask)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="keep the raw ncu reports (.ncu-rep), their CSV pages and the "
                             "summary JSON in DIR (and the roofline, unless --roofline)")
    parser.add_argument("--roofline", type=Path, default=None, metavar="PNG",
                        help="where to draw the roofline (default: DIR/roofline.png with "
                             "--out, else ./roofline.png)")
    add_json_option(parser, "the profile")


def _family(args: argparse.Namespace, problem: Any) -> Any:
    from tiledattention import choose_family, get_family

    if args.kernel is None:
        return choose_family(args.device, problem)
    try:
        return get_family(args.kernel)
    except Exception as exc:  # an unknown name: the registry's own message
        raise UsageError(f"--kernel: {exc}") from None


def _schedule(family: Any, problem: Any, arch: str, spec: str) -> tuple[str, Any]:
    """(label, schedule) of ``spec``: looked-up, default or a JSON object; (the name,
    ``None``) for a PyTorch baseline (``torch-...``: the family's case checks the name)."""
    if spec.startswith(BASELINE):
        return spec, None
    if spec == "default":
        return "default", family.default_schedule(arch, problem)
    if spec == "looked-up":
        import torch

        import tiledattention

        resolution = tiledattention.runtime().resolution(
            family, family.plan_problem(problem), torch.cuda.current_device())
        return f"looked-up ({resolution.source})", resolution.schedule
    try:
        fields = json.loads(spec)
        schedule = family.schedule_type.from_dict(
            {**family.default_schedule(arch, problem).to_dict(), **fields})
    except (ValueError, TypeError) as exc:
        raise UsageError(f"a schedule must be a JSON object of {family.name} schedule fields "
                         f"(e.g. '{{\"tile_m\": 128}}'); got {spec!r}: {exc}") from None
    return "given", schedule


def _ceilings():
    """The bf16 matrix-product rate and the copy rate, measured here before profiling (the
    benchmark's ceilings: ``MATMUL_SIZE``³ and ``COPY_BYTES``)."""
    import torch

    from ..bench import BenchSettings, copy_gbps, matmul_tflops
    from ..profile import Ceilings

    settings = BenchSettings(device=torch.cuda.current_device())
    return Ceilings(tflops=matmul_tflops(settings), gbps=copy_gbps(settings))


def run(args: argparse.Namespace) -> int:
    from ..profile import Profile, check_profilable, compare_table, parse_raw_csv, profile_table
    from ..profile import roofline_png, run_profile

    problem = problem_of(argparse.Namespace(**{**vars(args), "training": False}))
    family = _family(args, problem)
    if args.schedule is not None and args.source is not None:
        raise UsageError("give one of --schedule, --looked-up, --default")
    specs = [args.schedule or args.source or "looked-up"]
    if args.compare is not None:
        specs.append(args.compare)
    if specs[0].startswith(BASELINE):
        raise UsageError(f"--schedule {specs[0]}: a PyTorch baseline goes in --compare, beside "
                         "a schedule of ours")
    # given and default schedules are checked first; looked-up ones need the GPU
    schedules = [None if spec == "looked-up" else _schedule(family, problem, args.device, spec)
                 for spec in specs]
    ncu = check_profilable(args.device)  # ProfileUnavailable: one line, exit status 2
    schedules = [s or _schedule(family, problem, args.device, "looked-up") for s in schedules]
    if args.out is not None:  # before measuring: a folder that cannot be made is 2
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--out {args.out}: cannot create the folder: "
                             f"{exc.strerror or exc}") from None
    ceilings = _ceilings()
    profiles = []
    with tempfile.TemporaryDirectory(prefix="tiledtune-profile-") as scratch:
        workdir = args.out or Path(scratch)
        for i, (label, schedule) in enumerate(schedules):
            baseline = label if schedule is None else None
            what = baseline or schedule.describe()
            say("profile", f"{label}: {what} under ncu ...")
            text = run_profile(ncu, family, problem, schedule, workdir, f"profile{i}",
                               baseline=baseline)
            profiles.append(Profile(
                label=label, family=family.name, problem=problem.describe(),
                schedule=what if baseline else family.normalise(problem, schedule).describe(),
                flops=family.flops(problem), kernels=tuple(parse_raw_csv(text, f"profile{i}")),
                ceilings=ceilings, occupancy_hint=getattr(schedule, "occupancy", None)))
    png = args.roofline or (args.out / "roofline.png" if args.out else Path("roofline.png"))
    roofline_png(profiles, ceilings, png)
    document = {"ceilings": dataclasses.asdict(ceilings),
                "profiles": [p.to_json() for p in profiles], "roofline": str(png)}
    if args.out is not None:
        (args.out / "profile.json").write_text(json.dumps(document, indent=1))
    if args.json:
        print_json("profile", document)
        return 0
    console = results_console()
    print_table(console, compare_table(*profiles) if len(profiles) == 2
                else profile_table(profiles[0]))
    console.print(f"ceilings here: {ceilings.tflops:.0f} TFLOP/s (bf16 8192³ matmul), "
                  f"{ceilings.gbps:.0f} GB/s (1 GiB copy, read + written); roofline: {png}")
    return 0
