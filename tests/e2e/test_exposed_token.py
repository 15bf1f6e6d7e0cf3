"""A ``connection.json`` others could read (0644: unpacked from an archive, committed to a
repository) holds a token that is no secret: start refused it, as it must, but its advice
was ``chmod 600``, after which the next start served that very token, and another local
user who had read it could drive the host. The advice is to move it aside; the start after
that mints a new token. Real CLI and host subprocesses; every host is reaped."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from tests.helpers import Project, ok

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PLANTED = "A" * 43


def test_a_token_others_could_read_is_moved_aside_not_kept(project: Project) -> None:
    ok(project.cli("start", "--json"))
    ok(project.cli("stop", "--json"))
    connection = project.state / "connection.json"
    saved = json.loads(connection.read_text())
    connection.write_text(json.dumps({**saved, "token": PLANTED}))
    os.chmod(connection, 0o644)
    planted = connection.read_bytes()

    refused = project.cli("start", "--json")
    assert refused.code != 0, refused.stdout
    message = refused.json["error"]["message"]
    assert "has mode 0644" in message, message
    assert "Others could read or write the token it holds, so it is no secret: run chmod " \
        "600 " in message, message
    assert "then intloom stop (or, after a crash, intloom recover); then move it aside (mv " \
        in message, message
    assert "before the next intloom start, which writes a new token" in message, message
    assert connection.read_bytes() == planted  # refused, not changed
    doctor = project.cli("doctor", "--json")
    [check] = [c for c in doctor.json["checks"] if c["id"] == "connection"]
    assert check["next"].startswith("Others could read or write the token it holds"), check

    # The advice, step by step: chmod (so that stop can read it), stop, move it aside.
    os.chmod(connection, 0o600)
    ok(project.cli("stop", "--json"))
    advice = message.split("(mv ", 1)[1].split(")", 1)[0]
    subprocess.run(["mv", *shlex.split(advice)], check=True, cwd=project.root)
    exposed = project.state / "connection.json.exposed"
    assert exposed.read_bytes() == planted
    ok(project.cli("start", "--json"))
    token = json.loads(connection.read_text())["token"]
    assert token != PLANTED and len(token) == 43
    ok(project.cli("stop", "--json"))
