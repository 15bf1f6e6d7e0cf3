"""docs/format.md read on its own: a parser written from that page alone (stdlib and msgspec,
nothing of ``intloom.store``) reads a journal the real store wrote -- rotations, a seal with
and without ``next``, a failed write's void notice, a crashed host's unsealed segment,
live and done snapshots, the manifest -- and every check the page names holds. A tool that
reads ``.intloom/runtime/`` needs nothing more than the page; a drift between the two
fails here."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import msgspec

from tests.unit.test_store_support import open_store, walk, went_on_after_a_failed_write

MARKER = bytes.fromhex("C1A7494C")
MAX_BODY = 64 << 20
SEGMENT_HEADER = {"number", "instance_id", "package_version", "protocol", "created_at", "format"}
# The page's record table: every field a record of that phase may hold.
RECORD_FIELDS = {
    "header": {"run_id", "workflow", "workflow_version", "identity", "schemas", "intent",
               "package_version", "format", "protocol"},
    "stage_pending": {"stage"},
    "step_ready": {"stage", "step", "state"},
    "executing": {"stage", "step", "kind"},
    "effect_started": {"name", "key"},
    "effect_done": {"name", "key", "ok", "result", "error"},
    "step_result": {"stage", "step", "outcome", "state", "output"},
    "waiting": {"action", "agent_call", "state"},
    "answered": {"action_id", "answer"},
    "terminal": {"status", "error", "dismissed"},
}
SNAPSHOT = {"run_id", "seq", "status", "state", "problem", "segment", "written_at", "format",
            "reached", "fold", "writer"}
MANIFEST = ["format", "start", "pinned", "voids", "updatedAt", "live", "open", "checksum"]


def _segment(path: Path) -> tuple[dict[str, Any], list[tuple[int, int, str, int, Any]]]:
    """The page's segment: header, then frames (offset, kind, run id, seq, payload)."""
    data = path.read_bytes()
    magic, fmt, length, crc = struct.unpack_from(">8sHII", data, 0)
    assert (magic, fmt) == (b"ILOOMWAL", 2), path
    body = data[18:18 + length]
    assert zlib.crc32(body) == crc, path
    header = msgspec.msgpack.decode(body)
    assert set(header) == SEGMENT_HEADER and header["format"] == 2, header
    assert header["number"] == int(path.name[:10]) and path.name == f"{path.name[:10]}.seg"
    frames: list[tuple[int, int, str, int, Any]] = []
    pos, sealed = 18 + length, False
    while pos < len(data):
        assert not sealed, f"{path}: a frame after the seal at {pos}"
        if not data[pos:].strip(b"\0"):
            break  # an unsealed format-2 segment's preallocated room, never written
        assert data[pos:pos + 4] == MARKER, f"{path}: no frame marker at {pos}"
        size, crc = struct.unpack_from(">II", data, pos + 4)
        assert size <= MAX_BODY and pos + 12 + size <= len(data), f"{path}: torn at {pos}"
        body = data[pos + 12:pos + 12 + size]
        assert zlib.crc32(data[pos + 4:pos + 8] + body) == crc, f"{path}: crc at {pos}"
        kind, seq, id_len = struct.unpack_from(">BQH", body, 0)
        run_id = body[11:11 + id_len].decode("utf-8")
        payload = msgspec.msgpack.decode(body[11 + id_len:])
        assert kind in (1, 2, 3)
        if kind == 1:
            assert seq >= 1 and run_id
            assert set(payload) - {"phase", "at"} <= RECORD_FIELDS[payload["phase"]], payload
            assert isinstance(payload["at"], str)
        else:
            assert (seq, run_id) == (0, "")
        if kind == 2:
            assert set(payload) == {"segment", "offset", "cause"}
        if kind == 3:
            assert set(payload) == {"at", "frames", "next"}
            assert payload["frames"] == len(frames)  # every frame before the seal
            sealed = True
        frames.append((pos, kind, run_id, seq, payload))
        pos += 12 + size
    return header, frames


