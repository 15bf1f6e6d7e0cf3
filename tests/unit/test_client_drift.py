"""``since_start``: a running host's Workflows against the project on disk, judged from the
files alone (nothing imported). Real files; the host's side is what its ``flows`` reply
and status would say."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from intloom import __version__
from intloom.authoring.identity import workflow_identity
from intloom.cli.render import changed_lines
from intloom.client.drift import since_log, since_start
from intloom.protocol.messages import PROTOCOL, ServiceView, WorkflowInfo

pytestmark = pytest.mark.timeout(30)


def _service(root: Path, version: str = __version__) -> ServiceView:
    return ServiceView(project_root=str(root), pid=1, instance_id="i", port=1,
                       started_at="2026-12-01T00:00:00.000Z", package_version=version)


def _project(tmp_path: Path, *sources: str) -> Path:
    for source in sources:
        (tmp_path / source).mkdir(parents=True)
        (tmp_path / source / "__init__.py").write_text(f"# {source}\n")
    listed = ", ".join(f'"{s}"' for s in sources)
    (tmp_path / "intloom.toml").write_text(f"workflows = [{listed}]\n")
    return tmp_path


def _loaded(root: Path, source: str, name: str) -> WorkflowInfo:
    return WorkflowInfo(name=name, version="1", source=source, stages=["s"],
                        identity=workflow_identity(name, "1", root / source))


def test_nothing_changed_is_an_empty_list(tmp_path: Path) -> None:
    root = _project(tmp_path, "wf/a")
    assert since_start(root, _service(root), [_loaded(root, "wf/a", "a")]) == []


def test_a_source_no_longer_listed_names_its_workflows(tmp_path: Path) -> None:
    root = _project(tmp_path, "wf/a", "wf/b")
    flows = [_loaded(root, "wf/a", "a"), _loaded(root, "wf/b", "b")]
    (root / "intloom.toml").write_text('workflows = ["wf/a"]\n')
    [change] = since_start(root, _service(root), flows)
    assert (change.source, change.change, change.workflow) == ("wf/b", "unlisted", "b")
    assert "no longer listed" in change.message and "(b)" in change.message


def test_a_source_respelled_in_the_config_is_no_change(tmp_path: Path) -> None:
    """./wf/a for wf/a (or wf/a/) names the same source, which the next start loads and whose
    Runs it continues; it was said to be listed and not loaded, and loaded and no longer
    listed, with the advice that a restart holds the Runs of a changed Workflow."""
    root = _project(tmp_path, "wf/a", "wf/b")
    flows = [_loaded(root, "wf/a", "a"), _loaded(root, "wf/b", "b")]
    (root / "intloom.toml").write_text('workflows = ["./wf/a", "wf/b/"]\n')
    assert since_start(root, _service(root), flows) == []
    (root / "wf" / "a" / "__init__.py").write_text("# edited\n")  # still judged by its bytes
    [change] = since_start(root, _service(root), flows)
    assert (change.source, change.change, change.workflow) == ("wf/a", "edited", "a")


def test_a_tree_that_cannot_be_hashed_now_is_named(tmp_path: Path) -> None:
    root = _project(tmp_path, "wf/a")
    flows = [_loaded(root, "wf/a", "a")]
    os.symlink(root / "intloom.toml", root / "wf" / "a" / "linked.py")
    [change] = since_start(root, _service(root), flows)
    assert (change.change, change.workflow) == ("unreadable", "a")
    assert "symbolic link" in change.message


def test_an_unreadable_config_is_said_once_and_nothing_else_is_judged(tmp_path: Path) -> None:
    root = _project(tmp_path, "wf/a")
    flows = [_loaded(root, "wf/a", "a")]
    (root / "intloom.toml").write_text("workflows = [\n")
    [change] = since_start(root, _service(root), flows)
    assert (change.source, change.change) == ("intloom.toml", "config")
    assert "not valid TOML" in change.message


def test_a_source_that_failed_to_load_is_not_called_edited(tmp_path: Path) -> None:
    root = _project(tmp_path, "wf/a")
    failed = WorkflowInfo(name="wf/a", version="", identity="", source="wf/a", stages=[],
                          ready=False, problem="WORKFLOW_LOAD_FAILED: ...")
    # Not written since the host started (then it is retried: the test below).
    later = msgspec.structs.replace(_service(root), started_at="2099-01-01T00:00:00.000Z")
    assert since_start(root, later, [failed]) == []
    assert [c.change for c in since_start(root, _service(root), [failed])] == ["retried"]


def test_a_source_that_failed_to_load_and_is_unlisted_is_not_said_to_run(
        tmp_path: Path) -> None:
    """The host failed to load wf/b at its start, so it runs nothing of it: taken out of
    intloom.toml, it must not be said that "the host still runs what it loaded from it"."""
    root = _project(tmp_path, "wf/a", "wf/b")
    failed = WorkflowInfo(name="wf/b", version="", identity="", source="wf/b", stages=[],
                          ready=False, problem="WORKFLOW_LOAD_FAILED: ...")
    (root / "intloom.toml").write_text('workflows = ["wf/a"]\n')
    [change] = since_start(root, _service(root), [_loaded(root, "wf/a", "a"), failed])
    assert (change.source, change.change, change.workflow) == ("wf/b", "unlisted", None)
    assert "still runs" not in change.message
    assert change.message == ("wf/b is no longer listed in intloom.toml; the host failed to "
                              "load it when it started and runs none of it.")


def test_another_intlooms_host_is_not_judged_by_identity(tmp_path: Path) -> None:
    """The identity hashes intloom's protocol version in: a host of another version would
    differ for every tree, edited or not. Listing changes are still said, and so is the
    version itself: intloom upgraded while its host ran (pip install -U), start reused the
    host with no word of it, and the host went on with the old code."""
    root = _project(tmp_path, "wf/a", "wf/b")
    flows = [WorkflowInfo(name="a", version="1", source="wf/a", stages=["s"], identity="0" * 64)]
    changes = since_start(root, _service(root, version="0.0.1"), flows)
    assert [(c.source, c.change) for c in changes] == [("intloom", "intloom"), ("wf/b", "listed")]
    assert changes[0].message == (
        f"The host runs intloom 0.0.1 (socket protocol {PROTOCOL}), the one installed when it "
        f"started; intloom {__version__} (socket protocol {PROTOCOL}) is installed now.")
    assert changed_lines([msgspec.structs.asdict(c) for c in changes])[-1] == (
        "New Runs use what the host loaded when it started. To load the change: intloom stop, "
        "then intloom start.")
    edited = since_start(root, _service(root), flows)
    assert [c.change for c in edited] == ["listed", "edited"]
    # Not "its unfinished Runs ... are then held": after an edit undone, the Runs that began
    # with the code on disk again are restored by that start.
    assert changed_lines([msgspec.structs.asdict(c) for c in edited])[-1] == (
        "New Runs use what the host loaded when it started. To load the change: intloom stop, "
        "then intloom start; that start holds the unfinished Runs of a changed Workflow that "
        "began with other code than the code on disk at that start (needs attention): finish "
        "or cancel them first, or keep the code they began with (intloom doctor lists them).")
    unlisted = [{"change": "unlisted"}, {"change": "edited"}]
    both = changed_lines([{**c, "message": "m"} for c in unlisted])[-1]
    assert ("that start holds every unfinished Run of a Workflow it cannot load and the "
            "unfinished Runs of a changed Workflow that began with other code") in both, both
    assert both.endswith("finish or cancel them first, or keep its source listed and "
                         "readable, or keep the code they began with (intloom doctor lists "
                         "them)."), both
    assert changed_lines([{"change": "moved", "message": "m"}])[-1].endswith(
        "intloom stop, then intloom start."), "a move holds no Run"
    from intloom.client.drift import held_after

    # doctor adds the note by the same function: none for what holds no Run (more).
    for kinds in ({"moved"}, {"port"}, {"retried"}, {"listed"}, {"intloom"}):
        assert held_after(kinds) is None, kinds


def test_an_upgraded_intloom_of_the_same_workflow_protocol_still_tells_an_edit(
        tmp_path: Path) -> None:
    """After pip install -U while a host ran, status said only that another intloom was
    installed, and to stop and start to load it: a Workflow edited meanwhile, whose Runs
    that start then held, went unsaid. A host that says its Workflow protocol is judged by
    identity when it is this intloom's; when it is not, every unfinished Run is said to be
    held by the next start."""
    from intloom.runtime.records import PROTOCOL_VERSION

    root = _project(tmp_path, "wf/a")
    flows = [_loaded(root, "wf/a", "a")]
    (root / "wf" / "a" / "__init__.py").write_text("# edited\n")
    same = msgspec.structs.replace(_service(root, version="0.0.1"),
                                   workflow_protocol=PROTOCOL_VERSION)
    changes = since_start(root, same, flows)
    assert [(c.source, c.change) for c in changes] == [("intloom", "intloom"),
                                                      ("wf/a", "edited")], changes
    other = msgspec.structs.replace(same, workflow_protocol="2000-01-01")
    changes = since_start(root, other, flows)
    assert [(c.source, c.change) for c in changes] == [("intloom", "intloom")] * 2, changes
    assert changes[1].message == (
        f"The host runs Workflow protocol 2000-01-01; the intloom installed now runs "
        f"{PROTOCOL_VERSION}, so the next start holds every unfinished Run (\"incompatible "
        "protocol\"): finish or cancel them first, or keep intloom 0.0.1.")


def test_a_source_gone_from_disk_is_said_to_be_gone(tmp_path: Path) -> None:
    root = _project(tmp_path, "wf/a")
    flows = [_loaded(root, "wf/a", "a")]
    (root / "wf" / "a" / "__init__.py").unlink()
    (root / "wf" / "a").rmdir()
    [change] = since_start(root, _service(root), flows)
    assert (change.source, change.change, change.workflow) == ("wf/a", "unreadable", "a")
    assert change.message == "wf/a no longer exists; the host runs a 1 as it loaded it."


def test_a_source_under_a_symlink_loop_is_named_as_a_loop_as_the_loader_does(
        tmp_path: Path) -> None:
    """An entry under a link that leads back to itself was said to be "no longer exists",
    though the loader (the next start, doctor) names the loop."""
    import shutil

    from intloom.authoring.loader import load_workflows
    from intloom.project import load_config

    root = _project(tmp_path, "wf/a", "b")
    flows = [_loaded(root, "wf/a", "a"), _loaded(root, "b", "b")]
    shutil.rmtree(root / "wf")
    shutil.rmtree(root / "b")
    (root / "wf").symlink_to("flows")
    (root / "flows").symlink_to("wf")
    (root / "b").symlink_to("b")
    changes = {c.source: c for c in since_start(root, _service(root), flows)}
    loader = dict(load_workflows(root, load_config(root)).problems)
    for source, name in (("wf/a", "a"), ("b", "b")):
        change = changes[source]
        assert (change.change, change.workflow) == ("unreadable", name)
        assert change.message == (f"{loader[source].message} The host runs {name} 1 as it "
                                  "loaded it."), change.message
    assert "wf is a symbolic link that leads into a loop" in changes["wf/a"].message


def _host_log(root: Path, *flows: WorkflowInfo, version: str = __version__,
              opened: str = "2026-12-01T00:00:00.000Z") -> Path:
    """The head of a host's log, as its start writes it (host/boot.py)."""
    log = root / "LOG-1.jsonl"
    lines = [{"time": opened, "event": "log_opened", "packageVersion": version}, *(
        {"event": "workflow_loaded", "workflow": f.name, "version": f.version,
         "identity": f.identity, "source": f.source} for f in flows),
        {"event": "service_ready"}, {"event": "service_stopping"}]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return log


