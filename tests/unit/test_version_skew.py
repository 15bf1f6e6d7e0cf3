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
    from tests.unit.diagnostics_support import create_time, live_process

    root = tmp_path.resolve()
    # The host a file names runs (its pid and create time a live process's): the way out is
    # to stop it. tests/e2e/test_version_skew_host.py has one that has exited.
    with live_process() as host:
        _refused_by_version(root, host.pid, create_time(host.pid))


def _refused_by_version(root: Path, pid: int, created: float) -> None:
    newer = METADATA_VERSION + 1
    doc = {"version": newer, "projectRoot": str(root), "pid": pid, "createTime": created,
           "instanceId": "i", "port": 4000, "startedAt": "2026-12-09T00:00:00.000Z",
           "packageVersion": "9.9.9", "protocolVersion": 2, "logFile": None, "bootId": "b",
           "token": "t" * 43, "added": {"in": "a later version"}}
    for name, read in (("service.json", lambda p: read_service(p, root)),
                       ("service.lock", read_lock),
                       ("connection.json", lambda p: read_connection(p, root))):
        path = root / name
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
            assert (f"with the intloom that started it (intloom stop), or kill -TERM {pid} (a "
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
        lock_held_here,
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
        with lock_held_here(ProjectPaths(root).service_lock):
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


def test_a_later_intloom_with_another_workflow_protocol_reads_todays_runs_as_todays(
    tmp_path: Path,
) -> None:
    """A header record leaves out its protocol at the default, and that default was this
    build's PROTOCOL_VERSION: an intloom that bumps it read every Run written before as of
    its own protocol. inspect called each such Run's journal corrupt ("its snapshot ...
    disagrees with the log"), and a Run read from the log (after a crash) was held as
    "Workflow 'x' changed ... restore the code the Run started with", the code unchanged.
    The default is format 1's, whatever a later build speaks."""
    import json
    import os
    import subprocess
    import sys

    from tests.helpers import later_intloom
    from tests.unit.test_golden_journals import _digest, _private_copy

    runtime = _private_copy(tmp_path)
    before = _digest(runtime)
    later = later_intloom(tmp_path, {"runtime/records.py": (
        'PROTOCOL_VERSION: Final = "2026-11-30"', 'PROTOCOL_VERSION: Final = "2027-01-01"')})
    script = (
        "import json, sys, intloom\n"
        "from intloom.runtime.machine import unreadable\n"
        "from intloom.store import verify_report\n"
        "report = verify_report(__import__('pathlib').Path(sys.argv[1]))\n"
        "print(json.dumps({'file': intloom.__file__, 'runs': {j.run_id: [j.status, j.problem,"
        " j.state and j.state.protocol, j.state and unreadable(j.state, '9.0.0')]"
        " for j in report.runs}}))\n")
    done = subprocess.run([sys.executable, "-c", script, str(runtime)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **later},
                          check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["file"].startswith(later["PYTHONPATH"]), found["file"]
    assert len(found["runs"]) == 7, found
    for run_id, (status, problem, protocol, why) in found["runs"].items():
        assert (status, problem, protocol) == ("ok", None, "2026-11-30"), (run_id, problem)
        assert why == ("incompatible protocol: written by intloom 0.1.0 with Workflow protocol "
                       "2026-11-30, older than this intloom's 2027-01-01 (9.0.0), which no "
                       "longer runs it; continue or end the Run with intloom 0.1.0"), (run_id, why)
    assert _digest(runtime) == before


@pytest.mark.parametrize(("writer", "reader", "refused"), [
    ("0.2.0rc1", "0.2.0", False),  # the release after its candidate: an upgrade
    ("0.2.0b1", "0.2.0", False),
    ("0.2.0.dev3", "0.2.0", False),
    ("1.0.0rc1", "1.0.0", False),
    ("0.2.0", "0.2.0rc1", True),  # the candidate after the release: a downgrade
    ("0.2.0rc2", "0.2.0rc1", True),
    ("0.2.0.post1", "0.2.0", True),
    ("0.10.0", "0.9.0", True),
    ("1.0", "1.0.0", False),
    ("0.1.0+local", "0.1.0", False),
])
def test_a_journal_of_a_pre_release_is_read_by_its_release(
    tmp_path: Path, writer: str, reader: str, refused: bool,
) -> None:
    """intloom 1.0.0rc1 then 1.0.0 (pip install -U): every Run the candidate wrote was held
    as "written by intloom 1.0.0rc1, newer than this 1.0.0; upgrade intloom" (the version's
    digits read as 1.0.1), and cancel refused it, on the release it asked for. A pre-release
    or dev build comes before its release, as pip orders them."""
    from intloom.runtime.machine import unreadable
    from intloom.store import read_runs

    run_id = "RUN-20261203T000000000Z-skew"
    _one_run(tmp_path, run_id, writer)
    [journal] = read_runs(tmp_path)
    assert journal.state is not None and journal.state.package_version == writer
    why = unreadable(journal.state, reader)
    if refused:
        assert why == (f"incompatible package: written by intloom {writer}, newer than this "
                       f"{reader}; upgrade intloom"), why
    else:
        assert why is None, why


def test_a_journal_of_a_newer_workflow_protocol_says_to_upgrade(tmp_path: Path) -> None:
    """A Run written by an intloom of a later Workflow protocol, read after a downgrade, was
    held as "incompatible protocol: journal has 2027-01-01, this intloom speaks 2026-11-30":
    neither which side is newer nor what to do (the Run read by a later intloom said the
    same, where the way out is the other one)."""
    from intloom.runtime.machine import unreadable
    from intloom.runtime.records import PROTOCOL_VERSION, Header, StagePending
    from intloom.store import read_runs
    from tests.unit.test_store_support import open_store

    run_id = "RUN-20261203T000000000Z-proto"
    store = open_store(tmp_path)
    try:
        store.append(run_id, Header(at="2026-12-03T00:00:00.000Z", run_id=run_id,
                                    workflow="example", workflow_version="1.0.0",
                                    identity="0" * 64, schemas={"draft": "f" * 64},
                                    intent="i", package_version="9.0.0",
                                    protocol="2027-01-01"))
        store.append(run_id, StagePending(at="2026-12-03T00:00:00.001Z", stage="draft"))
        store.sync_blocking(run_id)
    finally:
        store.close_blocking()
    [journal] = read_runs(tmp_path)
    assert journal.state is not None
    assert unreadable(journal.state, __version__) == (
        "incompatible protocol: written by intloom 9.0.0 with Workflow protocol 2027-01-01, "
        f"newer than this intloom's {PROTOCOL_VERSION} ({__version__}); upgrade intloom")


def test_a_snapshot_of_a_later_format_is_named_as_a_newer_intlooms(tmp_path: Path) -> None:
    """A snapshot a newer intloom wrote (a downgrade) was "is format 2; this intloom reads
    1", where a segment or manifest of a later format says a newer intloom wrote it. The
    Run is read from the log instead, and the file kept as it is."""
    from intloom.runtime.records import FORMAT_VERSION
    from intloom.store import read_runs_report
    from intloom.store.snapshots import decode_snapshot, encode_snapshot

    run_id = "RUN-20261203T000000000Z-snapfmt"
    _one_run(tmp_path, run_id, __version__)
    [path] = (tmp_path / "snap" / "live").iterdir()
    later = FORMAT_VERSION + 1
    snap = decode_snapshot(path, path.read_bytes())
    path.write_bytes(encode_snapshot(msgspec.structs.replace(snap, format=later)))
    before = path.read_bytes()

    report = read_runs_report(tmp_path)

    [finding] = report.files
    assert (finding.kind, finding.path) == ("incompatible", f"snap/live/{path.name}"), finding
    assert finding.problem.startswith(
        f"is format {later}; this intloom reads {FORMAT_VERSION} (a newer intloom wrote it: "
        f"an intloom that reads snapshot format {later} reads it); every segment was read "
        "instead"), finding.problem
    [journal] = report.runs
    assert (journal.status, journal.state and journal.state.phase) == ("ok", "stage_pending")
    assert path.read_bytes() == before


def test_doctor_calls_a_later_formats_file_another_intlooms_not_damaged(tmp_path: Path) -> None:
    """doctor's journals check listed a newer intloom's snapshot under "Damaged files are
    kept byte-identical", which sent the user looking for damage that is not there."""
    from intloom.diagnostics.previews import preview_runs
    from intloom.project import ProjectPaths
    from intloom.runtime.records import FORMAT_VERSION
    from intloom.store.snapshots import decode_snapshot, encode_snapshot

    paths = ProjectPaths(tmp_path)
    paths.state.mkdir(mode=0o700)
    run_id = "RUN-20261203T000000000Z-docfmt"
    _one_run(paths.runtime, run_id, __version__, stage=False)
    [path] = (paths.runtime / "snap" / "live").iterdir()
    snap = decode_snapshot(path, path.read_bytes())
    path.write_bytes(encode_snapshot(msgspec.structs.replace(snap, format=FORMAT_VERSION + 1)))

    check, _ = preview_runs(paths, None, host_running=False)

    assert check.next is not None
    assert ("Files of another format (another intloom's) are kept byte-identical"
            in check.next), check.next
    assert "Damaged files" not in check.next, check.next


def _one_run(root: Path, run_id: str, writer: str, *, stage: bool = True) -> None:
    """A store at ``root`` holding one Run that ``writer`` (a package version) created: its
    header, and its first Stage unless ``stage`` is False."""
    from intloom.runtime.records import Header, StagePending
    from tests.unit.test_store_support import open_store

    store = open_store(root)
    try:
        store.append(run_id, Header(at="2026-12-03T00:00:00.000Z", run_id=run_id,
                                    workflow="example", workflow_version="1.0.0",
                                    identity="0" * 64, schemas={"draft": "f" * 64},
                                    intent="i", package_version=writer))
        if stage:
            store.append(run_id, StagePending(at="2026-12-03T00:00:00.001Z", stage="draft"))
        store.sync_blocking(run_id)
    finally:
        store.close_blocking()


@pytest.mark.parametrize("body", [
    b"[" * 1100 + b"]" * 1100,
    b'{"version": 1, "x": ' + b"[" * 1100 + b"]" * 1100 + b"}",
    b'{"version": 99, "x": ' + b"[" * 1100 + b"]" * 1100 + b"}",
], ids=["array", "field", "other-version"])
def test_metadata_nested_past_the_decoders_stack_is_invalid_not_a_crash(
    tmp_path: Path, body: bytes,
) -> None:
    """msgspec raises RecursionError, not DecodeError, for such a file: every command that
    read it failed with CLI_INTERNAL_ERROR."""
    root = tmp_path.resolve()
    for name, read in (("service.json", lambda p: read_service(p, root)),
                       ("service.lock", read_lock),
                       ("connection.json", lambda p: read_connection(p, root))):
        path = root / name
        path.write_bytes(body)
        path.chmod(0o600)
        with pytest.raises(IntloomError) as refused:
            read(path)
        assert refused.value.code == "CLI_SERVICE_METADATA_INVALID", refused.value
        assert path.read_bytes() == body
