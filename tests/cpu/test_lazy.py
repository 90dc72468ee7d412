"""``tiledattention.core._lazy``: a lazily bound module global imports its module on the first
attribute read and is then the module itself (the warm path reads a plain global)."""

from __future__ import annotations

import importlib
import sys

from tiledattention.core._lazy import lazy_module


def test_the_first_read_imports_the_module_and_rebinds_the_global(monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    namespace: dict = {}
    namespace["cs"] = lazy_module("colorsys", namespace, "cs")
    assert "colorsys" not in sys.modules and "imported on first use" in repr(namespace["cs"])
    assert namespace["cs"].rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    assert namespace["cs"] is importlib.import_module("colorsys")


def test_the_launch_modules_bind_cuda_tile_lazily():
    from tiledattention.kernels.decode import _launch

    assert _launch.ct.__name__ == "cuda.tile"  # the read imports it
    assert _launch.ct is sys.modules["cuda.tile"]  # and the global is the module from then on
