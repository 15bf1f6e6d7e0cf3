"""``service.json`` removed or replaced by hand while its host serves."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest

from tests.helpers import CliResult, Project, eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _ok(result: CliResult) -> Any:
    assert result.code == 0, (result.code, result.stdout, result.stderr)
    return result.json


def _logged(project: Project, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for log in sorted((project.state / "logs").glob("*.jsonl"))
             for line in log.read_text().splitlines() if line.strip()]
    return [line for line in lines if line.get("event") == event]


def test_a_service_json_removed_while_the_host_serves_is_written_again(
    project: Project,
) -> None:
    """Without it every command took the serving host for one starting: status and doctor
    said to wait, and start and stop each waited 300 s for a start long over."""
    started = _ok(project.cli("start", "--json"))["service"]
    service = project.state / "service.json"
    written = json.loads(service.read_text())
    service.unlink()
    eventually(service.exists, what="service.json written again")
    assert json.loads(service.read_text()) == written
    # The line follows the write: read once written (under load the read came first).
    [restored] = eventually(lambda: _logged(project, "service_json_restored"),
                            what="service_json_restored logged")
    assert restored["path"] == str(service), restored
    status = _ok(project.cli("status", "--json"))
    assert status["service"]["pid"] == started["pid"], status  # running, not starting
    _ok(project.cli("stop", "--json"))
    assert not service.exists() and not (project.state / "service.lock").exists()


def test_a_service_json_put_back_by_hand_is_kept_and_the_stop_says_why(
    project: Project, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A byte-identical copy put in its place is not the file the host wrote, so a clean
    stop keeps it; the stop said the host "crashed meanwhile, or could not remove it (an
    immutable file ...)", and its log said nothing."""
    _ok(project.cli("start", "--json"))
    service = project.state / "service.json"
    aside = tmp_path_factory.mktemp("aside") / "service.json"
    shutil.copy2(service, aside)
    copy = project.state / "service.json.copy"
    shutil.copy2(aside, copy)
    os.replace(copy, service)  # in one step: the host never finds it gone, to write it again
    stopped = project.cli("stop", "--json")
    assert stopped.code != 0, stopped
    message = stopped.json["error"]["message"]
    assert "names this host but is another file than the one it wrote" in message, message
    assert "crashed" not in message and "immutable" not in message, message
    [kept] = _logged(project, "service_files_kept")
    assert any("another file than the one it wrote" in p for p in kept["problems"]), kept
    assert service.read_bytes() == aside.read_bytes()
    assert _ok(project.cli("recover", "--json"))["recovered"] is True
