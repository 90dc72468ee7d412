"""The Hugging Face Kernel Hub build: :func:`build_hub_kernel` lays tiledattention out as a
Hub kernel repository (``tiledtune hub-build -o DIR``)."""

from ._build import (VARIANT, HubBuild, HubBuildError, absolute_project_imports,
                     build_hub_kernel, kernel_id_for)

__all__ = ["VARIANT", "HubBuild", "HubBuildError", "absolute_project_imports",
           "build_hub_kernel", "kernel_id_for"]
