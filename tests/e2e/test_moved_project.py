"""A project directory moved while its host is stopped: the saved ``connection.json`` names
the old directory, so every command refuses it, and the error says how to go on (set the
file aside). The procedure docs/recovery.md gives is followed here with a real host: the
Run waiting before the move comes back, on a new port with a new token."""

from __future__ import annotations

import json

import pytest

from tests.helpers import Project, ok

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_moved_project_says_how_to_go_on_and_restores_its_runs(project: Project) -> None:
    assert project.cli("start").code == 0
    run = ok(project.cli("flow", "example", "--intent", "move me", "--json"))["run"]
    assert run["status"] == "waiting"
    assert ok(project.cli("stop", "--json"))["stopped"] is True
    old_root = project.root
    old_connection = json.loads((project.state / "connection.json").read_text())

    new_root = old_root.parent / "moved"
    old_root.rename(new_root)
    moved = Project(root=new_root, pids=project.pids)  # the fixture reaps what it starts

    for command in ("status", "start"):
        refused = moved.cli(command, "--json")
        assert refused.code == 1, (command, refused.stdout)
        error = refused.json["error"]
        assert error["code"] == "CLI_SERVICE_METADATA_INVALID"
        connection = moved.state / "connection.json"
        assert f"belongs to another project ({old_root})" in error["message"]
        assert "moved or copied" in error["message"]
        assert f"mv {connection} {connection}.moved" in error["message"], error["message"]

    (moved.state / "connection.json").rename(moved.state / "connection.json.moved")
    started = ok(moved.cli("start", "--json"))
    assert started["service"]["projectRoot"] == str(new_root)
    new_connection = json.loads((moved.state / "connection.json").read_text())
    assert new_connection["projectRoot"] == str(new_root)
    assert new_connection["token"] != old_connection["token"]
    runs = ok(moved.cli("runs", "--json"))["runs"]
    assert [(r["runId"], r["status"]) for r in runs] == [(run["runId"], "waiting")]
    assert runs[0]["pendingAction"]["id"] == run["pendingAction"]["id"]
    assert ok(moved.cli("stop", "--json"))["stopped"] is True