def test_a_stop_names_the_sources_changed_since_its_host_loaded_them(tmp_path: Path) -> None:
    """intloom stop said "Run intloom start to resume it" of a Run whose Workflow had been
    edited since the host loaded it; that start held the Run (needs attention)."""
    from intloom.cli.commands.service import stop_lines
    from intloom.client.lifecycle import StopResult

    root = _project(tmp_path, "wf/a", "wf/b")
    log = _host_log(root, _loaded(root, "wf/a", "a"), _loaded(root, "wf/b", "b"))
    assert since_log(root, log) == []
    (root / "wf" / "a" / "__init__.py").write_text("# edited\n")
    [change] = since_log(root, log)
    assert (change.source, change.change, change.workflow) == ("wf/a", "edited", "a")
    # The files written since that host started, as status names them (it named none).
    assert "; wf/a/__init__.py modified since the host started)" in change.message, change
    text = stop_lines(StopResult(stopped=True, cut=[], suspended=1, changed=[change]))
    # Its Workflow is named once ("wf/a (a)" said it twice), and only the Runs that began
    # with other code are said to be held: after an edit undone, none are.
    assert text[-1] == (
        "But wf/a changed since this host loaded it: the next start holds those unfinished "
        "Runs of a that began with other code than what is on disk now (needs attention) "
        "rather than restoring them by the restart table, whatever the lines above say of "
        "them; intloom doctor lists them and what a start would do."), text
    # Another intloom's identities differ for every tree: nothing is judged from them.
    assert since_log(root, _host_log(root, _loaded(root, "wf/a", "a"), version="0.0.1")) == []


