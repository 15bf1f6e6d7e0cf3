"""``intloom logs`` with a file in ``.intloom/logs/`` under a name no host writes (notes, a
renamed copy): it was passed over without a word, while the other commands name the
unexpected files they find. It is now named (stderr in text, a warning record of the --json
stream), never read, and kept byte-identical. Real host and real CLI."""

from __future__ import annotations

import json

import pytest

from tests.helpers import Project, ok, snapshot_files

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_stray_file_in_the_logs_directory_is_named_and_kept(project: Project) -> None:
    service = ok(project.cli("start", "--json"))["service"]
    ok(project.cli("stop", "--json"))
    logs = project.state / "logs"
    (logs / "notes.txt").write_bytes(b'{"event":"not a log"}\n')
    (logs / "LOG-copy.jsonl.bak").write_bytes(b"a renamed copy\n")
    before = snapshot_files(project.state)

    text = project.cli("logs")
    assert text.code == 0, text.stderr
    assert "log_opened" in text.stdout and "not a log" not in text.stdout, text.stdout
    for name in ("notes.txt", "LOG-copy.jsonl.bak"):
        assert (f"Passed over .intloom/logs/{name}: it is not a log intloom writes (a host "
                "writes only LOG-<UTC>.jsonl there); intloom logs does not read it and left "
                "it as it is. Move it out of .intloom/logs/ unless you need it there."
                ) in text.stderr, text.stderr

    streamed = project.cli("logs", "--all", "--json")
    assert streamed.code == 0, streamed.stderr
    records = [json.loads(line) for line in streamed.stdout.splitlines()]
    notes = [r for r in records if r["event"] == "unexpected_file"]
    assert [r["file"] for r in notes] == [".intloom/logs/LOG-copy.jsonl.bak",
                                          ".intloom/logs/notes.txt"], notes
    assert all(r["level"] == "warning" and "not a log intloom writes" in r["fact"]
               for r in notes), notes
    opened = [r for r in records if r["event"] == "log_opened"]
    assert [r["instanceId"] for r in opened] == [service["instanceId"]]
    assert snapshot_files(project.state) == before  # read, never changed
