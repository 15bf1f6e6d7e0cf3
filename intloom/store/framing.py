"""The byte layout of log segments: a versioned file header, then checksummed frames.

A frame is ``FRAME_MAGIC | length u32 | crc32 u32 | body`` where the crc covers the length
bytes and the body, and the body is ``kind u8 | seq u64 | run-id length u16 | run id |
payload``. The magic lets a reader find the next frame after damaged bytes, so one flipped
byte hides nothing but the frame it hit. docs/format.md is the prose version of this file.
"""

from __future__ import annotations

import re
import struct
import zlib
from typing import Annotated, Final, Literal

import msgspec

from intloom.runtime.limits import MAX_RECORD_BYTES
from intloom.runtime.records import FORMAT_VERSION

__all__ = [
    "FRAME_MAGIC",
    "KIND_RECORD",
    "KIND_SEAL",
    "KIND_VOID",
    "MAX_SEGMENT",
    "SEGMENT_FORMAT",
    "SEGMENT_FORMATS",
    "SEGMENT_MAGIC",
    "Candidate",
    "Damage",
    "Frame",
    "SealNotice",
    "SegmentHeader",
    "SegmentNumber",
    "SegmentScan",
    "VoidNotice",
    "encode_frame",
    "encode_segment_header",
    "format_problem",
    "frame_of",
    "rebuilt_payload",
    "scan_segment",
    "segment_header",
    "segment_name",
    "segment_number",
]

SEGMENT_MAGIC: Final = b"ILOOMWAL"
# The format a writer gives its segments. Format 2 is format 1's bytes, except that an
# unsealed segment may end in zero bytes its writer preallocated and never wrote to (an
# overwrite of allocated blocks needs no metadata in its fdatasync: ~25 % less per flush,
# docs/performance.md). A format-1 reader would take those zeros for damage, hence the number.
SEGMENT_FORMAT: Final = 2
SEGMENT_FORMATS: Final = (FORMAT_VERSION, SEGMENT_FORMAT)
# 0xc1 is the one byte msgpack never emits, so the marker is rare inside encoded records.
FRAME_MAGIC: Final = b"\xc1\xa7IL"
KIND_RECORD: Final = 1
KIND_VOID: Final = 2
KIND_SEAL: Final = 3
_KINDS: Final = frozenset({KIND_RECORD, KIND_VOID, KIND_SEAL})
MAX_BODY: Final = MAX_RECORD_BYTES
# Damaged regions up to this size keep their bytes, so a reader can tell whose frame it was.
_KEEP_DAMAGED: Final = 1 << 20
# A segment's file name is its number in exactly ten ASCII digits: the highest number a
# writer may create, so that no name it writes is one the reader does not take for a segment.
MAX_SEGMENT: Final = 9_999_999_999
# A segment number a manifest or a notice names: out of range (written by hand, its
# checksum put right) it failed every command that read it (CLI_INTERNAL_ERROR), a start too.
SegmentNumber = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEGMENT)]
_SEGMENT_NAME: Final = re.compile(r"[0-9]{10}\.seg")
# The writer's header body is ~150 bytes; a header length beyond this is damage, never a
# header that a crash cut short.
_MAX_HEADER: Final = 4096

_SEG_PREFIX = struct.Struct(">8sHII")  # magic, format, header length, header crc
_FRAME_HEAD = struct.Struct(">4sII")  # magic, body length, crc32(length bytes + body)
_BODY_HEAD = struct.Struct(">BQH")  # kind, per-run seq, run-id length
_LEN = struct.Struct(">I")

SegmentStatus = Literal["ok", "empty", "torn_header", "foreign", "damaged_header", "incompatible"]


class SegmentHeader(msgspec.Struct, frozen=True):
    """Who wrote a segment, and in which format."""

    number: int
    instance_id: str
    package_version: str
    protocol: str
    created_at: str
    format: int = SEGMENT_FORMAT


class VoidNotice(msgspec.Struct, frozen=True):
    """Bytes of ``segment`` from ``offset`` on belong to a batch whose write or fsync failed."""

    segment: SegmentNumber
    offset: int
    cause: str = ""


