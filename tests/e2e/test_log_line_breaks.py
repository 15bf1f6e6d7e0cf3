"""The host log keeps U+2028, U+2029 and U+0085 as JSON escapes: as raw characters they
are valid JSON, but every reader that splits text on Unicode line breaks
(``str.splitlines``, many log tools) cut one record into several."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import ok, one_source_project, reaped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BOOM = '''
import intloom

wf = intloom.Workflow("boom", version="1.0.0")
s = wf.stage("s")


@s.step("go", routes={"done": intloom.COMPLETE})
def go(ctx: intloom.StepContext[None]) -> str:
    raise RuntimeError("bad intent: " + ctx.intent)
'''

BREAKS = "x\u2028y\u2029z\x85"


def test_unicode_line_breaks_are_escaped_in_the_log_and_read_back(tmp_path: Path) -> None:
    for project in reaped(one_source_project(tmp_path, "boom", BOOM)):
        # Longer than a Run's message keeps, so that the log has the whole message.
        intent = BREAKS * 1000
        (tmp_path / "big.txt").write_text(intent, encoding="utf-8")
        ok(project.cli("start", "--json"))
        flowed = project.cli("flow", "boom", "--intent-file", str(tmp_path / "big.txt"),
                             "--json")
        assert flowed.code == 1, flowed.stdout
        run_id = flowed.json["run"]["runId"]
        ok(project.cli("stop", "--json"))

        [log] = (project.state / "logs").glob("LOG-*.jsonl")
        data = log.read_bytes()
        for raw in ("\u2028", "\u2029", "\x85"):
            assert raw.encode() not in data
        text = data.decode("utf-8")
        assert len(text.splitlines()) == data.count(b"\n")
        [cut] = [json.loads(line) for line in text.splitlines()
                 if json.loads(line)["event"] == "run_message_cut"]
        assert cut["message"].endswith(f"bad intent: {intent}")

        logged = project.cli("logs", run_id, "--json")
        assert logged.code == 0, logged.stderr
        records = [json.loads(line) for line in logged.stdout.splitlines()]
        [read] = [r for r in records if r["event"] == "run_message_cut"]
        assert read["message"] == cut["message"]

        shown = project.cli("logs", run_id)
        assert shown.code == 0, shown.stderr
        assert "bad intent: x\\u2028y\\u2029z\\x85x" in shown.stdout
