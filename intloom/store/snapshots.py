"""Per-Run snapshots and the manifest: what lets a restore skip old log segments.

A snapshot is one Run's folded state (or the verdict that it is corrupt/incompatible) and
the seq it covers. Unfinished Runs live in ``snap/live/``, which startup reads; terminal
ones in ``snap/done/``, which startup never lists. The manifest names the first segment a
restore still needs (``start``), older segments it must still read (``pinned``: they hold
data this intloom cannot judge), and failed-batch regions (``voids``).
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Final, Literal

import msgspec

from intloom.runtime.machine import RunState
from intloom.runtime.records import FORMAT1_FORMAT, FORMAT_VERSION
from intloom.store.depth import READ_DEPTH, TooDeep, decode_bounded
from intloom.store.files import Layout, read_own_file, unusable_file
from intloom.store.framing import SegmentNumber, VoidNotice

__all__ = [
    "MANIFEST_FORMAT",
    "LiveSet",
    "Manifest",
    "Snapshot",
    "SnapshotError",
    "decode_manifest",
    "decode_snapshot",
    "encode_manifest",
    "encode_snapshot",
    "is_snapshot_name",
    "live_set",
    "manifest_ahead",
    "read_manifest",
    "read_snapshot",
    "snapshot_name",
]

SNAPSHOT_MAGIC: Final = b"ILOOMSNP"
_PREFIX = struct.Struct(">8sHII")  # magic, format, body length, crc32(body)

Verdict = Literal["ok", "corrupt", "incompatible"]


class Snapshot(msgspec.Struct, frozen=True, omit_defaults=True):
    """One Run as of record ``seq`` (the last record it covers)."""

    run_id: str
    seq: int
    status: Verdict
    state: RunState | None = None
    problem: str | None = None
    # The segment the writer had open when it wrote this (at a close, the one it sealed), not
    # the one holding the Run's last record: every segment below it was complete, so damage
    # found there later cannot hide a record this snapshot does not cover.
    segment: int = 0
    written_at: str = ""
    # Format 1's, not this build's: a later format's reader would take a format-1 body that
    # leaves it out for its own format, and the snapshot for a damaged one.
    format: int = FORMAT1_FORMAT
    # A corrupt Run's furthest known seq (``RunJournal.reached``); 0, and not written, for an
    # ok one. Added within format 1: a reader without it ignores the key.
    reached: int = 0
    # The fold that made ``state`` (``machine.FOLD_VERSION``); 0 for a snapshot written
    # before it was said (2026-12-05). Added within format 1: a reader without it ignores
    # the key. A reader folds a Run whose snapshot has an older fold again from its records,
    # and holds one whose snapshot a newer fold wrote.
    fold: int = 0
    # The intloom package that wrote it ("" before 2026-12-05). Only a Run with new records,
    # or one read back from the log (its snapshot lost or damaged, or of an older fold), gets
    # a new snapshot: a newer intloom's snapshot says that intloom continued the Run, or at
    # least folded it, and an older one then holds it (machine.unreadable).
    writer: str = ""


# The manifest's own format: 2 adds ``live``, 3 adds ``open`` (formats 1 and 2 are still
# read). Segments and snapshots stay FORMAT_VERSION. A reader of an earlier format reports
# a later manifest as incompatible and reads the whole log instead (docs/format.md,
# Manifest).
MANIFEST_FORMAT: Final = 3
_MANIFEST_FORMATS: Final = (FORMAT_VERSION, 2, MANIFEST_FORMAT)


class LiveSet(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``snap/live/`` files a manifest relies on: how many, and a digest of their names.

    A restore that lists other names reads the whole log: a missing snapshot would otherwise
    hide its Run, whose records sit in segments the manifest no longer names."""

    count: int
    sha256: str


def is_snapshot_name(name: str) -> bool:
    """A name intloom gives a snapshot file (``<sha256 hex>.snap``)."""
    return name.endswith(".snap") and len(name) == 69 and not name.startswith(".")


def manifest_ahead(manifest: Manifest, last_segment: int) -> str | None:
    """Why ``manifest`` cannot have been written for a log whose last segment is
    ``last_segment`` (0: none), if it cannot: a manifest is written after the segments it
    names, and its ``start`` is at most the segment after the last one. Trusted, a larger
    ``start`` would hide every Run whose records are in the segments it skips."""
    if manifest.start <= last_segment + 1:
        return None
    last = f"wal/{last_segment:010d}.seg" if last_segment else "none"
    return (f"names segment {manifest.start} as the first a restore reads, but the log's last "
            f"segment is {last} (a manifest is never ahead of its log)")


