"""``tiledtune hub-build``: lay tiledattention out as a Hugging Face Kernel Hub kernel.

    tiledtune hub-build -o tiledattention-hub
    tiledtune hub-build -o tiledattention-hub --force     # replace an earlier build

Writes DIR/README.md (the kernel card) and DIR/build/torch-universal/, a self-contained package
(the runtime and its schedule table vendored, imports relative) that ``kernels.get_kernel`` /
``get_local_kernel`` load and whose ``sdpa(q, k, v, causal=False, scale=None)`` runs the tuned
kernels. cuda.tile is imported at the first call, not at load. Upload DIR as a kernel
repository to publish it. Exit status: 0 built, 2 not built (the reason on standard error).
"""

from __future__ import annotations

import argparse

from ._report import say


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 2)[2]
    parser.add_argument("-o", "--out", required=True, metavar="DIR",
                        help="the kernel repository directory to write (created if missing)")
    parser.add_argument("--name", default="tiledattention",
                        help="kernel name, as in the Hub repository <org>/NAME "
                             "(default: tiledattention)")
    parser.add_argument("--version", type=int, default=1,
                        help="the kernel's major version, get_kernel(..., version=N) (default: 1)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing DIR/build/torch-universal")


def run(args: argparse.Namespace) -> int:
    from ..errors import HubBuildError
    from ..hub import build_hub_kernel

    try:
        built = build_hub_kernel(args.out, name=args.name, version=args.version,
                                 replace=args.force)
    except (HubBuildError, OSError) as exc:
        say("hub-build", exc)
        return 2
    print(f"built kernel {built.name} version {built.version} (id {built.kernel_id}): "
          f"{built.files} files in {built.variant_dir}")
    print("load it with: "
          f"kernels.get_local_kernel(pathlib.Path({str(built.root)!r})).sdpa(q, k, v)")
    return 0
