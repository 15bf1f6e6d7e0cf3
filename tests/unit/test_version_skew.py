"""Version skew: what another intloom wrote (its host's metadata files, its hello's refusal,
its manifest), read by this one. Files and frames are written here in that version's shape,
so no other build is needed."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from intloom import __version__
from intloom.errors import IntloomError
from intloom.host.metadata import METADATA_VERSION, read_connection, read_lock, read_service


def test_metadata_of_another_version_is_refused_by_its_version_with_the_way_out(
    tmp_path: Path,
) -> None:
    """service.json, service.lock and connection.json another metadata version wrote: one
    holding a key this version does not know was "not valid metadata (Object contains unknown
    field ...)", damage to fix by hand, while that intloom's host may be running; the
    version, both versions and how to restart the host with this intloom are named."""
    root = tmp_path.resolve()
    newer = METADATA_VERSION + 1
    doc = {"version": newer, "projectRoot": str(root), "pid": 4242, "createTime": 1.0,
           "instanceId": "i", "port": 4000, "startedAt": "2026-12-09T00:00:00.000Z",
           "packageVersion": "9.9.9", "protocolVersion": 2, "logFile": None, "bootId": "b",
           "token": "t" * 43, "added": {"in": "a later version"}}
    for name, read in (("service.json", lambda p: read_service(p, root)),
                       ("service.lock", read_lock),
                       ("connection.json", lambda p: read_connection(p, root))):
        path = tmp_path / name
        path.write_bytes(msgspec.json.encode(doc))
        path.chmod(0o600)
        with pytest.raises(IntloomError) as refused:
            read(path)
        message = refused.value.message
        assert refused.value.code == "CLI_SERVICE_METADATA_INVALID", message
        assert "unknown field" not in message, message
        assert (f"has metadata version {newer}; this intloom ({__version__}) reads version "
                f"{METADATA_VERSION}: a newer intloom (9.9.9) wrote it") in message, message
        if name == "connection.json":
            assert "move the file aside" in message, message
        else:
            assert ("with the intloom that started it (intloom stop), or kill -TERM 4242 (a "
                    "graceful stop), then run intloom start with this one") in message, message
        assert refused.value.here == message
        assert path.read_bytes() == msgspec.json.encode(doc)


def test_a_host_of_another_protocol_is_named_with_both_versions_and_the_way_to_restart_it(
    tmp_path: Path,
) -> None:
    """intloom upgraded while its host ran, the new one speaking another socket protocol:
    every command showed the host's "Use the intloom client that matches the running host,
    or restart the host with this version.", and intloom stop, the way to restart it, only
    said "The service rejected shutdown (PROTOCOL_MISMATCH: ...)" since its hello is
    refused too. The listener answers as a host of that protocol does, its frame written by
    hand; service.json says what the host wrote of itself."""
    import contextlib
    import os
    import socket
    import struct
    import threading
    import uuid

    from intloom.client import Client
    from intloom.client.lifecycle import stop_service_report
    from intloom.host.metadata import ServiceInfo, write_service
    from intloom.project import ProjectPaths
    from intloom.protocol.messages import PROTOCOL
    from tests.unit.diagnostics_support import (
        create_time,
        make_root,
        write_connection_json,
        write_lock,
    )

    root = make_root(tmp_path)
    theirs = PROTOCOL + 1
    refusal = msgspec.msgpack.encode({"op": "error", "error": {
        "code": "PROTOCOL_MISMATCH", "retryable": False,
        "message": f"The client speaks protocol {PROTOCOL}; this host speaks {theirs}."}})
    pid = os.getpid()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        instance = str(uuid.uuid4())
        write_lock(root, pid, create_time(pid), instance_id=instance)
        write_service(ProjectPaths(root).service_json, ServiceInfo(
            version=METADATA_VERSION, project_root=str(root), pid=pid,
            create_time=create_time(pid), instance_id=instance, port=port,
            started_at="2026-12-09T00:00:00.000Z", package_version="0.2.0",
            protocol_version=theirs))
        write_connection_json(root, port)

        def refuse_hellos() -> None:
            with contextlib.suppress(OSError):
                for _ in range(2):
                    peer, _ = listener.accept()
                    with peer:
                        peer.recv(4096)
                        peer.sendall(struct.pack(">I", len(refusal)) + refusal)

        threading.Thread(target=refuse_hellos, daemon=True).start()
        with pytest.raises(IntloomError) as connecting:
            Client.connect(root, timeout=5)
        with pytest.raises(IntloomError) as stopping:
            stop_service_report(root, timeout=5)
    both = (f"(pid {pid}, intloom 0.2.0, socket protocol {theirs}) refused this intloom "
            f"({__version__}, socket protocol {PROTOCOL})")
    way = (f"stop it with the intloom that started it (intloom stop), or with kill -TERM {pid} "
           "(a graceful stop: its Runs are suspended at their last checkpoint), then run "
           "intloom start with this one")
    assert connecting.value.code == "PROTOCOL_MISMATCH", connecting.value.message
    for message in (connecting.value.message, stopping.value.message):
        assert both in message and way in message, message


def test_a_manifest_of_a_later_format_is_named_as_a_newer_intlooms(tmp_path: Path) -> None:
    """A manifest a newer intloom wrote (a downgrade): it was "is format 4; this intloom
    reads 1 and 2 and 3", which does not tell a newer file from a damaged one, where a
    newer segment's finding says a newer intloom wrote it."""
    from intloom.store.snapshots import MANIFEST_FORMAT, SnapshotError, decode_manifest

    later = MANIFEST_FORMAT + 1
    path = tmp_path / "manifest.json"
    data = msgspec.json.encode({"format": later, "start": 1, "pinned": [], "voids": [],
                                "added": True, "checksum": "00000000"})
    with pytest.raises(SnapshotError) as refused:
        decode_manifest(path, data)
    assert refused.value.incompatible
    assert (f"is format {later}; this intloom reads 1, 2 and {MANIFEST_FORMAT} (a newer "
            f"intloom wrote it: an intloom that reads manifest format {later} reads it)"
            ) in str(refused.value), str(refused.value)


def test_a_manifest_without_a_checksum_is_not_said_to_fail_it(tmp_path: Path) -> None:
    """The manifest the builds of 2026-11-30 before format 1 was fixed wrote, byte for byte
    in its shape (no checksum key): read past as before, but it "fails its checksum" named
    damage that never happened."""
    from intloom.store.snapshots import SnapshotError, decode_manifest

    data = (b'{"format":1,"start":2,"pinned":[],"voids":[],'
            b'"updatedAt":"2026-11-30T03:00:00.000000+00:00"}')
    with pytest.raises(SnapshotError) as refused:
        decode_manifest(tmp_path / "manifest.json", data)
    assert not refused.value.incompatible
    assert refused.value.fact.startswith("has no checksum, so it cannot be told from a "
                                         "damaged one"), refused.value.fact
