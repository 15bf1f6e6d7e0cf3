"""One writer per checkpoint store, even when a live host's metadata was removed by hand.

``service.lock`` guards the project, but only while its file is there: a user who deletes a
"stale" lock and ``service.json`` under a live host, then starts again with ``--port 0``,
got a second host appending to the same log (the same Run answered on both, its effect run
twice). The store holds its own OS lock on ``runtime/`` for the host's life.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.helpers import Project, ok, pid_alive, snapshot_files

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_second_host_cannot_open_a_live_hosts_store(project: Project) -> None:
    first = ok(project.cli("start", "--json"))["service"]
    run = ok(project.cli("flow", "example", "--intent", "one writer", "--json"))["run"]
    assert run["status"] == "waiting"
    runtime = project.state / "runtime"
    before = snapshot_files(runtime)
    # Paused while its files are missing: a serving host writes a removed service.json
    # again at its next look (0.2 s, service_json_restored), and on a slow VM it did so
    # before the second start read it (CLI_SERVICE_CONFLICT). Paused, it still holds the
    # store's lock, which is what this test is about.
    os.kill(first["pid"], signal.SIGSTOP)
    try:
        (project.state / "service.lock").unlink()
        (project.state / "service.json").unlink()

        second = project.cli("start", "--port", "0", "--json")
        assert second.code != 0, second.stdout
        error = second.json["error"]
        assert error["code"] == "BUSY", error
        assert "checkpoint store" in error["message"] and str(runtime) in error["message"]
        assert "Nothing was written" in error["message"]
        assert pid_alive(first["pid"])  # the live host is untouched...
        assert snapshot_files(runtime) == before  # ...and so is its log: no new segment
        assert not (project.state / "service.lock").exists()  # the failed start cleaned up
    finally:
        os.kill(first["pid"], signal.SIGCONT)


def test_a_start_names_each_temp_file_it_removes_in_its_log(project: Project) -> None:
    """A start removes the temp files of killed atomic writes (docs/format.md), which are of
    a form only it creates; it removed them without a word, in no output and no log. The
    host log names each one it removes; a dot file of another form is left as it is."""
    import json

    ok(project.cli("start", "--json"))
    ok(project.cli("flow", "example", "--intent", "temps", "--json"))
    ok(project.cli("stop", "--json"))
    runtime = project.state / "runtime"
    planted = [".manifest.json.0123456789abcdef.tmp",
               f"snap/live/.{'a' * 64}.snap.0123456789abcdef.tmp"]
    for rel in planted:
        (runtime / rel).write_bytes(b"a killed write\n")
    other = runtime / ".manifest.json.tmp"
    other.write_bytes(b"not of the form\n")
    other.chmod(0o600)
    started = ok(project.cli("start", "--json"))["service"]
    log = project.state / "logs" / started["logFile"]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    [removed] = [e for e in events if e["event"] == "store_temp_files_removed"]
    assert sorted(removed["paths"]) == sorted(planted), removed
    assert not any((runtime / rel).exists() for rel in planted)
    assert other.read_bytes() == b"not of the form\n"
    ok(project.cli("stop", "--json"))
