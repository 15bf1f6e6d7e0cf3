"""Two intloom versions on one project, each a real process: a host of a later intloom (a
copy of this package with its version and protocol edited, tests/helpers.later_intloom)
and this intloom's CLI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from intloom import __version__
from intloom.protocol.messages import PROTOCOL
from tests.helpers import Project, later_intloom, make_project, ok, reaped, snapshot_files

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(make_project(tmp_path))


def _later(tmp_path: Path) -> dict[str, str]:
    return later_intloom(tmp_path, {
        "__init__.py": (f'__version__ = "{__version__}"', '__version__ = "9.0.0"'),
        "protocol/messages.py": (f"PROTOCOL: Final = {PROTOCOL}",
                                 f"PROTOCOL: Final = {PROTOCOL + 1}")})


def test_stop_refused_by_a_host_of_another_protocol_says_so_in_the_hosts_words(
    project: Project, tmp_path: Path,
) -> None:
    """intloom upgraded while its host ran, then intloom stop: "CLI_SERVICE_UNAVAILABLE: The
    service rejected shutdown (PROTOCOL_MISMATCH: ...)". The host rejected no shutdown: it
    refused the hello, and nothing was sent. Every other command gave PROTOCOL_MISMATCH with
    the way to restart the host; stop now gives the same, and the host runs on untouched."""
    later = _later(tmp_path)
    service = ok(project.cli("start", "--json", env=later))["service"]
    assert service["packageVersion"] == "9.0.0", service
    before = snapshot_files(project.state)

    refused = project.cli("stop", "--json")
    runs = project.cli("runs", "--json")

    assert refused.code == 1, (refused.stdout, refused.stderr)
    error = refused.json["error"]
    assert error == runs.json["error"], (error, runs.stdout)
    assert error["code"] == "PROTOCOL_MISMATCH", error
    assert "rejected shutdown" not in error["message"], error["message"]
    assert (f"(pid {service['pid']}, intloom 9.0.0, socket protocol {PROTOCOL + 1}) refused "
            f"this intloom ({__version__}, socket protocol {PROTOCOL})") in error["message"]
    assert f"kill -TERM {service['pid']}" in error["message"], error["message"]
    assert snapshot_files(project.state) == before
    assert ok(project.cli("stop", "--json", env=later))["stopped"] is True


def test_doctor_says_to_restart_a_host_of_another_protocol_not_to_undo_an_edit(
    project: Project, tmp_path: Path,
) -> None:
    """doctor beside a host of another socket protocol: its owner checks said "Put back what
    was changed by hand, or stop pid N directly": nothing was changed by hand (intloom was
    upgraded), and the way that suspends the Runs, intloom stop of the intloom that started
    the host, was left out. Now each says to restart the host with this intloom."""
    later = _later(tmp_path)
    pid = ok(project.cli("start", "--json", env=later))["service"]["pid"]
    before = snapshot_files(project.state)

    doctor = project.cli("doctor", "--json")

    assert doctor.code == 4, (doctor.stdout, doctor.stderr)
    owners = [c for c in doctor.json["checks"] if c["id"].startswith("owner.")]
    assert [c["id"] for c in owners] == ["owner.service_lock", "owner.service_json"], owners
    for check in owners:
        name = check["id"].removeprefix("owner.").replace("_", ".")
        assert check["next"] == (
            f"Leave {name} as it is while pid {pid} runs. Restart the host with this intloom: "
            f"stop it with the intloom that started it (intloom stop), or with kill -TERM "
            f"{pid} (a graceful stop: its Runs are suspended at their last checkpoint); then "
            "run intloom start with this one. Do not delete locks whose owners are still "
            "active."), check
    assert snapshot_files(project.state) == before
    assert ok(project.cli("stop", "--json", env=later))["stopped"] is True


def _newer_segment(segment: Path, fmt: int) -> None:
    """Rewrite ``segment``'s file header as an intloom of format ``fmt`` writes it (its fixed
    field and its body alike), through the store's own encoder; the frames stay as they are."""
    import struct

    import msgspec

    from intloom.store.framing import SegmentHeader, encode_segment_header

    data = segment.read_bytes()
    prefix = struct.Struct(">8sHII")
    _, _, length, _ = prefix.unpack_from(data, 0)
    header = msgspec.msgpack.decode(data[prefix.size:prefix.size + length], type=SegmentHeader)
    segment.write_bytes(encode_segment_header(msgspec.structs.replace(header, format=fmt))
                        + data[prefix.size + length:])


def test_strict_start_refuses_a_newer_intlooms_segment_as_incompatible_not_corrupt(
    project: Project,
) -> None:
    """After a downgrade, start --strict over a segment of a later format refused with
    JOURNAL_CORRUPT, the code for damage, though its finding (and every Run in it) is
    incompatible: a script telling a downgrade from a damaged disk could not. The code is
    JOURNAL_INCOMPATIBLE now, and nothing is written."""
    ok(project.cli("start", "--json"))
    run_id = ok(project.cli("flow", "example", "--intent", "x", "--json"))["run"]["runId"]
    # Killed, so a start reads its segment (a clean stop's snapshots would stand in for it).
    project.kill_host()
    ok(project.cli("recover", "--json"))
    runtime = project.state / "runtime"
    [segment] = (runtime / "wal").iterdir()
    _newer_segment(segment, 3)
    before = snapshot_files(runtime)

    strict = project.cli("start", "--strict", "--json")

    assert strict.code == 1, (strict.stdout, strict.stderr)
    error = strict.json["error"]
    assert error["code"] == "JOURNAL_INCOMPATIBLE", error
    assert (f"first: wal/{segment.name} (incompatible: is format 3; this intloom reads 1 and "
            "2 (a newer intloom wrote it") in error["message"], error["message"]
    assert snapshot_files(runtime) == before
    restore = ok(project.cli("start", "--json"))["service"]["restore"]
    assert restore["needsAttention"] == [run_id], restore
    ok(project.cli("stop", "--json"))
    assert (runtime / "wal" / segment.name).read_bytes() == before[f"wal/{segment.name}"]


