"""``tiledtune warm``: compile, ahead of serving, the kernels a model's calls will run on this
machine, into the cubin cache the runtime reads.

    tiledtune warm --preset llama-3-8b                      # prefill + decode, 100-32768 tokens
    tiledtune warm --model 28/4,128 --batch 1,16 --dtypes bf16,fp16 --training
    tiledtune warm --preset qwen2.5-7b --arch sm_90,sm_120  # for other machines' GPUs too

For each architecture (default: this machine's GPUs), each of the model's calls (a causal
prefill and a decode step at each length, with ``--training`` a training call's forward and
backward, each in the family ``sdpa``'s dispatch picks, with the schedule the lookup hands out
there with the shipped table) is compiled in ``--jobs`` parallel processes, and the kernels go
into one bundle, ``cubins-<arch>-<tag>.zip`` in the cubin cache
(``$XDG_CACHE_HOME/tiledattention/cubins``, ``~/.cache`` by default; the tag names the request,
so warming two models keeps both). Every ``tiledattention`` process on the machine then runs
those calls' first launches from the cache: no ``tileiras``, no cuTile front end (``tiledtune
explain`` says so per call). Warm again after upgrading tiledattention: a bundle built from
another version of a kernel's template is never used. Exit status: 0 every job compiled, 1
some did not, 2 bad options.
"""

from __future__ import annotations

import argparse
import hashlib

from . import aot_cmd
from ._problems import parse_arch_list
from ._report import say


def configure(parser: argparse.ArgumentParser) -> None:
    from ..aot import PRESETS

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 2)[2]
    parser.add_argument("--arch", type=parse_arch_list, default=None, metavar="LIST",
                        help="architectures to build for (default: this machine's GPUs')")
    group = aot_cmd.add_model_options(parser)
    group.add_argument("--preset", choices=sorted(PRESETS), action="append", default=[],
                       help="a model's heads and head dim (repeatable): "
                       + ", ".join(f"{k} {q}/{kv},{d}" for k, (q, kv, d) in PRESETS.items()))


def run(args: argparse.Namespace) -> int:
    from tiledattention import local_devices
    from tiledattention.tooling import cubin_cache

    from ..aot import PRESETS
    from ..errors import UsageError

    args.model = list(args.model) + [PRESETS[name] for name in args.preset]
    if not args.model:
        raise UsageError("name a model: --preset NAME or --model HQ/HKV,D")
    archs = args.arch
    if archs is None:
        archs = sorted({device.arch for device in local_devices()})
        if not archs:
            raise UsageError("no CUDA device here: name the architectures with --arch")
    jobs = aot_cmd.jobs_of(archs, [], False, args)
    tag = hashlib.sha256(repr(sorted(map(repr, jobs))).encode()).hexdigest()[:12]
    say("warm", f"{len(jobs)} jobs for {', '.join(archs)} -> {cubin_cache()}")
    return aot_cmd.build(jobs, cubin_cache(), args.jobs, tag=tag, command="warm")
