"""What a cubin holds, read without CUDA tools: its ELF sections, a digest of its machine code,
and what its kernel asks of an SM.

A cubin is a 64-bit little-endian ELF file. ``text_digest`` hashes only the code sections
(``.text.<kernel>``), so two builds compare equal when they run the same instructions, whatever
their debug-line, symbol or note sections say (those change with a comment in the source).
``kernel_resources`` reads the attributes the driver loads the kernel by (``.nv.info``: its
registers a thread, stack, threads a CTA) and its static shared memory, what ``cuobjdump
--dump-resource-usage`` prints.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass

from ..errors import InputValueError

__all__ = ["KernelResources", "elf_sections", "kernel_resources", "kernel_symbol",
           "static_shared_bytes", "text_digest", "without_ptx_text"]

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
    return _symbol(elf_sections(cubin))


def _symbol(sections: list[tuple[str, bytes]]) -> str:
    names = [name[len(".text."):] for name, _ in sections if name.startswith(".text.")]
    if len(names) != 1:
        raise InputValueError(f"a cubin of one kernel has one .text section; found {names}")
    return names[0]


def static_shared_bytes(cubin: bytes) -> int | None:
    """Static shared memory of the one kernel of ``cubin`` (its ``.nv.shared.<symbol>``
    section's size), or None where the cubin is no such ELF file or has no such section."""
    try:
        sections = elf_sections(cubin)
        symbol = _symbol(sections)
    except InputValueError:
        return None
    return _shared(dict(sections), symbol)


def _shared(named: dict[str, bytes], symbol: str) -> int | None:
    contents = named.get(f".nv.shared.{symbol}")
    return None if contents is None else len(contents)


#: ``.nv.info`` attribute formats (the first byte of an entry; the second is the attribute)
_EIFMT_SVAL = 0x04  # a 16-bit length and that many bytes follow; the other formats: 4 bytes
#: attributes read here (each a ``(symbol index, value)`` pair of 32-bit words, but REQNTID)
_EIATTR_REQNTID = 0x10  # threads a CTA: x, y, z (in the kernel's own .nv.info.<kernel>)
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_MIN_STACK_SIZE = 0x12
_EIATTR_MAX_STACK_SIZE = 0x23
_EIATTR_REGCOUNT = 0x2f


@dataclass(frozen=True)
class KernelResources:
    """What one kernel asks of an SM, as its cubin says.

    registers: a thread's; stack_bytes: a thread's local-memory frame (above zero: the code
    keeps values in local memory, registers spilled or arrays indexed at run time); threads:
    a CTA's (``None`` where the cubin does not fix them); shared_bytes: static shared memory a
    CTA (cuTile kernels allocate all of theirs statically)."""

    symbol: str
    registers: int
    stack_bytes: int
    threads: int | None
    shared_bytes: int

    @property
    def name(self) -> str:
        """The kernel function's name: its symbol without the signature cuTile appends
        (``_K`` and the mangled argument types)."""
        found = re.match(r"(.+?)_K[a-z]\d", self.symbol)
        return found.group(1) if found else self.symbol

    @property
    def spills(self) -> bool:
        return self.stack_bytes > 0

    def to_dict(self) -> dict:
        return {"name": self.name, "symbol": self.symbol, "registers": self.registers,
                "stack_bytes": self.stack_bytes, "threads": self.threads,
                "shared_bytes": self.shared_bytes}


def _attributes(contents: bytes) -> list[tuple[int, bytes]]:
    """``(attribute, value bytes)`` of each entry of a ``.nv.info`` section (a value of four or
    fewer bytes for the fixed-size formats)."""
    found, at = [], 0
    while at + 4 <= len(contents):
        form, attribute = contents[at], contents[at + 1]
        if form == _EIFMT_SVAL:
            size, = struct.unpack_from("<H", contents, at + 2)
            if at + 4 + size > len(contents):
                raise InputValueError(f"cubin has a .nv.info entry (attribute {attribute:#x}) "
                                      "that runs past its section")
            found.append((attribute, contents[at + 4:at + 4 + size]))
            at += 4 + size
        else:
            found.append((attribute, contents[at + 2:at + 4]))
            at += 4
    return found


def kernel_resources(cubin: bytes) -> KernelResources:
    """The registers, stack, threads and static shared memory of the one kernel of ``cubin``
    (:class:`KernelResources`); :class:`InputValueError` where the cubin lacks them."""
    sections = elf_sections(cubin)
    symbol = _symbol(sections)
    named = dict(sections)
    per_symbol: dict[int, int] = {}
    for attribute, value in _attributes(named.get(".nv.info", b"")):
        if attribute in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE, _EIATTR_MIN_STACK_SIZE,
                         _EIATTR_MAX_STACK_SIZE) and len(value) == 8:
            # one kernel a cubin: the symbol index (the first word) is that kernel's
            per_symbol[attribute] = max(per_symbol.get(attribute, 0),
                                        struct.unpack("<II", value)[1])
    if _EIATTR_REGCOUNT not in per_symbol:
        raise InputValueError(f"cubin of {symbol!r} has no register count in its .nv.info")
    threads = None
    for attribute, value in _attributes(named.get(f".nv.info.{symbol}", b"")):
        if attribute == _EIATTR_REQNTID and len(value) == 12:
            x, y, z = struct.unpack("<III", value)
            threads = x * y * z
    stack = max(per_symbol.get(a, 0) for a in (_EIATTR_FRAME_SIZE, _EIATTR_MIN_STACK_SIZE,
                                                _EIATTR_MAX_STACK_SIZE))
    return KernelResources(symbol=symbol, registers=per_symbol[_EIATTR_REGCOUNT],
                           stack_bytes=stack, threads=threads,
                           shared_bytes=_shared(named, symbol) or 0)