class SealNotice(msgspec.Struct, frozen=True, kw_only=True):
    """The writer closed this segment cleanly; nothing follows.

    Encoded with ``at`` last (a reader takes the keys in any order): a close's ``next`` is
    0, and a seal ending in a zero byte read, damaged, as a frame cut short where the
    preallocated zeros begin (format 2), not as a whole frame failing its checksum."""

    frames: int
    # The segment a rotation created, durably, before sealing this one (0: a close, or a
    # writer from before this field). A reader that finds it gone knows records may be
    # lost with it; a reader without the field ignores the key.
    next: SegmentNumber = 0
    at: str


def segment_name(number: int) -> str:
    if not 0 <= number <= MAX_SEGMENT:
        raise ValueError(f"segment number {number} has no ten-digit file name")
    return f"{number:010d}.seg"


def segment_number(name: str) -> int | None:
    """The number of a segment file name (ten ASCII digits), or None for any other name."""
    if _SEGMENT_NAME.fullmatch(name):
        return int(name[:10])
    return None


def format_problem(found: int, reads: tuple[int, ...] = (FORMAT_VERSION,)) -> str:
    """What a file of format ``found`` (none of ``reads``) is, and what to do about it."""
    said = f"is format {found}; this intloom reads {_formats(reads)}"
    if found > max(reads):
        return (f"{said} (a newer intloom wrote it: run an intloom that reads format {found} "
                "to resume or end its Runs; the file is kept as it is)")
    return (f"{said} (no intloom writes format {found}, so its fixed format field may be "
            "damaged; the file is kept as it is)")


def _formats(reads: tuple[int, ...]) -> str:
    return " and ".join(str(n) for n in reads)


def encode_segment_header(header: SegmentHeader) -> bytes:
    body = msgspec.msgpack.encode(header)
    return _SEG_PREFIX.pack(SEGMENT_MAGIC, header.format, len(body), zlib.crc32(body)) + body


# crc32 of a body length's 4 bytes, by length: the crc starts with them, and a host writes
# the same few record sizes over and over (a pack and a crc call fewer per record).
_LEN_CRC: dict[int, int] = {}


def _len_crc(size: int) -> int:
    crc = zlib.crc32(_LEN.pack(size))
    if len(_LEN_CRC) < 4096:
        _LEN_CRC[size] = crc
    return crc


def encode_frame(kind: int, seq: int, run_id: bytes, payload: bytes) -> bytes:
    body = _BODY_HEAD.pack(kind, seq, len(run_id)) + run_id + payload
    size = len(body)
    start = _LEN_CRC.get(size)
    if start is None:
        start = _len_crc(size)
    return _FRAME_HEAD.pack(FRAME_MAGIC, size, zlib.crc32(body, start)) + body


class Frame(msgspec.Struct, frozen=True):
    """One checksum-valid frame (never changed once read).

    A Struct, not a dataclass: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__`` (~1 us per frame), a slotted one takes ~0.27 us, this ~0.11, and
    a restore after a crash makes one per record of the log since the last snapshots
    (16 MiB, ~84k records, is usual for 64 busy Runs: ``writer.DEFAULT_SEGMENT_BYTES``)."""

    kind: int
    seq: int
    run_id: str
    payload: bytes
    offset: int
    end: int


class Candidate(msgspec.Struct, frozen=True):
    """What a damaged region's bytes claim (unverified): a record of ``run_id`` at ``seq``."""

    run_id: str
    seq: int
    offset: int
    claimed_end: int = 0  # where its length field says the frame ends


class Damage(msgspec.Struct):
    """Bytes ``[start, end)`` that are no valid frame. ``at_tail``: nothing valid follows."""

    start: int
    end: int
    at_tail: bool
    after_seal: bool
    candidates: list[Candidate] = msgspec.field(default_factory=list)
    raw: bytes = b""  # the damaged bytes themselves (empty beyond _KEEP_DAMAGED)
    # At the tail: the bytes are a proper prefix of one frame (marker, a length pointing
    # past the end of the file), all that a write cut short by a crash of the process can
    # leave. False for a length-complete frame that fails its checksum.
    cut_short: bool = False
    # The bytes begin as a frame does (its marker, or as much of it as they hold): else
    # they are no frame at all (zeros, bytes appended by something else), however long.
    marked: bool = True


