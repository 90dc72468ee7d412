"""What a compiled kernel asks of an SM, read from its cubin without CUDA tools
(``kernel_resources``: registers, stack, threads, shared memory), how many of its CTAs an SM
holds (``resident_ctas``), and ``tiledtune explain --resources``, which shows both for each
kernel a looked-up schedule launches. Where cuobjdump is at hand (the nvidia-cuda-cuobjdump
and nvidia-cuda-nvdisasm wheels) the reader is checked against its ``--dump-resource-usage``."""

from __future__ import annotations

import json
import re
import struct
import subprocess

import pytest

from tiledattention import BACKWARD, InputValueError, Problem
from tiledattention.core._cubin import static_shared_bytes
from tiledattention.tooling import KernelResources, kernel_resources, resident_ctas
from tuner import cli

from ._elf import SHT_NOBITS, SHT_PROGBITS, elf_file
from .test_backward_atomic import _cuobjdump

SHT_CUDA_INFO = 0x70000000
SYMBOL = "attention_bwd_dkdv_Kt2_A4bf16_1s1_7v8l0_8t1_ci16_p16_Sf32_I64_B1"


def _entry(attribute: int, payload: bytes) -> bytes:
    """A ``.nv.info`` entry of the sized format (a 16-bit length, then the bytes)."""
    return struct.pack("<BBH", 0x04, attribute, len(payload)) + payload


def _cubin(*, registers: int | None = 168, frame: int = 0, threads=(384, 1, 1),
           shared: int = 199904, past_its_section: bool = False) -> bytes:
    """A cubin of one kernel as tileiras writes one for sm_90: registers and stack in the
    ``.nv.info`` section (symbol index, value), the threads of a CTA among the kernel's own
    attributes (after entries of the other formats, 4 bytes each), static shared memory as a
    section without bytes."""
    common = b""
    if registers is not None:
        common += _entry(0x2f, struct.pack("<II", 16, registers))
    common += _entry(0x11, struct.pack("<II", 16, frame))
    common += _entry(0x12, struct.pack("<II", 16, frame))
    own = (struct.pack("<BBH", 0x03, 0x1b, 168)  # the register cap, 16-bit
           # 1,540 bytes of parameters: a value whose first byte reads as the sized format
           + struct.pack("<BBH", 0x03, 0x19, 0x0604)
           + struct.pack("<BBH", 0x01, 0x54, 0)  # an attribute without a value
           + _entry(0x1c, struct.pack("<II", 0x9fb0, 0x9fe0)))
    if threads is not None:
        own += _entry(0x10, struct.pack("<III", *threads))
    if past_its_section:
        own += struct.pack("<BBH", 0x04, 0x36, 64) + bytes(8)
    return elf_file([(".nv.info", SHT_CUDA_INFO, common),
                     (f".nv.info.{SYMBOL}", SHT_CUDA_INFO, own),
                     (f".text.{SYMBOL}", SHT_PROGBITS, bytes(32)),
                     (f".nv.shared.{SYMBOL}", SHT_NOBITS, shared)])


def test_reads_registers_stack_threads_and_shared_memory():
    found = kernel_resources(_cubin(registers=168, frame=72, threads=(128, 3, 1), shared=199904))
    assert found == KernelResources(symbol=SYMBOL, registers=168, stack_bytes=72, threads=384,
                                    shared_bytes=199904)
    assert found.name == "attention_bwd_dkdv" and found.spills
    assert not kernel_resources(_cubin(frame=0)).spills
    assert kernel_resources(_cubin(threads=None)).threads is None


@pytest.mark.parametrize("broken, says", [
    ({"registers": None}, "no register count"),
    ({"past_its_section": True}, "runs past its section"),
])
def test_a_cubin_it_cannot_read_is_refused(broken, says):
    with pytest.raises(InputValueError, match=says):
        kernel_resources(_cubin(**broken))


