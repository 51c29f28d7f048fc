"""Count the entries of a tar stream while it passes through, without buffering it.

A volume's archive flows from a container engine into the snapshot repository (and back);
:class:`TarCounter` sits on that pipe and learns how many files it carried and how many
bytes of file contents, for the snapshot's metadata and for billing. It walks the
archive's 512-byte headers, using each header's size field to jump over the file's data
blocks, so the cost is per entry, never per byte of content: a chunk that lies wholly
inside a file's data costs one subtraction.

It reads what Python's :mod:`tarfile`, GNU tar and Go's ``archive/tar`` (Docker, Podman)
write: POSIX ustar, pax (an ``x`` header's ``size`` record overrides the next entry's
size field), GNU (``L``/``K`` long names, base-256 sizes, old-style sparse files with
extension blocks) and v7. Which entry types carry data blocks follows ``tarfile`` and
``archive/tar``: links, devices, directories and FIFOs never do, whatever their size
field says.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import Final, TypeVar

BLOCK: Final = 512
_ZERO_BLOCK: Final = bytes(BLOCK)

# Type flags (the byte at offset 156).
_AREGTYPE: Final = 0  # NUL: a regular file in old archives
_REGTYPE: Final = ord("0")
_CONTTYPE: Final = ord("7")
_GNU_SPARSE: Final = ord("S")
_DIRTYPE: Final = ord("5")
_LNKTYPE: Final = ord("1")
_PAX_ENTRY: Final = ord("x")
_PAX_GLOBAL: Final = ord("g")
_GNU_LONGNAME: Final = ord("L")
_GNU_LONGLINK: Final = ord("K")
_GNU_VOLUME: Final = ord("V")

_REGULAR: Final = frozenset({_AREGTYPE, _REGTYPE, _CONTTYPE, _GNU_SPARSE})
# Headers whose size field never announces data blocks (tarfile and archive/tar agree).
_HEADER_ONLY: Final = frozenset(ord(c) for c in "123456")
# Headers that describe the next entry (or the archive), not an entry of their own.
_PSEUDO: Final = frozenset({_PAX_ENTRY, _PAX_GLOBAL, _GNU_LONGNAME, _GNU_LONGLINK, _GNU_VOLUME})

# A pax header larger than this is not parsed (its data is still skipped correctly);
# real ones hold a few records, huge ones only extended attributes we do not need.
_PAX_PARSE_LIMIT: Final = 1 << 20

_PAX_SIZE_KEYS: Final = frozenset({b"size", b"GNU.sparse.realsize", b"GNU.sparse.size"})

_HEADER, _DATA, _PAX, _SPARSE_EXT, _END, _BROKEN = range(6)

_ADLER_MOD: Final = 65521
_SIGNED_LAYOUT: Final = struct.Struct("148b8x356b")

Chunk = TypeVar("Chunk", bound=bytes | bytearray | memoryview)


def _padded(size: int) -> int:
    return (size + BLOCK - 1) & ~(BLOCK - 1)


def _number(field: bytes) -> int:
    """A numeric header field: NUL/space-terminated octal, or GNU base-256 when the
    first byte's high bit is set. Raises ValueError when it is neither."""
    if field[0] in (0o200, 0o377):
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0o377:
            value -= 256 ** (len(field) - 1)
        return value
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _checksum_ok(block: bytes) -> bool:
    try:
        stored = _number(block[148:156])
    except ValueError:
        return False
    # The checksum is the sum of the header's bytes with its own field taken as eight
    # spaces (8 * 32). Adler-32's low half is 1 + that byte sum modulo 65521, computed
    # in C: fifty times faster than sum() over 512 ints, and exact for any sum that
    # a header with a valid octal checksum field can have except a 1-in-65521 alias,
    # which is plenty to tell a header from misaligned data.
    field_sum = sum(block[148:156])
    if (stored + field_sum - 256 + 1 - (zlib.adler32(block) & 0xFFFF)) % _ADLER_MOD == 0:
        return True
    # Some old writers summed signed chars; tarfile accepts both, and so do we.
    signed: int = sum(_SIGNED_LAYOUT.unpack(block))
    return stored == signed + 256


def _pax_sizes(records: bytes) -> tuple[int | None, int | None]:
    """The stored size (``size``) and, for a GNU sparse file, the real size
    (``GNU.sparse.realsize`` or ``GNU.sparse.size``) that the records of a pax extended
    header give, each None when absent or unreadable; the last record wins."""
    found: dict[bytes, int] = {}
    pos = 0
    while pos < len(records):
        space = records.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(records[pos:space])
        except ValueError:
            break
        if length <= 0:
            break
        record = records[space + 1 : pos + length]
        pos += length
        key, sep, value = record.partition(b"=")
        if sep and key in _PAX_SIZE_KEYS:
            try:
                found[key] = int(value.rstrip(b"\n"))
            except ValueError:
                found.pop(key, None)
    real = found.get(b"GNU.sparse.realsize", found.get(b"GNU.sparse.size"))
    return found.get(b"size"), real