class SegmentScan(msgspec.Struct):
    """Everything one segment's bytes say, judged without any other file."""

    name: str
    number: int
    size: int
    status: SegmentStatus
    header: SegmentHeader | None = None
    format_found: int | None = None
    problem: str | None = None
    frames: list[Frame] = msgspec.field(default_factory=list)
    damage: list[Damage] = msgspec.field(default_factory=list)
    sealed: bool = False
    next_segment: int = 0  # the seal's ``next``: the segment created before this one sealed
    # Where the first seal ends (0: none). A writer never appends after sealing, so a frame
    # from there on, however its crc reads, is not part of the segment as written.
    sealed_end: int = 0
    # What is wrong with a seal whose crc checks out but whose content is not one a writer
    # makes (its payload does not decode, or it names a Run or a seq); None: nothing.
    seal_problem: str | None = None
    # The file was last written after the OS last started (set by the reader from its
    # mtime; None: unknown). Then no crash since can have left unflushed pages in it, and
    # its bytes are exactly what was written: a torn write can only be cut short.
    written_this_boot: bool | None = None
    # A later segment that this one's writer (the same instance id in its header) wrote
    # past its header: its number (0: none). A writer stops appending to a segment before
    # it writes into the next one (a rotation seals this one first; a failed write voids
    # the rest of it), so no crash of that writer left this one's end cut short: damage
    # there is corruption (set by the reader, which looks at the later files in wal/).
    went_on: int = 0
    # Where the frames begin (the end of the file header, as read): a writer's void notice
    # is there, the first frame of the fresh segment that replaces a failed one. Judged
    # by place, not as frames[0]: a read keeping only some Runs' frames made a notice
    # written after other frames the first one it kept.
    frames_from: int = -1
    # Zero bytes the file ends in after its last frame (or damage) that its writer
    # preallocated and never wrote to: only an unsealed format-2 segment (a writer's that
    # crashed, or the one it still writes) has them, and they are not damage.
    unused: int = 0

    def is_torn(self, damage: Damage) -> bool:
        """Whether ``damage`` is a torn tail (a crash mid-append) rather than corruption.

        Only damage running to the end of an unsealed segment can be, and only when its
        writer did not go on to write a later segment (``went_on``). Bytes cut short
        (``Damage.cut_short``) then always are. A length-complete last frame that fails its
        checksum is what a crash of the OS can leave (its pages reached the disk out of
        order, some never): it is taken as torn only when the OS may have restarted since the
        segment was last written; otherwise no crash can have produced it, and it is damage.
        docs/format.md has the reasoning.
        """
        if not damage.at_tail or damage.after_seal or self.went_on:
            return False
        return damage.cut_short or self.written_this_boot is not True

    @property
    def torn(self) -> Damage | None:
        """The torn tail: damage running to the end of an unsealed segment (a crash mid-append)."""
        if self.damage and self.is_torn(self.damage[-1]):
            return self.damage[-1]
        return None


def _frame_at(data: bytes, p: int, size: int, view: memoryview | None = None) -> Frame | None:
    """The frame at ``p``, if one is whole and checks out there; ``view``: ``data``'s."""
    if p + _FRAME_HEAD.size > size:
        return None
    magic, length, crc = _FRAME_HEAD.unpack_from(data, p)
    if magic != FRAME_MAGIC or length < _BODY_HEAD.size or length > MAX_BODY:
        return None
    start = p + _FRAME_HEAD.size
    end = start + length
    if end > size:
        return None
    if view is None:
        view = memoryview(data)
    head = _LEN_CRC.get(length)  # the crc of the length field, as encode_frame takes it
    if head is None:
        head = _len_crc(length)
    if zlib.crc32(view[start:end], head) != crc:
        return None
    kind, seq, rid_len = _BODY_HEAD.unpack_from(data, start)
    rid_end = start + _BODY_HEAD.size + rid_len
    if kind not in _KINDS or rid_end > end:
        return None
    try:
        run_id = data[start + _BODY_HEAD.size : rid_end].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return Frame(kind, seq, run_id, data[rid_end:end], p, end)