def test_a_stop_says_the_next_start_refuses_an_intloom_toml_broken_since(
        tmp_path: Path) -> None:
    """intloom.toml broken (a typo) after the host started: the stop said "Run intloom start
    to resume it" alone, and that start refused the project (INVALID_REQUEST)."""
    from intloom.cli.commands.service import stop_lines
    from intloom.client.lifecycle import StopResult

    root = _project(tmp_path, "wf/a")
    log = _host_log(root, _loaded(root, "wf/a", "a"))
    (root / "intloom.toml").write_text('workflows = ["wf/a"]\nprot = 1\n')
    [change] = since_log(root, log)
    assert (change.source, change.change) == ("intloom.toml", "config"), change
    assert "unknown key 'prot'" in change.message, change
    text = stop_lines(StopResult(stopped=True, cut=[], suspended=1, changed=[change]))
    assert text[-1] == (
        f"But the next intloom start refuses the project as it is: {change.message} Once it "
        "is fixed, that start holds (needs attention) every unfinished Run of a Workflow it "
        "cannot load and those that began with other code than the code on disk at that "
        "start, rather than restoring them by the restart table; intloom doctor lists them "
        "and what a start would do."), text


def test_file_sources_sharing_a_directory_name_their_tree_and_the_file_written(
    tmp_path: Path,
) -> None:
    """A file source's identity covers its directory: with only the helpers.py two listed
    files share edited, start, status and doctor said "wf/a.py changed" and "wf/b.py
    changed", and stop said so of each, of files no one touched."""
    from intloom.cli.commands.service import stop_lines
    from intloom.client.lifecycle import StopResult

    (tmp_path / "wf").mkdir()
    for name in ("a", "b"):
        (tmp_path / "wf" / f"{name}.py").write_text(f"# {name}\n")
    (tmp_path / "wf" / "helpers.py").write_text("X = 1\n")
    (tmp_path / "intloom.toml").write_text('workflows = ["wf/a.py", "wf/b.py"]\n')
    flows = [_loaded(tmp_path, "wf/a.py", "a"), _loaded(tmp_path, "wf/b.py", "b")]
    helpers = tmp_path / "wf" / "helpers.py"
    helpers.write_text("X = 2\n")
    os.utime(tmp_path / "wf" / "a.py", (0, 0))  # written before the host started (_service)
    os.utime(tmp_path / "wf" / "b.py", (0, 0))
    changes = since_start(tmp_path, _service(tmp_path), flows)
    assert [(c.source, c.change, c.message) for c in changes] == [
        (f"wf/{name}.py", "edited",
         f"the source tree of wf/{name}.py, wf/, changed since the host loaded {name} 1 "
         f"(identity {flow.identity[:12]}; wf/helpers.py modified since the host started); "
         "the host runs the Python code it loaded (a data file its Steps open is read as it is "
         "now).") for name, flow in zip("ab", flows, strict=True)]
    os.utime(helpers, (0, 0))  # the hint is from mtimes: none later than the start, none said
    assert "modified" not in since_start(tmp_path, _service(tmp_path), flows)[0].message
    text = stop_lines(StopResult(stopped=True, cut=[], suspended=1, changed=changes))
    assert text[-1].startswith(
        "But the source tree of wf/a.py (a), wf/, changed since this host loaded it; the "
        "source tree of wf/b.py (b), wf/, changed since this host loaded it: the next start "
        "holds those unfinished Runs of a, b that began with other code than what is on "
        "disk now (needs attention)"), text


