"""Ahead-of-time builds: the cubin bundles that let the runtime launch shipped schedules with
no compiler (``tiledtune aot``)."""

from ._build import BuildReport, Job, build_bundles, images_of, jobs_for

__all__ = ["BuildReport", "Job", "build_bundles", "images_of", "jobs_for"]