def frame_of(data: bytes) -> Frame | None:
    """The frame ``data`` is exactly, if it is one whole frame that checks out; None
    otherwise (a read taking a frame's bytes again, which may have changed since)."""
    frame = _frame_at(data, 0, len(data))
    return frame if frame is not None and frame.end == len(data) else None


def _candidates(data: bytes, start: int, end: int, size: int) -> list[Candidate]:
    """Best-effort reading of frame headers inside damaged bytes, to say whose record was hit."""
    found: list[Candidate] = []
    # A frame was due where the damage starts, so read its header there even if the
    # damage hit the magic itself; elsewhere only a magic marks where a frame may begin.
    p = start
    while p != -1:
        body = p + _FRAME_HEAD.size
        if body + _BODY_HEAD.size <= size:
            (length,) = _LEN.unpack_from(data, p + 4)
            kind, seq, rid_len = _BODY_HEAD.unpack_from(data, body)
            rid_start = body + _BODY_HEAD.size
            if kind == KIND_RECORD and 0 < rid_len <= 256 and rid_start + rid_len <= size:
                try:
                    run_id = data[rid_start : rid_start + rid_len].decode("utf-8")
                except UnicodeDecodeError:
                    run_id = ""
                if run_id.isprintable() and run_id:
                    found.append(Candidate(run_id, seq, p, body + length))
        p = data.find(FRAME_MAGIC, max(p + 1, start + 1), end)
    return found


def rebuilt_payload(raw: bytes, seq: int, run_id: str) -> bytes | None:
    """The payload, if damaged bytes ``raw`` are exactly one record frame of ``run_id`` at
    ``seq`` whose damage is confined to its header (marker, length, kind, seq, run id).

    The header is rebuilt from those claims and checked against the frame's own crc, so a
    match names the frame's owner with crc32 certainty; nothing on disk is touched.
    """
    rid = run_id.encode("utf-8")
    head = _FRAME_HEAD.size + _BODY_HEAD.size + len(rid)
    if len(raw) < head or len(raw) - _FRAME_HEAD.size > MAX_BODY:
        return None
    (crc,) = _LEN.unpack_from(raw, 8)
    check = zlib.crc32(_LEN.pack(len(raw) - _FRAME_HEAD.size))
    check = zlib.crc32(_BODY_HEAD.pack(KIND_RECORD, seq, len(rid)) + rid, check)
    check = zlib.crc32(memoryview(raw)[head:], check)
    return raw[head:] if check == crc else None


def _scan_frames(scan: SegmentScan, data: bytes, p: int) -> None:
    scan.frames_from = p
    size = len(data)
    view = memoryview(data)
    sealed_at: int | None = None
    # Where the zeros a format-2 writer preallocated begin: the bytes after them are no
    # frame's, and none of them were written. Found at the first invalid position only (a
    # sound segment never looks), and only before a seal: a writer cuts them off first.
    used = -1 if scan.format_found == SEGMENT_FORMAT else size
    while p < size:
        frame = _frame_at(data, p, size, view)
        if frame is not None:
            scan.frames.append(frame)
            if frame.kind == KIND_SEAL and sealed_at is None:
                sealed_at = scan.sealed_end = frame.end
                _read_seal(scan, frame)
            p = frame.end
            continue
        end_of = size
        if sealed_at is None and used != size:
            if used < 0:
                used = _zeros_from(data, p)
            if p >= used:
                scan.unused = size - p
                break
            # A write cut short ends where its bytes do: judged against the zeros after
            # them as against the end of a format-1 file.
            end_of = used
        q = data.find(FRAME_MAGIC, p + 1, end_of)
        while q != -1 and _frame_at(data, q, size) is None:
            q = data.find(FRAME_MAGIC, q + 1, end_of)
        end = end_of if q == -1 else q
        scan.damage.append(
            Damage(p, end, q == -1, sealed_at is not None, _candidates(data, p, end, end_of),
                   data[p:end] if end - p <= _KEEP_DAMAGED else b"",
                   q == -1 and _cut_short(data, p, end_of),
                   data.startswith(FRAME_MAGIC[:end - p], p))
        )
        p = end
    scan.sealed = sealed_at is not None