def live_set(names: Iterable[str]) -> LiveSet:
    """The LiveSet of these ``snap/live/`` file names."""
    ordered = sorted(names)
    digest = hashlib.sha256("".join(f"{name}\n" for name in ordered).encode("utf-8"))
    return LiveSet(count=len(ordered), sha256=digest.hexdigest())


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """Which segments a restore reads, written atomically after the snapshots it relies on."""

    format: int
    start: SegmentNumber = 0
    pinned: list[SegmentNumber] = msgspec.field(default_factory=list)
    voids: list[VoidNotice] = msgspec.field(default_factory=list)
    updated_at: str = ""
    # Format 2: the live snapshots this manifest relies on (None in a format-1 manifest).
    live: LiveSet | None = None
    # Format 3: the segment the writing host had created and was appending to when it wrote
    # this manifest (0: written at a clean close). Gone at the next start, it was lost with
    # whatever records it held: without this, a start could not tell that from a clean
    # close whose next segment was never created.
    open: SegmentNumber = 0
    # crc32 (8 hex digits) of this manifest encoded with checksum "": a bit flip that still
    # parses would otherwise move the restore's start and hide Runs silently.
    checksum: str = ""


class SnapshotError(Exception):
    """A snapshot or manifest file that cannot be used; ``fact`` says why, and ``fix``, when
    set, what to do instead of moving the file out (a mode or an owner to put right)."""

    def __init__(self, path: Path, fact: str, incompatible: bool = False,
                 fix: str | None = None) -> None:
        self.path = path
        self.fact = fact
        self.incompatible = incompatible
        self.fix = fix
        super().__init__(f"{path} {fact}")


def snapshot_name(run_id: str) -> str:
    """File name of a Run's snapshot: run ids never become paths."""
    return hashlib.sha256(run_id.encode("utf-8")).hexdigest() + ".snap"


def encode_snapshot(snapshot: Snapshot) -> bytes:
    body = msgspec.msgpack.encode(snapshot)
    return _PREFIX.pack(SNAPSHOT_MAGIC, snapshot.format, len(body), zlib.crc32(body)) + body


_snapshot_decoder = msgspec.msgpack.Decoder(Snapshot)


def decode_snapshot(path: Path, data: bytes) -> Snapshot:
    if len(data) < _PREFIX.size:
        raise SnapshotError(path, "is truncated")
    magic, fmt, length, crc = _PREFIX.unpack_from(data, 0)
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotError(path, "is not an intloom snapshot")
    if fmt != FORMAT_VERSION:
        # As a segment's and a manifest's findings do: a later format is a newer intloom's
        # (a downgrade), not damage.
        newer = (" (a newer intloom wrote it: an intloom that reads snapshot format "
                 f"{fmt} reads it)" if fmt > FORMAT_VERSION else
                 f" (no intloom writes format {fmt}, so its fixed format field may be damaged)")
        raise SnapshotError(
            path, f"is format {fmt}; this intloom reads {FORMAT_VERSION}{newer}",
            incompatible=True
        )
    body = data[_PREFIX.size :]
    if len(body) != length or zlib.crc32(body) != crc:
        raise SnapshotError(path, "fails its checksum")
    try:
        snap = decode_bounded(_snapshot_decoder.decode, body)
    except TooDeep:
        # A Run's pending task or question held that deep (records: READ_DEPTH): raised as
        # RecursionError, it escaped the restore and no Run of the project could start.
        raise SnapshotError(path, f"does not decode (it holds a value nested more deeply than "
                                  f"intloom can decode: more than {READ_DEPTH} levels)") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotError(path, f"does not decode ({exc})") from None
    if snap.format != fmt:
        # The crc covers the body, not the fixed field: no writer makes the two disagree.
        raise SnapshotError(path, f"is damaged (its body says format {snap.format}, its fixed "
                                  f"format field {fmt})")
    if path.name != snapshot_name(snap.run_id):
        raise SnapshotError(path, f"holds Run {snap.run_id}, whose snapshot has another name")
    # Every writer sets ``seq`` from the state it holds: a snapshot saying otherwise would
    # have a restore skip the records after its state as already summarised.
    if snap.state is not None and snap.state.run_id != snap.run_id:
        raise SnapshotError(path, f"is damaged (it names Run {snap.run_id} but holds the state "
                                  f"of Run {snap.state.run_id})")
    covers = snap.state.seq if snap.state is not None else 0
    if snap.seq != covers:
        raise SnapshotError(path, f"is damaged (it says it covers record {snap.seq}, but the "
                                  f"state it holds is at record {covers})")
    return snap


