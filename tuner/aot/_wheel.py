"""The wheel's cubins: a setuptools ``build_py`` that puts the shipped bundles in a wheel
(``[tool.setuptools.cmdclass]`` in ``pyproject.toml``).

A wheel ships ``tiledattention/pretuned/cubins-<arch>.zip`` for each of :data:`WHEEL_ARCHS`,
built by ``tiledtune aot --arch sm_90,sm_100,sm_103,sm_120,sm_121 --into-package`` before the
wheel. By default the build takes the bundles that are there and says which architectures
have none; with ``TILEDATTENTION_WHEEL_CUBINS=build`` it runs that step itself first (it needs
the compiler: build without isolation, ``pip wheel --no-build-isolation .``, in an environment
with ``tiledattention[tune]``); with ``skip`` it neither builds nor checks. An editable install
never builds or checks them. Nothing here imports more than the standard library and setuptools
until a build is asked for (the isolated build environment has nothing else).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools.command.build_py import build_py

__all__ = ["WHEEL_ARCHS", "ENV_WHEEL", "BuildPy"]

#: the architectures a wheel ships cubins for: Hopper, Blackwell (B200, GB300), RTX
#: Blackwell and DGX Spark (tileiras compiles sm_XXXa code, which runs on its own
#: architecture only: an sm_120 cubin does not serve sm_121, nor sm_100 sm_103)
WHEEL_ARCHS = ("sm_90", "sm_100", "sm_103", "sm_120", "sm_121")
ENV_WHEEL = "TILEDATTENTION_WHEEL_CUBINS"
_ROOT = Path(__file__).resolve().parents[2]


def _build_bundles(pretuned: Path) -> None:
    """``tiledtune aot --arch WHEEL_ARCHS --into-package``, in this process."""
    sys.path.insert(0, str(_ROOT))
    from tiledattention.errors import CompileError
    from tuner.aot import build_bundles, jobs_for

    report = build_bundles(jobs_for(WHEEL_ARCHS, []), pretuned, processes=os.cpu_count() or 1)
    if report.failures:
        raise CompileError(f"{len(report.failures)} of {report.jobs} cubin builds failed; the "
                           f"first: {report.failures[0]}")


class BuildPy(build_py):
    """``build_py`` that makes sure of the shipped bundles before the package data is copied."""

    def run(self) -> None:
        if not getattr(self, "editable_mode", False):
            mode = os.environ.get(ENV_WHEEL, "").strip().lower()
            pretuned = _ROOT / "tiledattention" / "pretuned"
            if mode == "build":
                _build_bundles(pretuned)
            if mode != "skip":
                missing = [a for a in WHEEL_ARCHS if not (pretuned / f"cubins-{a}.zip").exists()]
                if missing:
                    self.announce(
                        f"tiledattention: no cubin bundle for {', '.join(missing)}: the wheel's "
                        "calls on those architectures compile on first use (run `tiledtune aot "
                        f"--arch {','.join(WHEEL_ARCHS)} --into-package` first, or build with "
                        f"{ENV_WHEEL}=build)", level=3)
        super().run()