def _snapshot(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    magic, fmt, length, crc = struct.unpack_from(">8sHII", data, 0)
    body = data[18:]
    assert (magic, fmt, length, zlib.crc32(body)) == (b"ILOOMSNP", 1, len(body), crc), path
    snap: dict[str, Any] = msgspec.msgpack.decode(body)
    # Defaults are left out: an ok snapshot holds no problem, format or reached.
    assert {"run_id", "seq", "status", "segment", "written_at"} <= set(snap) <= SNAPSHOT
    assert snap["status"] == "ok" and not {"problem", "format", "reached"} & set(snap)
    assert path.name == hashlib.sha256(snap["run_id"].encode()).hexdigest() + ".snap"
    return snap


def test_a_journal_reads_back_from_docs_format_md_alone(tmp_path: Path) -> None:
    root = tmp_path / "runtime"
    store = open_store(root, instance_id="INST-1", segment_bytes=4096)  # rotates often
    records = walk("RUN-C", 60, 3, terminal=True)
    for start in range(0, 60, 10):
        for record in records[start:start + 10]:
            store.append("RUN-C", record)
        store.sync_blocking()
    store.close_blocking()
    a = walk("RUN-A", 12, 1)
    went_on_after_a_failed_write(root, a[:6], a[6:])  # a void notice, then a crash
    open_store(root, instance_id="INST-3").close_blocking()

    logged: dict[str, list[tuple[int, str]]] = {}  # run id -> (seq, phase), in log order
    voids: list[dict[str, Any]] = []
    segments = sorted((root / "wal").iterdir())
    scanned = {int(p.name[:10]): _segment(p) for p in segments}
    for _, frames in scanned.values():
        voids += [payload for _, kind, _, _, payload in frames if kind == 2]
    for number, (_, frames) in scanned.items():
        cut = min((v["offset"] for v in voids if v["segment"] == number), default=None)
        for offset, kind, run_id, seq, payload in frames:
            if kind == 1 and (cut is None or offset < cut):
                logged.setdefault(run_id, []).append((seq, payload["phase"]))
    assert voids and len(segments) > 4
    sealed = [frames[-1][4] for _, frames in scanned.values() if frames and frames[-1][1] == 3]
    assert any(s["next"] for s in sealed) and any(not s["next"] for s in sealed)
    for run_id, seqs in logged.items():
        assert [s for s, _ in seqs] == list(range(1, len(seqs) + 1)), run_id
        assert seqs[0][1] == "header"
    assert set(logged) == {"RUN-A", "RUN-C"}  # RUN-X's header was in the voided bytes

    live = sorted(p.name for p in (root / "snap" / "live").iterdir())
    for where in ("live", "done"):
        for path in (root / "snap" / where).iterdir():
            snap = _snapshot(path)
            seqs = logged[snap["run_id"]]
            assert snap["seq"] == len(seqs) and snap["segment"] in scanned
            assert (where == "done") == (seqs[-1][1] == "terminal")
    assert len(live) == 1  # RUN-A, unfinished; RUN-C ended in done/

    raw = (root / "manifest.json").read_bytes()
    manifest = json.loads(raw)
    assert list(manifest) == MANIFEST and manifest["format"] == 3
    assert raw == json.dumps(manifest, separators=(",", ":")).encode() + b"\n"
    blank = json.dumps({**manifest, "checksum": ""}, separators=(",", ":")).encode()
    assert manifest["checksum"] == f"{zlib.crc32(blank):08x}"
    names = hashlib.sha256("".join(f"{n}\n" for n in live).encode()).hexdigest()
    assert manifest["live"] == {"count": len(live), "sha256": names}
    assert (manifest["start"], manifest["open"]) == (max(scanned) + 1, 0)  # a clean close
    assert manifest["voids"] == voids
