"""``intloom logs`` with a file in ``.intloom/logs/`` under a name no host writes (notes, a
renamed copy): it was passed over without a word, while the other commands name the
unexpected files they find. It is now named (stderr in text, a warning record of the --json
stream), never read, and kept byte-identical. A copy named ``LOG-copy.jsonl`` is one of
them: ``logs`` read it as another host's log (every line twice), while doctor and the next
host passed it over; all of them now take a host's log by its exact name. Real host and
real CLI."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tests.helpers import Project, ok, snapshot_files

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_stray_file_in_the_logs_directory_is_named_and_kept(project: Project) -> None:
    service = ok(project.cli("start", "--json"))["service"]
    ok(project.cli("stop", "--json"))
    logs = project.state / "logs"
    (log,) = logs.iterdir()
    (logs / "notes.txt").write_bytes(b'{"event":"not a log"}\n')
    (logs / "LOG-copy.jsonl.bak").write_bytes(b"a renamed copy\n")
    (logs / "LOG-copy.jsonl").write_bytes(log.read_bytes())  # a copy kept beside it
    before = snapshot_files(project.state)

    text = project.cli("logs")
    assert text.code == 0, text.stderr
    assert "log_opened" in text.stdout and "not a log" not in text.stdout, text.stdout
    for name in ("notes.txt", "LOG-copy.jsonl.bak", "LOG-copy.jsonl"):
        assert (f"Passed over .intloom/logs/{name}: it is not a log intloom writes (a host "
                "writes only LOG-<UTC>.jsonl there); intloom logs does not read it and left "
                "it as it is. Move it out of .intloom/logs/ unless you need it there."
                ) in text.stderr, text.stderr

    streamed = project.cli("logs", "--all", "--json")
    assert streamed.code == 0, streamed.stderr
    records = [json.loads(line) for line in streamed.stdout.splitlines()]
    notes = [r for r in records if r["event"] == "unexpected_file"]
    assert [r["file"] for r in notes] == [".intloom/logs/LOG-copy.jsonl",
                                          ".intloom/logs/LOG-copy.jsonl.bak",
                                          ".intloom/logs/notes.txt"], notes
    assert all(r["level"] == "warning" and "not a log intloom writes" in r["fact"]
               for r in notes), notes
    opened = [r for r in records if r["event"] == "log_opened"]
    assert [r["instanceId"] for r in opened] == [service["instanceId"]]
    assert snapshot_files(project.state) == before  # read, never changed


def test_doctor_names_the_stray_entries_of_the_logs_directory_and_keeps_them(
    project: Project,
) -> None:
    """Only intloom logs named them: doctor said nothing of a file under a name no host
    writes, nor of an entry named as a host's log that is no regular file (a FIFO, a link).
    It now has a log_files check (attention) naming each, by the rule every reader of the
    directory uses (a ``LOG-copy.jsonl`` too); nothing is read or changed."""
    ok(project.cli("start", "--json"))
    ok(project.cli("stop", "--json"))
    healthy = ok(project.cli("doctor", "--json"))
    assert "log_files" not in [c["id"] for c in healthy["checks"]], healthy["checks"]
    logs = project.state / "logs"
    fifo, link = (logs / f"LOG-20260101T00000000{n}Z.jsonl" for n in (1, 2))  # hosts' names
    (logs / "notes.txt").write_bytes(b'{"event":"not a log"}\n')
    (logs / "LOG-copy.jsonl").write_bytes(b'{"event":"log_opened"}\n')
    os.mkfifo(fifo, 0o600)  # opened, it would block doctor
    link.symlink_to(logs / "notes.txt")
    (logs / ".hidden").write_bytes(b"dot names are left out, as logs leaves them\n")
    before = snapshot_files(project.state)

    result = project.cli("doctor", "--json", timeout=60)
    assert result.code == 3, (result.stdout, result.stderr)
    (check,) = [c for c in result.json["checks"] if c["id"] == "log_files"]
    assert check["status"] == "attention", check
    assert check["message"].startswith("4 entries in .intloom/logs/ no host wrote"), check
    for shown in (".intloom/logs/notes.txt (not a log intloom writes)",
                  ".intloom/logs/LOG-copy.jsonl (not a log intloom writes)",
                  f".intloom/logs/{fifo.name} (a FIFO (named pipe), not a regular file)",
                  f".intloom/logs/{link.name} (a symbolic link, not a regular file)"):
        assert shown in check["message"], check
    assert ".hidden" not in check["message"], check
    assert "move them out of .intloom/logs/" in check["next"], check
    others = [c for c in result.json["checks"] if c["id"] != "log_files"]
    assert all(c["status"] == "ok" for c in others), others

    text = project.cli("doctor")
    assert text.code == 3, text
    assert "log_files · attention: 4 entries in .intloom/logs/" in text.stdout, text.stdout
    assert snapshot_files(project.state) == before  # read, never changed
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.readlink(link) == str(logs / "notes.txt")
