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
from pathlib import Path
from typing import Final, Literal

import msgspec

from intloom.runtime.machine import RunState
from intloom.runtime.records import FORMAT_VERSION
from intloom.store.files import Layout, read_file
from intloom.store.framing import VoidNotice

__all__ = [
    "Manifest",
    "Snapshot",
    "SnapshotError",
    "decode_manifest",
    "decode_snapshot",
    "encode_manifest",
    "encode_snapshot",
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
    segment: int = 0  # the newest segment holding a covered record (where evidence starts)
    written_at: str = ""
    format: int = FORMAT_VERSION


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """Which segments a restore reads, written atomically after the snapshots it relies on."""

    format: int
    start: int = 0
    pinned: list[int] = msgspec.field(default_factory=list)
    voids: list[VoidNotice] = msgspec.field(default_factory=list)
    updated_at: str = ""
    # crc32 (8 hex digits) of this manifest encoded with checksum "": a bit flip that still
    # parses would otherwise move the restore's start and hide Runs silently.
    checksum: str = ""


class SnapshotError(Exception):
    """A snapshot or manifest file that cannot be used; ``fact`` says why."""

    def __init__(self, path: Path, fact: str, incompatible: bool = False) -> None:
        self.path = path
        self.fact = fact
        self.incompatible = incompatible
        super().__init__(f"{path} {fact}")


def snapshot_name(run_id: str) -> str:
    """File name of a Run's snapshot: run ids never become paths."""
    return hashlib.sha256(run_id.encode("utf-8")).hexdigest() + ".snap"


def encode_snapshot(snapshot: Snapshot) -> bytes:
    body = msgspec.msgpack.encode(snapshot)
    return _PREFIX.pack(SNAPSHOT_MAGIC, snapshot.format, len(body), zlib.crc32(body)) + body


def decode_snapshot(path: Path, data: bytes) -> Snapshot:
    if len(data) < _PREFIX.size:
        raise SnapshotError(path, "is truncated")
    magic, fmt, length, crc = _PREFIX.unpack_from(data, 0)
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotError(path, "is not an intloom snapshot")
    if fmt != FORMAT_VERSION:
        raise SnapshotError(
            path, f"is format {fmt}; this intloom reads {FORMAT_VERSION}", incompatible=True
        )
    body = data[_PREFIX.size :]
    if len(body) != length or zlib.crc32(body) != crc:
        raise SnapshotError(path, "fails its checksum")
    try:
        snap = msgspec.msgpack.decode(body, type=Snapshot)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotError(path, f"does not decode ({exc})") from None
    if path.name != snapshot_name(snap.run_id):
        raise SnapshotError(path, f"holds Run {snap.run_id}, whose snapshot has another name")
    return snap


def read_snapshot(path: Path) -> Snapshot | None:
    """The snapshot at ``path``; None if absent; SnapshotError if unusable."""
    data = read_file(path)
    if data is None:
        return None
    return decode_snapshot(path, data)


_manifest_decoder = msgspec.json.Decoder(Manifest)


def _manifest_crc(manifest: Manifest) -> str:
    body = msgspec.json.encode(msgspec.structs.replace(manifest, checksum=""))
    return f"{zlib.crc32(body):08x}"


def encode_manifest(manifest: Manifest) -> bytes:
    sealed = msgspec.structs.replace(manifest, checksum=_manifest_crc(manifest))
    return msgspec.json.encode(sealed) + b"\n"


def decode_manifest(path: Path, data: bytes) -> Manifest:
    try:
        fmt = msgspec.json.decode(data, type=dict[str, object]).get("format")
    except msgspec.DecodeError:
        raise SnapshotError(path, "is not valid JSON") from None
    if fmt != FORMAT_VERSION:
        raise SnapshotError(
            path, f"is format {fmt}; this intloom reads {FORMAT_VERSION}", incompatible=True
        )
    try:
        manifest = _manifest_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotError(path, f"is invalid ({exc})") from None
    if manifest.checksum != _manifest_crc(manifest):
        raise SnapshotError(path, "fails its checksum")
    return manifest


def read_manifest(layout: Layout) -> Manifest | None:
    """The manifest; None if there is none yet; SnapshotError if unusable."""
    data = read_file(layout.manifest)
    if data is None:
        return None
    return decode_manifest(layout.manifest, data)
