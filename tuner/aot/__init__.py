"""Ahead-of-time builds: the cubin bundles that let the runtime launch shipped schedules with
no compiler (``tiledtune aot``)."""

from ._build import (LENGTHS, PRESETS, BuildReport, Job, launch_patterns, build_bundles, images_of,
                     jobs_for, model_calls)

__all__ = ["LENGTHS", "PRESETS", "BuildReport", "Job", "launch_patterns", "build_bundles",
           "images_of", "jobs_for", "model_calls"]
