"""The one module that asks a GPU what it is."""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["DeviceInfo", "device_info", "local_devices"]


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    arch: str  # "sm_90"
    name: str  # "NVIDIA H100 80GB HBM3"
    sm_count: int


@functools.lru_cache(maxsize=None)
def device_info(index: int) -> DeviceInfo:
    """Architecture and name of CUDA device ``index`` (cached: it cannot change in a process)."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(index=index, arch=f"sm_{props.major}{props.minor}", name=props.name,
                      sm_count=props.multi_processor_count)


def local_devices() -> list[DeviceInfo]:
    """Every CUDA device this process sees (empty without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [device_info(i) for i in range(torch.cuda.device_count())]