class TarCounter:
    """Counts a tar stream's entries from its chunks, fed in order with :meth:`feed`.

    ``file_count`` is the number of files: regular files and hard links to them (each
    path counts, as restic counts them; directories, symlinks, devices and FIFOs do not,
    nor pseudo entries such as pax and GNU long-name headers). ``content_bytes`` is the
    sum of the sizes of regular files. Both are final once :attr:`finished` is true (the first
    end-of-archive zero block was seen); whatever follows it is ignored, as tar does.

    Chunks may split headers anywhere; only headers (and pax records) are copied,
    never file contents. A stream that is not a tar archive, or that loses its
    framing, sets :attr:`malformed` to the reason and stops counting; :meth:`feed` never
    raises, so the counter cannot break the pipe it watches.
    """

    def __init__(self) -> None:
        self.file_count = 0
        self.content_bytes = 0
        self.malformed: str | None = None
        self._state = _HEADER
        self._offset = 0  # stream offset of the next byte to be fed
        self._remaining = 0  # bytes left to skip (_DATA) or to collect (_PAX)
        self._after_pax = 0  # padding to skip once a pax header's data is collected
        self._after_sparse = 0  # data + padding of a sparse file after its extension blocks
        self._partial = bytearray()  # a header (or pax data) split across chunks
        self._size_override: int | None = None  # from a pax header, for the next entry
        self._real_size: int | None = None  # a pax GNU sparse file's length, likewise

    @property
    def finished(self) -> bool:
        """True once the end-of-archive marker was seen (the stream was complete)."""
        return self._state == _END

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Account for the next ``len(chunk)`` bytes of the stream."""
        view = memoryview(chunk)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        end = len(view)
        pos = 0
        while pos < end:
            state = self._state
            if state == _DATA:
                step = min(self._remaining, end - pos)
                pos += step
                self._remaining -= step
                if not self._remaining:
                    self._state = _HEADER
            elif state in (_HEADER, _SPARSE_EXT):
                if not self._partial and end - pos >= BLOCK:
                    block = bytes(view[pos : pos + BLOCK])
                    pos += BLOCK
                else:
                    take = min(BLOCK - len(self._partial), end - pos)
                    self._partial += view[pos : pos + take]
                    pos += take
                    if len(self._partial) < BLOCK:
                        break
                    block = bytes(self._partial)
                    self._partial.clear()
                header_offset = self._offset + pos - BLOCK
                if state == _HEADER:
                    self._header(block, header_offset)
                else:
                    self._sparse_extension(block)
            elif state == _PAX:
                take = min(self._remaining, end - pos)
                if len(self._partial) < _PAX_PARSE_LIMIT:
                    self._partial += view[pos : pos + take]
                pos += take
                self._remaining -= take
                if not self._remaining:
                    if len(self._partial) < _PAX_PARSE_LIMIT:
                        self._size_override, self._real_size = _pax_sizes(bytes(self._partial))
                    self._partial.clear()
                    self._skip(self._after_pax)
            else:  # _END or _BROKEN: the rest is not ours to count
                break
        self._offset += end

    def _skip(self, count: int) -> None:
        self._remaining = count
        self._state = _DATA if count else _HEADER

    def _header(self, block: bytes, offset: int) -> None:
        if block == _ZERO_BLOCK:
            self._state = _END
            return
        if not _checksum_ok(block):
            self._broken(f"no valid tar header at offset {offset}")
            return
        try:
            size = _number(block[124:136])
        except ValueError:
            self._broken(f"unreadable size field at offset {offset}")
            return
        kind = block[156]
        if kind == _PAX_ENTRY:
            if size < 0:
                self._broken(f"negative size at offset {offset}")
                return
            self._state = _PAX
            self._remaining = size
            self._after_pax = _padded(size) - size
            if not size:
                self._skip(0)
            return
        if kind not in _PSEUDO and self._size_override is not None:
            size = self._size_override
        if size < 0:
            self._broken(f"negative size at offset {offset}")
            return
        if kind in _PSEUDO:
            self._skip(_padded(size))
            return
        real_size = self._real_size
        self._size_override = self._real_size = None
        name = block[:100].split(b"\0", 1)[0]
        if kind == _AREGTYPE and name.endswith(b"/"):
            kind = _DIRTYPE  # v7 archives mark directories by a trailing slash only
        if kind in _REGULAR or kind == _LNKTYPE:
            self.file_count += 1
        data = 0 if kind in _HEADER_ONLY else _padded(size)
        if kind == _GNU_SPARSE:
            # The size field counts the stored (non-hole) bytes; the file's length is
            # the "real size" field of the old GNU sparse header.
            try:
                self.content_bytes += _number(block[483:495])
            except ValueError:
                self._broken(f"unreadable sparse size at offset {offset}")
                return
            if block[482]:
                self._after_sparse = data
                self._state = _SPARSE_EXT
                return
        elif kind in _REGULAR:
            # A pax GNU sparse file (format 0.x/1.0) stores its map and data blocks
            # as a plain file whose length is only in the pax records.
            self.content_bytes += size if real_size is None else real_size
        self._skip(data)

    def _sparse_extension(self, block: bytes) -> None:
        # Each extension block holds more sparse map entries and says whether
        # another follows (byte 504); the file's data comes after the last.
        if not block[504]:
            self._skip(self._after_sparse)

    @staticmethod
    def _ustar_prefix(block: bytes) -> bytes:
        # Only POSIX ustar has a prefix field; GNU keeps other fields at these offsets.
        if block[257:263] != b"ustar\0":
            return b""
        return block[345:500].split(b"\0", 1)[0]

    def _broken(self, reason: str) -> None:
        self.malformed = reason
        self._state = _BROKEN
        self._partial.clear()


def counted(chunks: Iterable[Chunk], counter: TarCounter) -> Iterator[Chunk]:
    """Yield ``chunks`` unchanged, feeding each to ``counter`` on the way."""
    for chunk in chunks:
        counter.feed(chunk)
        yield chunk
