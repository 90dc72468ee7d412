"""``tiledtune profile`` on the GPU machine: a forward, a decode and a backward problem under
Nsight Compute, and a comparison of two schedules."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tuner import cli

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu is not on PATH")]


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


@pytest.mark.parametrize("argv, kernels", [
    (["--shape", "2,16/4,1024,128", "--causal", "yes"], {"attention_fwd"}),
    (["--shape", "8,32/8,1:8192,128", "--causal", "bottom_right"], None),
    (["--kernel", "backward", "--shape", "1,8/2,1024,64", "--causal", "yes"], None),
], ids=["forward", "decode", "backward"])
def test_profile_prints_the_table_and_draws_the_roofline(tmp_path, capsys, argv, kernels):
    assert cli.main(["profile", "--device", _arch(), *argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tensor pipe" in out and "top stalls" in out and "roofline" in out
    document = json.loads((tmp_path / "profile.json").read_text())
    (profile,) = document["profiles"]
    rows = profile["kernels"]
    assert rows[-1]["kernel"] == "total" and rows[-1]["time_us"] > 0
    assert 0 < rows[-1]["tflops"] < document["ceilings"]["tflops"] * 1.5
    if kernels is not None:
        assert {r["kernel"] for r in rows[:-1]} == kernels
    assert (tmp_path / "roofline.png").stat().st_size > 1000
    assert (tmp_path / "profile0.ncu-rep").exists() and (tmp_path / "profile0.csv").exists()


def test_compare_puts_two_schedules_side_by_side(tmp_path, capsys):
    assert cli.main(["profile", "--device", _arch(), "--shape", "2,16/4,1024,128", "--default",
                     "--compare", '{"tile_m": 64, "tile_n": 64, "occupancy": 2}',
                     "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "B/A" in out and "64x64" in out
    assert len(json.loads((tmp_path / "profile.json").read_text())["profiles"]) == 2


@pytest.mark.parametrize("argv", [
    ["--shape", "2,16/4,1024,128", "--causal", "yes"],
    ["--kernel", "backward", "--shape", "1,8/2,1024,64", "--causal", "yes"],
], ids=["forward", "backward"])
def test_compare_against_torchs_cudnn_profiles_its_kernels(tmp_path, capsys, argv):
    assert cli.main(["profile", "--device", _arch(), *argv, "--compare", "torch-cudnn",
                     "--out", str(tmp_path)]) == 0
    assert "B/A" in capsys.readouterr().out
    ours, theirs = json.loads((tmp_path / "profile.json").read_text())["profiles"]
    assert theirs["label"] == theirs["schedule"] == "torch-cudnn"
    assert not any("attention_" in r["kernel"] for r in theirs["kernels"][:-1])  # cuDNN's own
    assert theirs["kernels"][-1]["time_us"] > 0 and ours["kernels"][-1]["time_us"] > 0
    assert cli.main(["profile", "--device", _arch(), *argv, "--compare", "torch-nope"]) == 2
    assert "no such baseline" in capsys.readouterr().err