def test_the_files_of_a_newer_intlooms_host_that_died_do_not_say_to_signal_its_pid(
    project: Project, tmp_path: Path,
) -> None:
    """A host of an intloom with a later metadata version killed, then this intloom (a
    downgrade): once connection.json was moved aside as told, recover and doctor said of
    service.lock "Stop the host of that intloom ..., or kill -TERM PID", a pid no process
    had any more (or another program, once reused), and that the intloom that wrote the
    files removes them, which may be uninstalled. They now say that the pid has exited and
    how to clear the files with this intloom; following that, start works."""
    later = later_intloom(tmp_path, {
        "__init__.py": (f'__version__ = "{__version__}"', '__version__ = "9.0.0"'),
        "host/metadata.py": ("METADATA_VERSION: Final = 1", "METADATA_VERSION: Final = 2")})
    ok(project.cli("start", "--json", env=later))
    pid = project.kill_host()
    state = project.state
    first = project.cli("start", "--json").json["error"]["message"]
    assert first.startswith(f"{state}/connection.json has metadata version 2"), first
    (state / "connection.json").rename(state / "connection.json.moved")  # as it says
    before = snapshot_files(state)

    recover = project.cli("recover", "--json")
    doctor = project.cli("doctor", "--json")

    assert recover.code == 1, (recover.stdout, recover.stderr)
    message = recover.json["error"]["message"]
    assert recover.json["error"]["code"] == "CLI_RECOVERY_BLOCKED", message  # DESIGN
    assert "has metadata version 2" in message and "a newer intloom" in message, message
    assert f"kill -TERM {pid}" not in message, message
    # Its evidence: no process has the pid, or a zombie (a host no one reaped yet).
    assert f"pid {pid}, the host it names, has exited (" in message, message
    assert (f"move service.json and service.lock out of .intloom/ (mv {state}/service.json "
            f"{state}/service.json.moved; mv {state}/service.lock {state}/service.lock.moved)"
            ) in message, message
    owners = [c for c in doctor.json["checks"] if c["id"].startswith("owner.")]
    assert len(owners) == 2 and all(f"kill -TERM {pid}" not in c["message"] for c in owners)
    assert snapshot_files(state) == before
    for name in ("service.json", "service.lock"):
        (state / name).rename(state / f"{name}.moved")
    ok(project.cli("start", "--json"))
    ok(project.cli("stop", "--json"))


def _later_version(tmp_path: Path) -> dict[str, str]:
    """A later intloom of the same socket protocol: only its package version differs."""
    return later_intloom(tmp_path, {
        "__init__.py": (f'__version__ = "{__version__}"', '__version__ = "9.0.0"')})


def test_a_run_a_newer_intloom_continued_is_held_by_an_older_one(
    project: Project, tmp_path: Path,
) -> None:
    """A Run begun by this intloom and continued by a newer one (its answer taken, its
    records and snapshot written by 9.0.0), then the newer one downgraded: only the Run's
    header was asked, which names the intloom that began it, and this one restored the Run
    and went on appending to a journal a newer intloom had written. A Run the newer one
    began was held. Both are held now; a Run the newer one never touched restores."""
    later = _later_version(tmp_path)
    ok(project.cli("start", "--json"))
    continued = ok(project.cli("flow", "example", "--intent", "one", "--json"))["run"]
    untouched = ok(project.cli("flow", "example", "--intent", "two", "--json"))["run"]
    ok(project.cli("stop", "--json"))
    ok(project.cli("start", "--json", env=later))
    answered = ok(project.cli("answer", continued["runId"], continued["pendingAction"]["id"],
                              '{"isConfirmed": false, "feedback": "again"}', "--json",
                              env=later))["run"]
    assert answered["status"] == "waiting", answered
    ok(project.cli("stop", "--json", env=later))

    doctor = project.cli("doctor", "--json").json
    assert "continued by intloom 9.0.0, newer than this" in str(doctor), doctor
    ok(project.cli("start", "--json"))
    runs = {run["runId"]: run for run in ok(project.cli("runs", "--json"))["runs"]}
    assert continued["runId"] not in runs, runs  # held, not restored
    assert runs[untouched["runId"]]["status"] == "waiting", runs
    refused = project.cli("answer", continued["runId"], answered["pendingAction"]["id"],
                          '{"isConfirmed": true}', "--json")
    assert refused.code == 1, refused.stdout
    error = refused.json["error"]
    assert error["code"] == "JOURNAL_INCOMPATIBLE", error
    assert (f"incompatible package: begun by intloom {__version__}, continued by intloom "
            f"9.0.0, newer than this {__version__}; upgrade intloom") in error["message"], error
    ok(project.cli("stop", "--json"))
