"""What a cubin holds, read without CUDA tools: its ELF sections, and a digest of its machine code.

A cubin is a 64-bit little-endian ELF file. ``text_digest`` hashes only the code sections
(``.text.<kernel>``), so two builds compare equal when they run the same instructions, whatever
their debug-line, symbol or note sections say (those change with a comment in the source).
"""

from __future__ import annotations

import hashlib
import struct

from ..errors import InputValueError

__all__ = ["elf_sections", "kernel_symbol", "text_digest", "without_ptx_text"]

_ELF_MAGIC = b"\x7fELF"
_ELFCLASS64 = 2
_ELFDATA2LSB = 1
_SHT_NOBITS = 8  # a section that occupies no bytes in the file (.bss, .nv.shared.*)


def elf_sections(cubin: bytes) -> list[tuple[str, bytes]]:
    """``(name, contents)`` of every section of the ELF file ``cubin``, in section-header order.

    A section without file contents (``SHT_NOBITS``, e.g. ``.nv.shared.<kernel>``: static shared
    memory) comes as ``sh_size`` zero bytes, so ``len`` is its size either way. Raises ``ValueError`` if ``cubin`` is not a 64-bit little-endian ELF file or its
    headers point outside it.
    """
    return [(name, contents) for name, _, contents in _sections(cubin)]


def without_ptx_text(cubin: bytes) -> bytes:
    """``cubin`` with the contents of its PTX-text debug sections (``.nv_debug_ptx_txt``, and
    ``.nv.merc.nv_debug_ptx_txt`` on Blackwell: the PTX cuTile's ``--lineinfo`` build embeds
    for debuggers, most of a cubin's bytes) overwritten with zeros: every offset, size and
    other byte stays, so the code and what the driver loads are the same, and the zeros
    compress to nothing."""
    data = bytearray(cubin)
    for name, offset, contents in _sections(cubin):
        if name.endswith("nv_debug_ptx_txt") and offset is not None:
            data[offset:offset + len(contents)] = bytes(len(contents))
    return bytes(data)


def _sections(cubin: bytes) -> list[tuple[str, int | None, bytes]]:
    """``(name, file offset or None for SHT_NOBITS, contents)`` of every section."""
    data = bytes(cubin)
    if len(data) < 0x40 or data[:4] != _ELF_MAGIC:
        raise InputValueError(f"cubin must be an ELF file; got {len(data)} bytes starting "
                         f"{data[:4]!r}")
    if data[4] != _ELFCLASS64 or data[5] != _ELFDATA2LSB:
        raise InputValueError(f"cubin must be a 64-bit little-endian ELF file; got class {data[4]}, "
                         f"data encoding {data[5]}")
    try:
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        # Elf64_Shdr: name, type, flags, addr, offset, size, link, info (addralign, entsize follow)
        headers = [struct.unpack_from("<IIQQQQII", data, shoff + i * shentsize)
                   for i in range(shnum)]
        names_at = headers[shstrndx][4]
    except (struct.error, IndexError) as exc:
        raise InputValueError(f"cubin has a truncated or corrupt ELF section table: {exc}") from None

    def name(offset: int) -> str:
        start = names_at + offset
        end = data.find(b"\0", start)
        if start >= len(data) or end < 0:
            raise InputValueError(f"cubin has a section name outside its string table (offset {offset})")
        return data[start:end].decode(errors="replace")

    sections = []
    for sh_name, sh_type, _, _, sh_offset, sh_size, _, _ in headers:
        if sh_type == _SHT_NOBITS:
            sections.append((name(sh_name), None, bytes(sh_size)))
            continue
        if sh_offset + sh_size > len(data):
            raise InputValueError(f"cubin section {name(sh_name)!r} runs past the end of the file")
        sections.append((name(sh_name), sh_offset, data[sh_offset:sh_offset + sh_size]))
    return sections


def text_digest(cubin: bytes) -> str:
    """SHA-256 (hex) over the contents of the cubin's code sections (names starting with
    ``.text``), in section order, each prefixed with its length. Equal digests: the same machine
    code. Section names do not count (they carry the kernel's symbol, which may be mangled)."""
    digest = hashlib.sha256()
    for label, contents in elf_sections(cubin):
        if label.startswith(".text"):
            digest.update(struct.pack("<Q", len(contents)))
            digest.update(contents)
    return digest.hexdigest()


def kernel_symbol(cubin: bytes) -> str:
    """The symbol of the one kernel of ``cubin`` (its ``.text.<symbol>`` section), by which the
    driver finds it."""
    names = [name[len(".text."):] for name, _ in elf_sections(cubin) if name.startswith(".text.")]
    if len(names) != 1:
        raise InputValueError(f"a cubin of one kernel has one .text section; found {names}")
    return names[0]