def _zeros_from(data: bytes, p: int) -> int:
    """Where the zero bytes that ``data`` ends in begin, at ``p`` or after (read backwards
    a block at a time: a preallocated tail is up to a MiB of them)."""
    end = len(data)
    while end > p:
        start = max(p, end - 65536)
        kept = len(data[start:end].rstrip(b"\0"))
        if kept:
            return start + kept
        end = start
    return p


def _read_seal(scan: SegmentScan, frame: Frame) -> None:
    """Take the seal's ``next``, and say what is wrong with a seal a writer cannot have
    written (its crc checks out, so these are the bytes some writer put there)."""
    wrong: list[str] = []
    if frame.seq or frame.run_id:
        wrong.append(f"names Run {frame.run_id!r} and seq {frame.seq} (a seal names neither)")
    try:
        scan.next_segment = msgspec.msgpack.decode(frame.payload, type=SealNotice).next
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        wrong.append(f"does not decode ({exc})")
    if wrong:
        scan.seal_problem = f"its seal at offset {frame.offset} {' and '.join(wrong)}"


def _cut_short(data: bytes, p: int, size: int) -> bool:
    """Whether ``data[p:size]`` is a proper prefix of one frame: a marker (or part of one)
    and, once its 4 length bytes are there, a plausible length that ends past ``size``."""
    if not FRAME_MAGIC.startswith(data[p:min(p + len(FRAME_MAGIC), size)]):
        return False
    if size - p < 8:
        return True
    length: int = _LEN.unpack_from(data, p + 4)[0]
    return _BODY_HEAD.size <= length <= MAX_BODY and p + _FRAME_HEAD.size + length > size


def _recover_header(data: bytes, hcrc: int) -> tuple[int, SegmentHeader] | None:
    """The header body's length and content when its length field (or marker) is damaged:
    the one length whose bytes match the header's own crc and decode as a header."""
    crc = 0
    view = memoryview(data)
    start = _SEG_PREFIX.size
    for n in range(1, min(_MAX_HEADER, len(data) - start) + 1):
        crc = zlib.crc32(view[start + n - 1:start + n], crc)
        if crc == hcrc:
            try:
                return n, msgspec.msgpack.decode(view[start:start + n], type=SegmentHeader)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
    return None


def segment_header(data: bytes) -> SegmentHeader | None:
    """The header of a segment whose bytes are ``data``, when it checks out (its marker,
    format and crc); None otherwise. Only the header is read, not the frames after it."""
    if len(data) < _SEG_PREFIX.size:
        return None
    magic, fmt, hlen, _ = _SEG_PREFIX.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC or fmt not in SEGMENT_FORMATS:
        return None
    return scan_segment("", 0, data[:_SEG_PREFIX.size + hlen]).header


def segment_header_end(data: bytes) -> tuple[SegmentHeader, int] | None:
    """The header of a segment whose first bytes are ``data`` and where it ends, when it
    checks out (``segment_header``); None otherwise."""
    header = segment_header(data)
    if header is None:
        return None
    return header, _SEG_PREFIX.size + _SEG_PREFIX.unpack_from(data, 0)[2]