def test_a_stop_reads_what_its_host_loaded_only_from_a_regular_file(tmp_path: Path) -> None:
    """``since_log`` opened the log by name: a FIFO planted there (the stop's own reading of
    it gives up on one) blocked ``intloom stop`` for ever, after the host had stopped; a
    link was followed to a file outside ``.intloom/logs``."""
    import threading

    root = _project(tmp_path, "wf/a")
    real = _host_log(root, _loaded(root, "wf/a", "a"))
    (root / "wf" / "a" / "__init__.py").write_text("# edited\n")
    assert [c.change for c in since_log(root, real)] == ["edited"]
    link = real.with_name("LOG-link.jsonl")
    link.symlink_to(real)
    assert since_log(root, link) == []
    fifo = real.with_name("LOG-fifo.jsonl")
    os.mkfifo(fifo, 0o600)
    found: list[object] = []
    reader = threading.Thread(target=lambda: found.append(since_log(root, fifo)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # blocked opening the FIFO: a writer's open and close frees it
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
        pytest.fail("since_log blocked on a FIFO at the host log's name")
    assert found == [[]]


def test_a_stop_says_every_run_of_a_source_no_longer_listed_is_held() -> None:
    """For a source no longer listed (or that cannot be loaded) the next start loads no
    Workflow of it, and holds every one of its Runs whatever their code: "those that began
    with other code" is said of an edit only."""
    from intloom.cli.commands.service import stop_lines
    from intloom.client.drift import SourceChange
    from intloom.client.lifecycle import StopResult

    change = SourceChange("triage", "unlisted", "triage is no longer listed", "triage")
    text = stop_lines(StopResult(stopped=True, cut=[], suspended=1, changed=[change]))
    assert text[-1] == (
        "But triage is no longer listed in intloom.toml: the next start holds every "
        "unfinished Run of triage (its Workflow is not loaded then; needs attention) rather "
        "than restoring them by the restart table, whatever the lines above say of them; "
        "intloom doctor lists them and what a "
        "start would do."), text


def test_a_source_that_failed_to_load_and_was_written_since_is_retried(tmp_path: Path) -> None:
    """A source the host failed to load is compared by its files' mtimes (it has no loaded
    identity): written since the host started, the next start tries it again. Nothing
    was said, and status showed the old failure alone after it was fixed."""
    root = _project(tmp_path, "wf/a", "wf/b")
    failed = WorkflowInfo(name="wf/b", version="", identity="", source="wf/b", stages=[],
                          ready=False, problem="WORKFLOW_DEFINITION_INVALID: ...")
    flows = [_loaded(root, "wf/a", "a"), failed]
    service = msgspec.structs.replace(_service(root), started_at="2099-01-01T00:00:00.000Z")
    assert since_start(root, service, flows) == []  # not written since the host started
    [change] = since_start(root, _service(root), flows)
    assert (change.source, change.change, change.workflow) == ("wf/b", "retried", None)
    assert change.message == ("wf/b failed to load when the host started; wf/b/__init__.py "
                              "modified since the host started: the next start loads it "
                              "again."), change.message
    # No hold is warned of: its Runs are held already, and loading it frees them.
    [said, advice] = changed_lines([msgspec.to_builtins(change)])
    assert said == f"Changed  {change.message}", said
    assert "are then held" not in advice, advice


def test_flow_hashes_its_workflow_only_when_its_tree_was_touched_since_the_host_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """flow compares its Workflow's tree before each Run: a package holding a model of GBs
    was read whole by every flow. A tree no file or directory of which was written since the
    host started is not hashed; one written to is, and its edit named."""
    import msgspec

    from intloom.client import drift

    root = _project(tmp_path, "wf")
    flows = [_loaded(root, "wf", "a")]
    hashed: list[str] = []
    real = drift.since_start

    def counting(*args: Any, **kw: Any) -> list[drift.SourceChange]:
        hashed.append("x")
        return real(*args, **kw)

    monkeypatch.setattr(drift, "since_start", counting)
    later = msgspec.structs.replace(_service(root), started_at="2999-01-01T00:00:00.000Z")
    assert drift.workflow_since_start(root, later, flows, "a") == []
    assert hashed == []  # untouched since the (future) start: not read
    (root / "wf" / "__init__.py").write_text("# edited\n")
    changes = drift.workflow_since_start(root, _service(root), flows, "a")
    assert hashed == ["x"] and [c.change for c in changes] == ["edited"], changes


# Audit events seen while ``_watching`` is set: an audit hook cannot be removed, so the one
# this module installs (once, in whichever worker runs it) records nothing otherwise.
_watching: list[bool] = []
_seen: list[tuple[str, str]] = []
_hooked: list[bool] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _watching and event in ("open", "os.scandir") and args and args[0] is not None:
        _seen.append((event, os.fspath(args[0]) if isinstance(args[0], (str, Path)) else ""))


def _touches(call: Any) -> list[tuple[str, str]]:
    """The files opened and directories listed while ``call()`` ran."""
    import sys

    if not _hooked:
        sys.addaudithook(_audit)
        _hooked.append(True)
    _seen.clear()
    _watching.append(True)
    try:
        call()
    finally:
        _watching.clear()
    return list(_seen)


def test_status_reads_no_tree_untouched_since_the_host_started(tmp_path: Path) -> None:
    """status, flows, doctor and a reusing start read every file of every package tree
    whole to hash it: a 2 GiB model beside the code cost each of them 2 GiB of memory and
    seconds. A tree no file or directory of which was written since the host started holds
    what the host loaded, and is not read; each directory of single-file sources is listed
    once for all of them (1,000 such sources listed it 1,000 times). Touched, the tree is
    hashed, and a data file's edit named."""
    import msgspec

    root = _project(tmp_path, "wf/pkg")
    model = root / "wf" / "pkg" / "model.bin"
    model.write_bytes(b"\0" * 4096)
    for name in ("a", "b", "c"):
        (root / "wf" / f"{name}.py").write_text(f"# {name}\n")
    (root / "intloom.toml").write_text('workflows = ["wf/pkg", "wf/a.py", "wf/b.py", "wf/c.py"]\n')
    flows = [_loaded(root, "wf/pkg", "p")] + [
        _loaded(root, f"wf/{name}.py", name) for name in ("a", "b", "c")]
    later = msgspec.structs.replace(_service(root), started_at="2999-01-01T00:00:00.000Z")
    found: list[Any] = []
    seen = _touches(lambda: found.extend(since_start(root, later, flows)))
    assert found == []
    tree = str(root / "wf")
    assert not [path for event, path in seen if event == "open" and path.startswith(tree)], seen
    listed = [path for event, path in seen if event == "os.scandir"]
    # wf/ once for a.py, b.py and c.py (their tree, wf/pkg/ in it), and wf/pkg/ as a package.
    assert sorted(listed) == [tree, str(root / "wf" / "pkg"), str(root / "wf" / "pkg")], listed
    # Written since the start (the _service's, in the past): hashed, and the edit named.
    model.write_bytes(b"\1" * 4096)
    seen = _touches(lambda: found.extend(since_start(root, _service(root), flows)))
    assert [(c.source, c.change) for c in found] == [("wf/pkg", "edited")], found
    assert ("open", str(model)) in seen, seen


def _started_after(root: Path) -> str:
    """A ``started_at`` later than every file time under ``root``, by the file system's own
    clock: a file beside it is written again until its ctime passes the millisecond that
    holds theirs (no sleep)."""
    from datetime import UTC, datetime

    latest = max(max(st.st_mtime_ns, st.st_ctime_ns)
                 for st in [os.lstat(root), *(os.lstat(p) for p in root.rglob("*"))])
    probe = root.parent / f".{root.name}.clock"
    deadline = time.monotonic() + 10
    while True:
        probe.write_text("")
        if os.lstat(probe).st_ctime_ns // 1_000_000 > latest // 1_000_000:
            break
        assert time.monotonic() < deadline, "the file system's clock did not move"
    probe.unlink()
    return datetime.fromtimestamp((latest // 1_000_000 + 1) / 1000, UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def test_an_older_copy_renamed_into_place_above_the_tree_is_hashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mv wf wf.bad && mv wf.old wf`` for a source ``wf/pkg`` (a rollback to a copy made
    before the host started): no file or directory of the tree has a time after the start,
    and status said nothing, though the next start held the Runs. The directories above
    the tree, up to the project, count too."""
    import msgspec

    from intloom.client import drift

    monkeypatch.setattr(drift, "_TIME_SLACK_S", 0.0)
    root = _project(tmp_path, "wf/pkg")
    (root / "wf.old" / "pkg").mkdir(parents=True)
    (root / "wf.old" / "pkg" / "__init__.py").write_text("# the older copy\n")
    flows = [_loaded(root, "wf/pkg", "p")]
    service = msgspec.structs.replace(_service(root), started_at=_started_after(root))
    # A file made in the project directory itself (a report, .intloom/ at a first start)
    # moves its mtime: that is no edit of any tree, and hashed them all for the host's life.
    (root / "report.txt").write_text("a Step's output\n")
    seen = _touches(lambda: drift.since_start(root, service, flows))
    assert not [path for event, path in seen if event == "open" and "wf" in path], seen
    (root / "wf").rename(root / "wf.bad")
    (root / "wf.old").rename(root / "wf")
    changes = since_start(root, service, flows)
    assert [(c.source, c.change) for c in changes] == [("wf/pkg", "edited")], changes


def test_the_directories_between_the_project_and_a_tree_and_no_others_count(
        tmp_path: Path) -> None:
    """A single-file source at the project's root has the project for its tree: the walk
    up from it climbed past the project to /, and called it touched at every call (every
    tree hashed again). A symbolic link on the way counts as touched: its target may have
    been swapped with no time of the tree moving."""
    from intloom.client.drift import _Untouched

    later = "2999-01-01T00:00:00.000Z"
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "flow.py").write_text("x = 1\n")
    assert _Untouched(alone, later)(alone / "flow.py")
    root = tmp_path / "proj"
    (root / "wf" / "real" / "pkg").mkdir(parents=True)
    (root / "wf" / "real" / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / "wf" / "lnk").symlink_to(root / "wf" / "real")
    untouched = _Untouched(root, later)
    assert untouched(root / "wf" / "real" / "pkg")
    assert not untouched(root / "wf" / "lnk" / "pkg")
