"""A start removes old host logs that a host closed cleanly (sealed 0400, ``log_closed``
last), older than 14 days or the oldest past the logs' size cap, as the TypeScript IntLoom
does. A crashed host's log, anything not provably such a log, the start's own log and the
newest one before it are kept. Real hosts, real files, real mtimes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from intloom.project import LOG_NAME
from tests.helpers import Project, eventually, make_project, ok, reaped

DAY = 24 * 3600


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    yield from reaped(make_project(tmp_path))


def _log(logs: Path, stamp: str, *, days_old: float, closed: bool = True, sealed: bool = True,
         size: int = 0, root: Path | None = None) -> Path:
    """A host log named for ``stamp`` (``20261101T000000000``), last written ``days_old``
    days ago, opened by a host of ``root`` (the project whose ``logs`` it is), its last line
    ``log_closed`` (else ``process_failed``), 0400 (else 0600)."""
    logs.parent.mkdir(mode=0o700, exist_ok=True)
    logs.mkdir(mode=0o700, exist_ok=True)
    path = logs / f"LOG-{stamp}Z.jsonl"
    assert LOG_NAME.fullmatch(path.name)
    opened = str(root if root is not None else logs.parent.parent)
    lines = [json.dumps({"event": "log_opened", "projectRoot": opened, "pad": "x" * size}),
             json.dumps({"event": "log_closed" if closed else "process_failed"})]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o400 if sealed else 0o600)
    when = time.time() - days_old * DAY
    os.utime(path, (when, when), follow_symlinks=False)
    return path


def _pruned(project: Project) -> dict[str, Any]:
    """The ``logs_pruned`` record of the running host's log (it prunes once ready)."""
    own = project.state / "logs" / json.loads(
        (project.state / "service.json").read_text())["logFile"]

    def find() -> dict[str, Any] | None:
        for line in own.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") in ("logs_pruned", "logs_not_pruned"):
                return dict(record)
        return None

    return eventually(find, what="the host's logs_pruned record")


@pytest.mark.timeout(60)
def test_a_start_removes_closed_logs_older_than_14_days_and_keeps_the_rest(
        project: Project) -> None:
    logs = project.state / "logs"
    gone = _log(logs, "20261001T000000000", days_old=40)
    kept = {
        "crashed": _log(logs, "20261002T000000000", days_old=40, closed=False, sealed=False),
        "unsealed": _log(logs, "20261003T000000000", days_old=40, sealed=False),
        "sealed_crash": _log(logs, "20261004T000000000", days_old=40, closed=False),
        "recent": _log(logs, "20261005T000000000", days_old=13),
        # The newest before the start's own: what the start and doctor read of the host
        # before, kept however old.
        "newest": _log(logs, "20261006T000000000", days_old=30),
        # Another project's log copied in, closed and sealed as ours are: not this project's
        # host's, so not the start's to remove (it was).
        "copied": _log(logs, "20261001T030000000", days_old=40,
                       root=project.root.parent / "other"),
    }
    linked = _log(logs, "20261001T120000000", days_old=40)
    os.link(linked, project.root / "elsewhere.jsonl")  # a second name: not ours alone
    foreign = logs / "LOG-copy.jsonl"
    foreign.write_text('{"event":"log_closed"}\n')
    os.utime(foreign, (time.time() - 40 * DAY,) * 2)
    symlink = logs / "LOG-20261001T060000000Z.jsonl"
    symlink.symlink_to(gone)  # a host log's name, no regular file: never followed
    ok(project.cli("start", "--json"))
    record = _pruned(project)
    assert record["event"] == "logs_pruned", record
    assert record["removed"] == [gone.name] and record["count"] == 1, record
    assert record["freed"] > 0, record
    assert not gone.exists()
    for what, path in {**kept, "linked": linked, "foreign": foreign}.items():
        assert path.exists(), what
    assert symlink.is_symlink()


@pytest.mark.timeout(60)
def test_past_the_cap_the_oldest_closed_logs_go_first(project: Project) -> None:
    logs = project.state / "logs"
    older = [_log(logs, f"2026110{k}T000000000", days_old=1, size=10_000) for k in range(1, 6)]
    crashed = _log(logs, "20261100T000000000", days_old=2, closed=False, sealed=False,
                   size=10_000)
    # 6 logs of ~10 KB and the start's own: under 35 KB means the 3 oldest closed ones go
    # (the crashed one, older still, is kept and counted).
    ok(project.cli("start", "--json", env={"INTLOOM_TEST_LOGS_CAP": "35000"}))
    record = _pruned(project)
    assert record["removed"] == [p.name for p in older[:3]], record
    assert record["left"] <= 35_000, record
    assert [p.exists() for p in older] == [False, False, False, True, True]
    assert crashed.exists()
    # The next start, under the cap, removes nothing more and says nothing of it (its stop
    # comes after its pruning, which runs as it begins to serve).
    ok(project.cli("stop", "--json"))
    ok(project.cli("start", "--json", env={"INTLOOM_TEST_LOGS_CAP": "35000"}))
    own = project.state / "logs" / json.loads(
        (project.state / "service.json").read_text())["logFile"]
    ok(project.cli("stop", "--json"))
    assert own.exists() and '"logs_pruned"' not in own.read_text()
    assert [p.exists() for p in older] == [False, False, False, True, True]