def scan_segment(name: str, number: int, data: bytes) -> SegmentScan:
    """Split a segment's bytes into valid frames and located damage; never raises.

    A file header is ``torn_header`` only when it is what a crash while creating the
    segment leaves: a prefix of a header, with nothing after it. A header that is damaged
    (its marker, length or checksum) is ``damaged_header``, and the frames after it are
    still read, so the Runs they name are reported; a file with a segment's name holding
    no valid frame and no intloom header is ``foreign``.
    """
    size = len(data)
    scan = SegmentScan(name=name, number=number, size=size, status="ok")
    if size == 0:
        scan.status = "empty"
        return scan
    if size < _SEG_PREFIX.size:
        if SEGMENT_MAGIC.startswith(data[: len(SEGMENT_MAGIC)]):
            scan.status = "torn_header"
        else:
            scan.status = "foreign"
            scan.problem = "does not start with the intloom segment marker"
        return scan
    magic, fmt, hlen, hcrc = _SEG_PREFIX.unpack_from(data, 0)
    body_end = _SEG_PREFIX.size + hlen
    if magic == SEGMENT_MAGIC and fmt not in SEGMENT_FORMATS:
        scan.format_found = fmt
        scan.status = "incompatible"
        scan.problem = format_problem(fmt, SEGMENT_FORMATS)
        # Best effort only: name the Runs it holds if the frame layout happens to match.
        _scan_frames(scan, data, min(body_end, size))
        return scan
    header: SegmentHeader | None = None
    if body_end <= size and zlib.crc32(memoryview(data)[_SEG_PREFIX.size:body_end]) == hcrc:
        try:
            header = msgspec.msgpack.decode(data[_SEG_PREFIX.size:body_end], type=SegmentHeader)
        except (msgspec.DecodeError, msgspec.ValidationError):
            header = None
    if header is not None and magic == SEGMENT_MAGIC:
        scan.format_found = fmt
        scan.header = header
        if header.format != fmt:
            # The crc covers the body, not the fixed field: the two disagree, and no writer
            # makes such a header. Which one is right cannot be told, so it does not check
            # out (the fixed field alone decides "incompatible", docs/format.md).
            scan.status = "damaged_header"
            scan.problem = (f"has a damaged file header (its body says format "
                            f"{header.format}, its fixed format field {fmt})")
        elif header.number != number:
            scan.problem = f"calls itself segment {header.number}"
        _scan_frames(scan, data, body_end)
        return scan

    damaged: list[str] = []
    if header is None:
        recovered = _recover_header(data, hcrc)
        if recovered is not None:
            hlen_true, header = recovered
            damaged.append(f"its header length field reads {hlen}, but the header's "
                           f"checksum matches its first {hlen_true} bytes")
            body_end = _SEG_PREFIX.size + hlen_true
    if header is not None:
        # Only the marker or the length field is damaged: the header itself checks out, so
        # where it ends (and the segment's format and number) is known with crc certainty.
        if magic != SEGMENT_MAGIC:
            damaged.insert(0, "its segment marker is damaged")
        scan.format_found = header.format
        scan.header = header
        if header.format not in SEGMENT_FORMATS:
            scan.status = "incompatible"
            scan.problem = format_problem(header.format, SEGMENT_FORMATS)
            _scan_frames(scan, data, body_end)
            return scan
        scan.status = "damaged_header"
        scan.problem = f"has a damaged file header ({'; '.join(damaged)})"
        _scan_frames(scan, data, body_end)
        return scan

    if magic != SEGMENT_MAGIC:
        # No intloom header at all: a stray file, unless valid frames say it is a segment.
        _scan_frames(scan, data, 0)
        if not any(f.kind == KIND_RECORD for f in scan.frames):
            scan.frames, scan.damage, scan.sealed = [], [], False
            scan.status = "foreign"
            scan.problem = "does not start with the intloom segment marker"
            return scan
        scan.status = "damaged_header"
        scan.problem = (f"does not start with the intloom segment marker and its header "
                        f"cannot be read, but {len(scan.frames)} valid frame(s) follow")
        return scan
    scan.format_found = fmt
    if body_end > size and hlen <= _MAX_HEADER:
        # What a crash while creating the segment leaves: a header cut short, nothing after.
        probe = SegmentScan(name=name, number=number, size=size, status="ok")
        _scan_frames(probe, data, _SEG_PREFIX.size)
        if not probe.frames:
            scan.status = "torn_header"
            return scan
    scan.status = "damaged_header"
    scan.problem = "has a damaged file header (checksum or content)"
    plausible = hlen < _MAX_HEADER and body_end <= size
    _scan_frames(scan, data, body_end if plausible else _SEG_PREFIX.size)
    return scan
