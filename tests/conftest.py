"""Shared pytest setup: the ``gpu`` marker skips cleanly on machines without CUDA."""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def router_off():
    """The SDPA router off and its counts (and the Hugging Face backend's) reset around a
    test, which must leave ``F.scaled_dot_product_attention`` as PyTorch's own function.
    Modules that route use it with ``pytest.mark.usefixtures("router_off")``."""
    import torch.nn.functional as F

    import tiledattention.integrations as ti
    from tiledattention.integrations import _router

    ti.disable()
    ti.reset_router_stats()
    ti.reset_hf_stats()
    yield
    ti.disable()
    assert F.scaled_dot_product_attention is _router._TORCH_SDPA
