"""``tiledtune aot``: build the cubin bundles that run shipped schedules without a compiler.

    tiledtune aot --arch sm_90,sm_100,sm_120 --out cubins
    tiledtune aot --arch sm_90 --into-package                  # before building a wheel
    tiledtune aot --arch sm_90 --no-shipped --out cubins --model 32/8,128 --training
    P=batch=1,heads_q=32,heads_kv=8,seqlen_q=4096,seqlen_k=4096,head_dim=128,dtype=bf16
    tiledtune aot --arch sm_90 --no-shipped --out cubins --problem kernel=forward,$P,causal=yes

(a ``--problem`` names its family and every field of the family's problem, as ``tiledtune bench
--problem`` does; a ``--model`` stands for its calls at ``--lengths``, ``--batch`` and
``--dtypes``: a causal prefill and a decode step at each length, with ``--training`` a training
call's forward and backward, each in the family ``sdpa``'s dispatch picks.) For every row of
the shipped tables (unless ``--no-shipped``), every ``--problem`` and every ``--model``'s call,
on each architecture, the schedule the lookup hands out there with no user database is
compiled on this machine (no GPU needed) and each kernel it launches is kept, once per
compile-time constants, in ``cubins-<arch>.zip``. At run time ``tiledattention`` launches
a kernel from a bundle in ``tiledattention/pretuned/``, in the cubin cache (``tiledtune warm``)
or in ``$TILEDATTENTION_CUBINS`` (paths separated by ``os.pathsep``) whenever one fits, with no ``tileiras`` and no cuTile compile;
``TILEDATTENTION_JIT=0`` makes any other launch an error instead of a compile. A cubin is code
for one architecture (tileiras compiles sm_XXa): a DGX Spark needs ``--arch sm_121``, a GB300
``sm_103``. Exit status: 0 every job compiled, 1 some did not (the bundles hold the others), 2
bad options.
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
    add_model_options(parser)


def add_model_options(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """``--model``, ``--lengths``, ``--batch``, ``--dtypes``, ``--training`` (a model's calls,
    :func:`model_calls_of`) and ``--jobs``; returns the group (``warm`` adds ``--preset``)."""
    model = parser.add_argument_group(
        "a model's calls (--model): at each length L a causal prefill of L tokens and a "
        "decode step over L keys, each in the family sdpa's dispatch picks")
    model.add_argument("--model", type=_parse_model, action="append", default=[],
                       metavar="HQ/HKV,D", help="query heads / K/V heads and head dim, e.g. "
                       "32/8,128 (repeatable)")
    model.add_argument("--lengths", type=_parse_ints, default=None, metavar="LIST",
                       help="prompt and cache lengths (default 100,128,256,...,32768)")
    model.add_argument("--batch", type=_parse_ints, default=(1, 8, 16), metavar="LIST",
                       help="batch sizes (default 1,8,16: the decode schedules of batches "
                       "1-128 on sm_90; each also builds the other batch pattern, batch 1 "
                       "being compiled in)")
    model.add_argument("--dtypes", type=_parse_dtypes, default=("bf16",), metavar="LIST",
                       help="bf16, fp16 or e4m3, comma-separated (default bf16; e4m3 has "
                       "no --training calls)")
    model.add_argument("--training", action="store_true",
                       help="also the forward and backward of a training call of each length")
    parser.add_argument("--jobs", type=positive_int, default=max(1, os.cpu_count() or 1),
                        metavar="N", help="parallel compile processes (default: the CPU count)")
    return model


def model_calls_of(args: argparse.Namespace) -> list:
    """The ``(operation, problem)`` calls of the ``--model`` options."""
    from ..aot import LENGTHS, model_calls
    from ..errors import UsageError

    if not args.model and (args.lengths or args.training):
        raise UsageError("--lengths and --training describe a --model's calls: name one")
    return [call for hq, hkv, d in args.model
            for call in model_calls(hq, hkv, d, dtypes=args.dtypes, batches=args.batch,
                                    lengths=args.lengths or LENGTHS, training=args.training)]


def jobs_of(archs: list, problems: list, shipped: bool, args: argparse.Namespace) -> list:
    """``tuner.aot.jobs_for`` of ``problems`` (and with ``shipped`` the shipped rows') and the
    ``--model`` calls; a model call no family serves on an architecture (an FP8 training call,
    FP8 before sm_90) is the user's error, named."""
    from tiledattention import UnsupportedOperationError

    from ..aot import jobs_for
    from ..errors import UsageError

    try:
        return jobs_for(archs, problems, shipped=shipped, calls=model_calls_of(args))
    except UnsupportedOperationError as exc:
        raise UsageError(f"--model: {exc}") from None


def build(jobs: list, out: Path, processes: int, tag: str = "", command: str = "aot") -> int:
    """Build ``jobs`` into bundles in ``out``, reporting progress (as ``tiledtune COMMAND``)
    and the bundles; the exit status (0 every job compiled, 1 some did not)."""
    from ..aot import build_bundles

    start = time.perf_counter()
    done = [0]

    def progress(job, failure) -> None:
        done[0] += 1
        if failure is not None:
            say(command, f"{job.describe()} does not compile: {failure}")
        elif done[0] % 25 == 0 or done[0] == len(jobs):
            say(command, f"{done[0]}/{len(jobs)} compiled")

    report = build_bundles(jobs, out, processes=processes, progress=progress, tag=tag)
    for arch, (path, count, size) in report.bundles.items():
        print(f"{arch}: {count} kernels, {size / 1e6:.2f} MB -> {path}")
    print(f"{report.jobs} jobs, {len(report.failures)} failed, "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if report.failures else 0


def _parse_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, comma-separated; got "
                                         f"{text!r}")
    return values


def _parse_dtypes(text: str) -> tuple[str, ...]:
    from tiledattention import DTYPES

    values = tuple(v.strip() for v in text.split(","))
    unknown = [v for v in values if v not in DTYPES]
    if unknown:
        raise argparse.ArgumentTypeError(f"dtypes must be among {list(DTYPES)}; got {unknown}")
    return values


def _parse_model(text: str) -> tuple[int, int, int]:
    """``HQ/HKV,D`` or ``H,D`` -> ``(heads_q, heads_kv, head_dim)``."""
    heads, _, dim = text.partition(",")
    hq, _, hkv = heads.partition("/")
    try:
        found = int(hq), int(hkv or hq), int(dim)
    except ValueError:
        found = (0, 0, 0)
    if min(found) < 1 or found[0] % found[1]:
        raise argparse.ArgumentTypeError(
            f"expected HQ/HKV,D (positive integers, HQ a multiple of HKV), e.g. 32/8,128; "
            f"got {text!r}")
    return found


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

    jobs = jobs_of(args.arch, _problems(args.problem), args.shipped, args)
    if not jobs:
        say("aot", "nothing to build: --no-shipped and no --problem or --model")
        return 2
    return build(jobs, PACKAGE_BUNDLES if args.into_package else args.out, args.jobs)
