"""Fixtures the CPU tests share."""

from __future__ import annotations

import contextlib

import pytest


@pytest.fixture
def cpu_sdpa(monkeypatch):
    """The padded contenders' pinned backends are lifted (cuDNN and efficient are CUDA's): SDPA
    runs on the CPU's own, with the same mask and heads. torch._dynamo is imported first: on
    import it reads ``sdpa_kernel.__wrapped__``, which the stand-in lacks (a test that first
    imported it under the stand-in failed when it ran alone)."""
    import torch._dynamo  # noqa: F401
    import torch.nn.attention

    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel",
                        lambda backend: contextlib.nullcontext())