@pytest.mark.parametrize("registers, threads, shared, arch, ctas, limited_by", [
    # the D 128 dK/dV kernel with 8 worker warps: 5,376 registers a warp, 3 warps of 12 in each
    # quarter of the register file
    (168, 384, 199904, "sm_90", 1, ("registers", "shared memory")),
    (128, 256, 68768, "sm_90", 2, ("registers",)),  # the D 128 default's dK/dV kernel
    (80, 384, 73432, "sm_90", 2, ("registers",)),  # what tileiras makes of an occupancy of 2
    (255, 256, 232712, "sm_90", 1, ("registers", "shared memory")),  # 232,712 B fit (228 KiB)
    (32, 128, 0, "sm_90", 16, ("registers", "threads")),
    # 5,632 registers a warp: 2 warps in each quarter (11 in the whole file, but a warp's
    # registers come from one quarter): 2 CTAs of 3 warps
    (176, 96, 0, "sm_90", 2, ("registers",)),
    (32, 64, 1024, "sm_90", 32, ("registers", "threads", "CTAs")),
    (128, 256, 83080, "sm_120", 1, ("shared memory",)),  # 100 KiB an SM
    (128, 256, 83080, "sm_89", 1, ("shared memory",)),
    # 16 KiB declared: on sm_90 the reserved KiB is inside it, on sm_80 it comes on top
    (32, 128, 16384, "sm_90", 14, ("shared memory",)),
    (32, 128, 16384, "sm_80", 9, ("shared memory",)),
    (64, 128, 240000, "sm_90", 0, ("shared memory",)),  # more than an SM has
    (255, 1024, 0, "sm_90", 0, ("registers",)),  # 255 x 1024 registers: more than a CTA may
])
def test_resident_ctas(registers, threads, shared, arch, ctas, limited_by):
    resources = KernelResources(symbol="k", registers=registers, stack_bytes=0,
                                threads=threads, shared_bytes=shared)
    found = resident_ctas(resources, arch)
    assert (found.ctas, found.limited_by) == (ctas, limited_by)
    assert found.describe().startswith("does not fit" if ctas == 0 else f"{ctas} CTA")


def test_residency_is_not_guessed_where_a_limit_is_unknown():
    resources = KernelResources(symbol="k", registers=64, stack_bytes=0, threads=128,
                                shared_bytes=0)
    assert resident_ctas(resources, "sm_88") is None  # no published limits
    assert resident_ctas(KernelResources(symbol="k", registers=64, stack_bytes=0, threads=None,
                                         shared_bytes=0), "sm_90") is None


@pytest.mark.slow  # two kernels compiled: about 20 s on two cores
def test_explain_shows_what_each_kernel_of_a_schedule_asks_of_an_sm(capsys, tmp_path):
    argv = ["explain", "--device", "sm_90", "--kernel", "backward", "--shape", "1,4,512,64",
            "--causal", "yes", "--db", str(tmp_path / "none.sqlite"), "--resources"]
    assert cli.main([*argv, "--json"]) == 0
    (step,) = json.loads(capsys.readouterr().out)["lookups"]
    kernels = {k["name"]: k for k in step["kernels"]}
    assert {"attention_bwd_dkdv", "attention_bwd_dq"} <= set(kernels)
    for k in kernels.values():
        assert 0 < k["registers"] <= 255 and k["threads"] % 128 == 0
        assert 1024 <= k["shared_bytes"] <= 228 << 10 and k["ctas_per_sm"] >= 1
    # the same build's cubins, read by the same reader and by the shared-memory one
    problem = Problem(batch=1, heads_q=4, heads_kv=4, seqlen_q=512, seqlen_k=512, head_dim=64,
                      dtype="bf16", causal=True)
    built = BACKWARD.compile(problem, BACKWARD.default_schedule("sm_90", problem), "sm_90")
    cubins = built.cubins
    assert [r.to_dict() for r in built.resources()] == [
        {key: value for key, value in k.items()
         if key not in ("ctas_per_sm", "limited_by", "residency", "ctas", "sms", "waves")}
        for k in step["kernels"]]
    assert [static_shared_bytes(c) for c in cubins] == [k["shared_bytes"] for k in step["kernels"]]

    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    shown = [line for line in lines if re.search(r"attention_bwd_\w+: \d+ registers", line)]
    assert len(shown) == len(cubins) and "CTA" in shown[0] and "KiB shared" in shown[0]

    tool = _cuobjdump()
    if tool is None:
        return  # the reader against cuobjdump: where the wheels are installed
    for i, cubin in enumerate(cubins):
        path = tmp_path / f"{i}.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([tool, "--dump-resource-usage", str(path)], capture_output=True,
                             text=True, check=True).stdout
        registers, stack, shared = map(int, re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)",
                                                      out).groups())
        found = kernel_resources(cubin)
        assert (found.registers, found.stack_bytes, found.shared_bytes) == (registers, stack,
                                                                            shared)


def test_explain_says_when_a_schedule_does_not_compile(capsys, monkeypatch, tmp_path):
    from tiledattention import CompileError

    def refuse(problem, schedule, arch):
        raise CompileError("tileiras: out of shared memory")

    monkeypatch.setattr(BACKWARD, "compile", refuse)
    assert cli.main(["explain", "--device", "sm_90", "--kernel", "backward", "--shape",
                     "1,4,512,64", "--db", str(tmp_path / "none.sqlite"), "--resources"]) == 0
    assert "kernels  not compiled: tileiras: out of shared memory" in capsys.readouterr().out
