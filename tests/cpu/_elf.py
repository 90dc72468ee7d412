"""A 64-bit little-endian ELF file of given sections, as a cubin is one: what the tests of the
cubin readers (``tiledattention.core._cubin``) build their cubins from."""

from __future__ import annotations

import struct

SHT_PROGBITS, SHT_STRTAB, SHT_NOBITS = 1, 3, 8


def elf_file(sections: list[tuple[str, int, bytes | int]]) -> bytes:
    """An ELF file with a ``.shstrtab`` and ``sections``: ``(name, type, contents)``, or for
    ``SHT_NOBITS`` ``(name, type, size)`` (no bytes in the file)."""
    labels = [".shstrtab", *(name for name, _, _ in sections)]
    names = b"\0" + b"".join(label.encode() + b"\0" for label in labels)
    name_at = {label: names.index(b"\0" + label.encode() + b"\0") + 1 for label in labels}
    body, headers = bytearray(names), [bytes(64)]
    headers.append(struct.pack("<IIQQQQIIQQ", name_at[".shstrtab"], SHT_STRTAB, 0, 0, 64,
                               len(names), 0, 0, 1, 0))
    for name, kind, contents in sections:
        if kind == SHT_NOBITS:
            offset, size = 0, contents
        else:
            offset, size = 64 + len(body), len(contents)
            body += contents
        headers.append(struct.pack("<IIQQQQIIQQ", name_at[name], kind, 0, 0, offset, size,
                                   0, 0, 1, 0))
    shoff = 64 + len(body)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64,
                          len(headers), 1)
    return header + bytes(body) + b"".join(headers)
