"""``restamp`` compares every kernel a schedule builds, not only the first: a decode schedule's
combine kernel and a backward schedule's dQ kernel come in ``CompileResult.other_cubins``, and a
row whose second kernel changed must be listed for re-tuning (its timing described the old one).

Both sides are stand-ins, so this runs in a second or two: the old code is a directory holding a
``tiledattention`` package of a few lines (run by restamp's own old-code script in its own
process), and the current family's ``compile`` returns hand-made cubins (small ELF files whose
``.text`` section is the "machine code").
"""

from __future__ import annotations

import base64
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import db
from tiledattention import BACKWARD, DECODE, CompileResult, Problem
from tiledattention.tooling import current_provenance, text_digest
from tuner.transfer import _restamp
from tuner.transfer._restamp import restamp

from ._elf import SHT_PROGBITS, elf_file

OLD_IDENTITY = "0123456789ab"
FAMILIES = {"decode": DECODE, "backward": BACKWARD}
PROBLEMS = {
    "decode": Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=1, seqlen_k=4096, head_dim=128,
                      dtype="bf16", causal=False),
    "backward": Problem(batch=1, heads_q=8, heads_kv=8, seqlen_q=1024, seqlen_k=1024,
                        head_dim=128, dtype="bf16", causal=True),
}


def cubin(code: bytes, debug: bytes = b"line 1") -> bytes:
    """A cubin with sections ``.text.kernel`` (``code``) and ``.nv_debug_line_sass``
    (``debug``, which ``text_digest`` ignores)."""
    return elf_file([(".text.kernel", SHT_PROGBITS, code),
                     (".nv_debug_line_sass", SHT_PROGBITS, debug)])


OLD_PACKAGE = '''
import base64

CUBINS = {cubins!r}


class _Built:
    cubin = base64.b64decode(CUBINS[0])
    other_cubins = tuple(base64.b64decode(c) for c in CUBINS[1:])


class _Type:
    @staticmethod
    def from_dict(data):
        return data


class _Family:
    problem_type = schedule_type = _Type

    def template_identity(self):
        return {identity!r}

    def compile(self, problem, schedule, arch):
        return _Built()


def get_family(name):
    return _Family()
'''


def old_code(tmp_path: Path, cubins: tuple[bytes, ...]) -> Path:
    """A directory holding old code whose every schedule compiles to ``cubins``."""
    package = tmp_path / "old" / "tiledattention"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(OLD_PACKAGE.format(
        cubins=[base64.b64encode(c).decode() for c in cubins], identity=OLD_IDENTITY))
    return package.parent


@pytest.fixture
def current(monkeypatch):
    """``current(name, cubins)``: the family ``name`` now compiles every schedule to
    ``cubins``. (The current side's compiles run in threads here, so the stand-in is seen.)"""
    monkeypatch.setattr(_restamp, "ProcessPoolExecutor", ThreadPoolExecutor)

    def compiles_to(name: str, cubins: tuple[bytes, ...]) -> None:
        result = CompileResult(arch="sm_90", cubin_size=len(cubins[0]), seconds=0.0,
                               cubin=cubins[0], shared_bytes=None, other_cubins=cubins[1:])
        monkeypatch.setattr(FAMILIES[name], "compile", lambda problem, schedule, arch: result)
    return compiles_to


def stale_row(name: str) -> db.ScheduleRow:
    family, problem = FAMILIES[name], PROBLEMS[name]
    provenance = dataclasses.replace(current_provenance(family), template_hash=OLD_IDENTITY)
    return db.ScheduleRow(family=name, arch="sm_90", device_name="NVIDIA H100 80GB HBM3",
                          problem=problem, schedule=family.default_schedule("sm_90", problem),
                          median_ms=0.05, spread_ms=0.001, tflops=100.0, trials=12,
                          provenance=provenance)


FIRST = cubin(b"\x01" * 32)
SECOND = cubin(b"\x02" * 32)
SECOND_CHANGED = cubin(b"\x02" * 31 + b"\x03")


def test_the_stand_in_cubins_differ_only_where_meant():
    assert text_digest(SECOND) != text_digest(SECOND_CHANGED)
    assert text_digest(SECOND) == text_digest(cubin(b"\x02" * 32, debug=b"line 2"))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_changed_second_kernel_lists_the_row_for_retuning(name, tmp_path, current):
    current(name, (FIRST, SECOND_CHANGED))
    row = stale_row(name)
    result = restamp([row], str(old_code(tmp_path, (FIRST, SECOND))), workers=1)
    assert result.restamped == []
    assert [(r, why) for r, why in result.retune] == [(row, "compiled code changed")]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_changed_first_kernel_lists_the_row_for_retuning(name, tmp_path, current):
    current(name, (cubin(b"\x09" * 32), SECOND))
    result = restamp([stale_row(name)], str(old_code(tmp_path, (FIRST, SECOND))), workers=1)
    assert result.restamped == [] and [why for _, why in result.retune] == [
        "compiled code changed"]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_kernel_added_or_dropped_lists_the_row_for_retuning(name, tmp_path, current):
    current(name, (FIRST,))
    result = restamp([stale_row(name)], str(old_code(tmp_path, (FIRST, SECOND))), workers=1)
    assert result.restamped == [] and len(result.retune) == 1


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_unchanged_kernels_are_restamped(name, tmp_path, current):
    """Both kernels' ``.text`` unchanged (their debug sections differ): the row carries over
    with the current identity."""
    current(name, (cubin(b"\x01" * 32, debug=b"moved"), cubin(b"\x02" * 32, debug=b"moved")))
    row = stale_row(name)
    result = restamp([row], str(old_code(tmp_path, (FIRST, SECOND))), workers=1)
    assert result.retune == []
    (carried,) = result.restamped
    assert carried.provenance.template_hash == FAMILIES[name].template_identity()
    assert dataclasses.replace(carried, provenance=row.provenance) == row


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_real_builds_carry_their_second_kernel(name):
    """What restamp digests: the decode build (several splits) carries its combine kernel, the
    backward build its dQ kernel (and, split, the partials' sum), each a cubin of code of its
    own (compile-only, sm_90)."""
    family, problem = FAMILIES[name], PROBLEMS[name]
    schedule = family.default_schedule("sm_90", problem)
    if name == "decode":
        assert schedule.splits > 1  # so that there is a combine kernel
    built = family.compile(problem, schedule, "sm_90")
    second = built.other_cubins[0]
    assert len(built.other_cubins) == (2 if getattr(schedule, "dkdv_splits", 1) > 1 else 1)
    assert second[:4] == b"\x7fELF" and text_digest(second) != text_digest(built.cubin)


def test_jobs_leave_out_added_fields_at_their_default_for_older_code():
    """Code older than a schedule field must read the schedule it tuned: fields added since the
    format was written go to it only where they differ from their default."""
    from pathlib import Path

    import db
    import tiledattention
    from tiledattention.tooling import codecs
    from tuner.transfer._restamp import _job

    table = Path(tiledattention.__file__).parent / "pretuned" / "sm_90.json"
    row = next(r for r in db.load_rows_file(table, codecs()) if r.family == "backward"
               and r.schedule.dkdv_splits > 1)
    _, _, schedule, _ = _job(row)
    assert schedule["dkdv_splits"] == row.schedule.dkdv_splits  # not the default: kept
    assert "tile_major" not in schedule and not row.schedule.tile_major
    moved = dataclasses.replace(row, schedule=row.schedule.replace(tile_major=True))
    assert _job(moved)[2]["tile_major"] is True
