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
