"""``tiledtune profile`` on the CPU: Nsight Compute raw CSV pages recorded on an H100
(``tests/cpu/fixtures/ncu/``, written by the command on the GPU machine; see
docs/profiling.md) parsed into the table, the comparison and the roofline, and the one-line
refusals where this machine cannot profile."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from rich.console import Console

from tuner import cli
from tuner.errors import UnreadableFile
from tuner.profile import (Ceilings, KernelRecord, Profile, compare_table, paired_rows,
                           parse_raw_csv, profile_table, roofline_png)
from tuner.profile._ncu import failure_reason

FIXTURES = Path(__file__).parent / "fixtures" / "ncu"
CEILINGS = Ceilings(tflops=778.0, gbps=3028.0)


def _records(name: str):
    return tuple(parse_raw_csv((FIXTURES / name).read_text(), name))


def _text(table) -> str:
    console = Console(width=400, record=True, force_terminal=False)
    console.print(table)
    return console.export_text()


def test_a_forward_page_reads_into_one_launch():
    (k,) = _records("forward.csv")
    assert k.short_name == "attention_fwd"
    assert k.number("gpu__time_duration.sum") == pytest.approx(951_900, rel=1e-3)  # ns
    assert k.number("launch__registers_per_thread") == 128
    assert k.values["Grid Size"] == "(64, 128, 1)"
    # B4 H32/8 S4096 D128 causal: 4 * 32 * 4096^2 * 128 * 2 flops
    p = Profile("looked-up", "forward", "B4 H32/8 S4096 D128 bf16 causal", "128x128",
                4 * 32 * 4096 * 4096 * 128 * 2.0, (k,), CEILINGS, 2)
    row, total = p.rows()
    assert total["time_us"] == pytest.approx(951.9, rel=1e-3)
    assert total["tflops"] == pytest.approx(578, rel=0.01) and row["tflops"] == total["tflops"]
    assert row["tflops_share"] == pytest.approx(578 / 778, rel=0.01)
    assert row["blocks_per_sm"] == 2 and row["limited_by"] == ["registers", "shared memory"]
    assert row["stalls"][0][0] == "long_scoreboard" and len(row["stalls"]) == 3
    text = _text(profile_table(p))
    for line in ("tensor pipe (% active)", "65.6", "occupancy theoretical (%)", "25.0",
                 "long_scoreboard 3.17", "(64, 128, 1)", "74%"):
        assert line in text, line


def test_scaled_units_read_as_ns_and_bytes():
    """A page printed with ncu's automatic units (us, Kbyte/block, Mbyte) reads as a page in
    base units would."""
    dq, dkdv = _records("backward_scaled_units.csv")
    assert (dq.short_name, dkdv.short_name) == ("attention_bwd_dq", "attention_bwd_dkdv")
    assert dq.units["gpu__time_duration.sum"] == "ns"
    assert dq.number("gpu__time_duration.sum") == pytest.approx(206_400, rel=1e-3)
    assert dq.number("dram__bytes_read.sum") > 1e8  # bytes, not Mbyte
    p = Profile("looked-up", "backward", "B2", "s", 1e12, (dq, dkdv), CEILINGS)
    rows = p.rows()
    assert [r["kernel"] for r in rows] == ["attention_bwd_dq", "attention_bwd_dkdv", "total"]
    assert rows[-1]["time_us"] == pytest.approx(rows[0]["time_us"] + rows[1]["time_us"])
    assert rows[0].get("tflops") is None and rows[-1]["tflops"] == pytest.approx(
        1e12 / rows[-1]["time_us"] / 1e6)
    assert rows[0]["shared_bytes"] > 1e5


def test_compare_highlights_what_differs():
    a = Profile("default", "decode", "B1 H32/4 S1x32768", "split33", 1e9,
                _records("decode_default.csv"), CEILINGS, 1)
    b = Profile("looked-up", "decode", "B1 H32/4 S1x32768", "split24", 1e9,
                _records("decode_shipped.csv"), CEILINGS, 2)
    assert [k.short_name for k in a.kernels] == ["decode_split", "decode_combine"]
    text = _text(compare_table(a, b))
    assert "decode_split A" in text and "total B" in text
    registers = next(line for line in text.splitlines() if "registers per thread" in line)
    assert "255" in registers and "128" in registers and "0.50" in registers
    markup = compare_table(a, b).columns[1]._cells  # the split kernel's A column
    assert any("[bold yellow]255" in cell for cell in markup)  # registers: highlighted
    assert not any("[bold yellow]0[/]" == cell for cell in markup)  # spills equal: plain


def test_the_roofline_is_a_small_png(tmp_path):
    pytest.importorskip("matplotlib")
    a = Profile("default", "decode", "B1", "split33", 2 * 32 * 32768 * 128 * 2.0,
                _records("decode_default.csv"), CEILINGS)
    f = Profile("looked-up", "forward", "B4", "128x128", 4 * 32 * 4096 * 4096 * 128 * 2.0,
                _records("forward.csv"), CEILINGS)
    path = roofline_png([a, f], CEILINGS, tmp_path / "roofline.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 2000 < len(data) < 150_000


def test_a_page_that_is_not_one_is_refused():
    with pytest.raises(UnreadableFile, match="raw page"):
        parse_raw_csv("==PROF== Connected\nsome,csv\n1,2\n", "x.csv")
    header = (FIXTURES / "forward.csv").read_text().splitlines()[:2]
    with pytest.raises(UnreadableFile, match="no kernel launch"):
        parse_raw_csv("\n".join(header), "y.csv")


def test_ncus_failures_are_named_with_a_fix():
    assert "permission" in failure_reason("==ERROR== ERR_NVGPUCTRPERM - The user does not ...")
    assert "gVisor" in failure_reason("==ERROR== Failed to initialize the profiler: "
                                      "LibraryNotLoaded")
    assert failure_reason("==PROF== Disconnected") is None


def test_without_a_gpu_or_ncu_the_command_refuses_in_one_line(monkeypatch, capsys):
    import torch

    import tiledattention
    from tuner.profile import _ncu

    argv = ["profile", "--device", "sm_90", "--shape", "1,8,256,64"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA GPU" in err[0] and "Traceback" not in err[0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tiledattention, "device_info",
                        lambda i: type("D", (), {"arch": "sm_90"})())
    monkeypatch.setattr(_ncu.shutil, "which", lambda name: None)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ncu is not on PATH" in err[0]
    assert cli.main(["profile", "--device", "sm_100", "--shape", "1,8,256,64"]) == 2
    assert "another architecture" in capsys.readouterr().err
    assert cli.main(argv + ["--schedule", "{not json"]) == 2
    assert "JSON object" in capsys.readouterr().err


def test_a_baseline_with_other_launches_is_compared_by_its_longest_and_in_total():
    ours = Profile("looked-up", "decode", "B1 H32/4 S1x32768", "split24", 1e9,
                   _records("decode_shipped.csv"), CEILINGS, 2)
    torch_ = Profile("torch-cudnn", "decode", "B1 H32/4 S1x32768", "torch-cudnn", 1e9,
                     _records("forward.csv"), CEILINGS)
    pairs = paired_rows(ours, torch_)
    longest = max(ours.rows()[:-1], key=lambda r: r["time_us"])
    assert [(a["kernel"], b["kernel"]) for a, b in pairs] == [
        (longest["kernel"], torch_.rows()[0]["kernel"]), ("total", "total")]
    assert pairs[1][0]["time_us"] == pytest.approx(sum(r["time_us"] for r in ours.rows()[:-1]))
    text = _text(compare_table(ours, torch_))
    assert "total A" in text and "total B" in text
    long = "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1"
    record = KernelRecord(long, dict(ours.kernels[0].values), dict(ours.kernels[0].units))
    header = compare_table(ours, dataclasses.replace(torch_, kernels=(record,))).columns[1].header
    assert header.startswith("decode_split/cudnn_gene") and header.endswith("128_1x4x1 A")
    assert len(header) < 70
    same = Profile("default", "decode", "B1 H32/4 S1x32768", "split33", 1e9,
                   _records("decode_default.csv"), CEILINGS, 1)
    assert len(paired_rows(ours, same)) == 3  # launch by launch, then the totals


def test_a_baseline_is_compared_beside_a_schedule_and_checked_by_the_case(monkeypatch, capsys):
    import subprocess

    from tuner.commands.profile_cmd import _schedule
    from tuner.errors import UsageError
    from tuner.profile import _ncu
    from tuner.profile._target import REFUSED

    assert _schedule(None, None, "sm_90", "torch-cudnn") == ("torch-cudnn", None)
    assert cli.main(["profile", "--device", "sm_90", "--shape", "1,8,256,64",
                     "--schedule", "torch-cudnn"]) == 2
    assert "goes in --compare" in capsys.readouterr().err
    # the target's refusal (an unknown baseline) reaches the user as a usage error
    done = subprocess.CompletedProcess([], 3, stdout="==PROF== Connected to process\n",
                                       stderr=f"{REFUSED}--compare torch-x: no such baseline\n")
    monkeypatch.setattr(_ncu.subprocess, "run", lambda *a, **k: done)
    with pytest.raises(UsageError, match="^--compare torch-x: no such baseline$"):
        _ncu._run(["ncu"], 10)