def read_snapshot(path: Path) -> Snapshot | None:
    """The snapshot at ``path``; None if absent; SnapshotError if unusable.

    A snapshot holds one Run: one that is a link, not a regular file, another user's or open
    to others is that Run's problem, as a damaged one is, never the whole store's (DESIGN
    section 5). It is judged from an ``lstat`` and never opened, so nothing behind a link or
    in a FIFO or device is touched."""
    unusable = unusable_file(path)
    if unusable is not None:
        raise SnapshotError(path, unusable[0], fix=unusable[1])
    # A file that refuses to be read (chmod 000) is this Run's too: it refused the whole
    # store (STORAGE_ERROR), so that no Run restored and verify and inspect failed.
    data = read_own_file(path)
    if isinstance(data, str):
        raise SnapshotError(path, data)
    if data is None:
        return None
    return decode_snapshot(path, data)


_manifest_decoder = msgspec.json.Decoder(Manifest)


def _manifest_body(manifest: Manifest) -> bytes:
    """The manifest's JSON; a format-1 manifest has no ``live`` key and an earlier one than
    format 3 no ``open`` (its bytes, and so its checksum, are what its writer made)."""
    doc = msgspec.to_builtins(manifest)
    if manifest.live is None:
        del doc["live"]
    if manifest.format < 3:
        del doc["open"]
    return msgspec.json.encode(doc)


def _manifest_crc(manifest: Manifest) -> str:
    body = _manifest_body(msgspec.structs.replace(manifest, checksum=""))
    return f"{zlib.crc32(body):08x}"


def encode_manifest(manifest: Manifest) -> bytes:
    sealed = msgspec.structs.replace(manifest, checksum=_manifest_crc(manifest))
    return _manifest_body(sealed) + b"\n"


def decode_manifest(path: Path, data: bytes) -> Manifest:
    try:
        fmt = msgspec.json.decode(data, type=dict[str, object]).get("format")
    except msgspec.DecodeError:
        raise SnapshotError(path, "is not valid JSON") from None
    if fmt not in _MANIFEST_FORMATS:
        known = ", ".join(map(str, _MANIFEST_FORMATS[:-1])) + f" and {MANIFEST_FORMAT}"
        # As a segment's finding does: a later format is a newer intloom's (a downgrade),
        # not damage; the user learns which intloom reads it.
        newer = (" (a newer intloom wrote it: an intloom that reads manifest format "
                 f"{fmt} reads it)" if type(fmt) is int and fmt > MANIFEST_FORMAT else "")
        raise SnapshotError(path, f"is format {fmt}; this intloom reads {known}{newer}",
                            incompatible=True)
    try:
        manifest = _manifest_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotError(path, f"is invalid ({exc})") from None
    if (manifest.live is None) != (fmt == FORMAT_VERSION):
        raise SnapshotError(path, f"is invalid (format {fmt} "
                            f"{'has no' if manifest.live is None else 'has a'} `live` field)")
    if manifest.open and manifest.format < 3:
        raise SnapshotError(path, f"is invalid (format {fmt} has an `open` field)")
    if not manifest.checksum:
        # Builds of 2026-11-30 before format 1 was fixed wrote none: "fails its checksum"
        # named a bit flip that never happened. Still untrusted, so read past as damage is.
        raise SnapshotError(path, "has no checksum, so it cannot be told from a damaged one "
                            "(an intloom build from before format 1 was released wrote it, or "
                            "it was edited)")
    if manifest.checksum != _manifest_crc(manifest):
        raise SnapshotError(path, "fails its checksum")
    return manifest


def read_manifest(layout: Layout) -> Manifest | None:
    """The manifest; None if there is none yet; SnapshotError if unusable.

    One that is a link, not a regular file, another user's or open to others is never
    opened: like a damaged one it only makes every restore read the whole log, and nothing
    writes over it, so no Run need wait for it to be put right."""
    unusable = unusable_file(layout.manifest)
    if unusable is not None:
        raise SnapshotError(layout.manifest, unusable[0], fix=unusable[1])
    data = read_own_file(layout.manifest)
    if isinstance(data, str):
        raise SnapshotError(layout.manifest, data)
    if data is None:
        return None
    return decode_manifest(layout.manifest, data)
