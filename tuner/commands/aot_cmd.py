"""``tiledtune aot``: build the cubin bundles that run shipped schedules without a compiler.

    tiledtune aot --arch sm_90,sm_100,sm_120 --out cubins
    tiledtune aot --arch sm_90 --into-package                  # before building a wheel
    P=batch=1,heads_q=32,heads_kv=8,seqlen_q=4096,seqlen_k=4096,head_dim=128,dtype=bf16
    tiledtune aot --arch sm_90 --no-shipped --out cubins --problem kernel=forward,$P,causal=yes

(a ``--problem`` names its family and every field of the family's problem, as ``tiledtune bench
--problem`` does.) For every row of the shipped tables (unless ``--no-shipped``) and every
``--problem``, on each architecture, the schedule the lookup hands out there with no user
database is compiled on this machine (no GPU needed) and each kernel it launches is kept, once
per compile-time constants, in ``cubins-<arch>.zip``. At run time ``tiledattention`` launches
a kernel from a bundle in ``tiledattention/pretuned/`` or in ``$TILEDATTENTION_CUBINS`` (paths
separated by ``os.pathsep``) whenever one fits, with no ``tileiras`` and no cuTile compile;
``TILEDATTENTION_JIT=0`` makes any other launch an error instead of a compile. A cubin for
sm_120 also runs on sm_121, one for sm_100 on sm_103. Exit status: 0 every job compiled, 1 some
did not (the bundles hold the others), 2 bad options.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from ._problems import parse_arch_list, parse_problem_fields
from ._report import positive_int, say


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 2)[2]
    parser.add_argument("--arch", type=parse_arch_list, required=True, metavar="LIST",
                        help="architectures to build for, e.g. sm_90,sm_100,sm_120")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, metavar="DIR",
                       help="write cubins-<arch>.zip here (point $TILEDATTENTION_CUBINS at them)")
    where.add_argument("--into-package", action="store_true",
                       help="write them into tiledattention/pretuned/ (a wheel then ships them)")
    parser.add_argument("--problem", type=parse_problem_fields, action="append", default=[],
                        metavar="kernel=NAME,FIELD=VALUE,...",
                        help="also build this problem of family NAME (repeatable)")
    parser.add_argument("--no-shipped", dest="shipped", action="store_false",
                        help="leave out the shipped tables' problems")
    parser.add_argument("--jobs", type=positive_int, default=max(1, os.cpu_count() or 1),
                        metavar="N", help="parallel compile processes (default: the CPU count)")


def _problems(specs: list[dict]) -> list:
    from tiledattention import get_family
    from tiledattention.errors import InputTypeError, InputValueError

    from ..errors import UsageError

    found = []
    for spec in specs:
        fields = dict(spec)
        name = fields.pop("kernel", None)
        if name is None:
            raise UsageError(f"--problem {spec}: name its family with kernel=NAME")
        try:
            family = get_family(name)
            found.append((family.name, family.problem_type.from_dict(fields)))
        except (InputTypeError, InputValueError) as exc:
            raise UsageError(f"--problem {spec}: {exc}") from None
    return found


def run(args: argparse.Namespace) -> int:
    from tiledattention.tooling import PACKAGE_BUNDLES

    from ..aot import build_bundles, jobs_for

    jobs = jobs_for(args.arch, _problems(args.problem), shipped=args.shipped)
    if not jobs:
        say("aot", "nothing to build: --no-shipped and no --problem")
        return 2
    out = PACKAGE_BUNDLES if args.into_package else args.out
    start = time.perf_counter()
    done = [0]

    def progress(job, failure) -> None:
        done[0] += 1
        if failure is not None:
            say("aot", f"{job.describe()} does not compile: {failure}")
        elif done[0] % 25 == 0 or done[0] == len(jobs):
            say("aot", f"{done[0]}/{len(jobs)} compiled")

    report = build_bundles(jobs, out, processes=args.jobs, progress=progress)
    for arch, (path, count, size) in report.bundles.items():
        print(f"{arch}: {count} kernels, {size / 1e6:.2f} MB -> {path}")
    print(f"{report.jobs} jobs, {len(report.failures)} failed, "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if report.failures else 0
