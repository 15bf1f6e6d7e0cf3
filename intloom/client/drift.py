"""What changed on disk since a running host loaded its Workflows.

A host loads ``intloom.toml`` and the Workflows' source trees once, when it starts; a
``start`` that finds it running reuses it as it is. Someone who edited a Workflow, or listed
a new one, and ran ``start`` would otherwise go on creating Runs on the code the host loaded
-- and after the next restart find those Runs held, their identity no longer the tree's.
This compares what the host reports (``flows``) with the project on disk, without importing
anything: sources listed or no longer listed, and trees whose bytes hash to another identity.
"""

from __future__ import annotations

import json
import os
import posixpath
import stat
from datetime import datetime
from pathlib import Path
from typing import Final, Literal

import msgspec

from intloom import __version__
from intloom.authoring.identity import Trees, workflow_identity
from intloom.errors import IntloomError
from intloom.project import link_loop, load_config
from intloom.protocol.messages import PROTOCOL, ServiceView, WorkflowInfo
from intloom.runtime.records import PROTOCOL_VERSION as WORKFLOW_PROTOCOL

__all__ = ["SourceChange", "against_host", "changed_tree", "held_after", "since_log",
           "since_start", "workflow_since_start"]

Change = Literal["listed", "unlisted", "moved", "edited", "retried", "unreadable", "config", "port",
                 "intloom"]


class SourceChange(msgspec.Struct, frozen=True):
    """One difference between the running host's Workflows and the project on disk.

    ``change``: ``listed`` (in ``intloom.toml`` now, not loaded by the host), ``unlisted``
    (loaded, no longer listed), ``edited`` (its source tree's identity is not the loaded
    one), ``retried`` (a source the host failed to load, with files written since it
    started: the next start tries it again), ``unreadable`` (it is gone, or its tree
    cannot be hashed now), ``config``
    (``intloom.toml`` itself cannot be read now), ``port`` (``intloom.toml`` sets another
    port than the host listens on: the next start listens there), ``intloom`` (the host is
    of another intloom than the one installed now; ``source`` is ``intloom``). ``workflow``:
    the loaded Workflow's name, when there is one.
    """

    source: str
    change: Change
    message: str
    workflow: str | None = None


def _refused(entry: Path) -> str | None:
    """Why ``entry`` cannot even be looked up (a directory on its way this user may not
    search), with the fix; None when it can (whether or not it exists)."""
    try:
        os.lstat(entry)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        from intloom.fsutil import search_refused

        found = search_refused(entry) if isinstance(exc, PermissionError) else None
        return found if found is not None else f"{exc.strerror or exc}"
    return None


# A file's times come from the kernel's coarse clock, which runs up to a tick behind
# time.time(), and started_at is cut to the millisecond (some file systems keep 2 s): a file
# written just after the host started could carry a time before it. Any tree touched this
# close to the start is hashed.
_TIME_SLACK_S: Final = 2.0


class _Untouched:
    """Whether a source's tree is untouched since the host started: then the bytes the host
    loaded are still the tree's, and hashing it (a package holding a model of GBs, every
    file read whole) is no call's cost. Each tree is listed once per call, however many
    single-file sources share its directory (1,000 of them listed it 1,000 times). The
    directories between the project and the tree count too: an older copy renamed into
    place (``mv wf.old wf`` for a source ``wf/pkg``) brings files whose times are all old,
    but the rename moves the ctime of what it renamed. Not the project directory itself:
    any file made there (a report a Step writes, ``.intloom/`` at a first start) moves its
    mtime, and every tree was then hashed for the host's life."""

    def __init__(self, project: Path, started_at: str) -> None:
        self.project = project
        try:
            self.since: float | None = (
                datetime.fromisoformat(started_at).timestamp() - _TIME_SLACK_S)
        except ValueError:
            self.since = None
        self.seen: dict[tuple[str, bool], bool] = {}

    def __call__(self, entry: Path) -> bool:
        from intloom.authoring.identity import source_root, touched_since

        if self.since is None:
            return False
        root = source_root(entry)
        key = (os.path.normpath(root), root != entry)
        found = self.seen.get(key)
        if found is None:
            found = self.seen[key] = (not self._above_touched(root)
                                      and not touched_since(entry, self.since))
        return found

    def _above_touched(self, root: Path) -> bool:
        """Whether a directory from ``root``'s parent down from the project (not the project
        itself) was written, created or renamed since the host started; True when that
        cannot be told, or one is a symbolic link (its target may have been swapped)."""
        assert self.since is not None
        after = int(self.since * 1e9)
        top = os.path.normpath(self.project)
        if os.path.normpath(root) == top:
            return False  # the tree is the project's own (a single file at its root)
        at = os.path.dirname(os.path.normpath(root))
        while at != top:
            if os.path.dirname(at) == at:
                return True  # not under the project (a source outside it): no bound
            try:
                st = os.lstat(at)
            except OSError:
                return True
            if stat.S_ISLNK(st.st_mode) or max(st.st_mtime_ns, st.st_ctime_ns) > after:
                return True
            at = os.path.dirname(at)
        return False


def since_start(root: Path, service: ServiceView, flows: list[WorkflowInfo]
                ) -> list[SourceChange]:
    """How the project on disk differs from what the running host loaded."""
    upgraded = []
    if service.package_version and (service.package_version, service.protocol_version) != (
            __version__, PROTOCOL):
        # intloom installed anew (pip install -U) while its host ran: the host goes on with
        # the code it imported, and a reuse said nothing of it, so the upgrade seemed done.
        upgraded.append(SourceChange(
            "intloom", "intloom", f"The host runs intloom {service.package_version} (socket "
            f"protocol {service.protocol_version}), the one installed when it started; "
            f"intloom {__version__} (socket protocol {PROTOCOL}) is installed now."))
    try:
        config = load_config(root)
    except IntloomError as exc:
        return [*upgraded, SourceChange("intloom.toml", "config", exc.message)]
    # Sources are compared by path, not by spelling, as the loader takes them: an entry
    # respelled (./workflows/x.py for workflows/x.py) was said to be listed and not loaded,
    # and loaded and no longer listed, with the advice that a restart holds its Runs, when
    # the next start loads the same file and continues them.
    listed = {os.path.normpath(source) for source in config.workflows}
    loaded: dict[str, list[WorkflowInfo]] = {}
    for info in flows:
        loaded.setdefault(info.source, []).append(info)
    loaded_paths = {os.path.normpath(source) for source in loaded}
    out = upgraded + [
        SourceChange(source, "listed", f"{source} is listed in intloom.toml; the host started "
                     "before and has not loaded it.")
        for source in dict.fromkeys(config.workflows)
        if os.path.normpath(source) not in loaded_paths]
    # start --port N listens on N whatever intloom.toml says: a port there is a change only
    # when it is not the one the host started with (a host that does not say: any other).
    started_with = service.config_port
    if (config.port and config.port != service.port  # 0: any port, whichever it got
            and (started_with is msgspec.UNSET or config.port != started_with)):
        # The config's port wins over the saved one at a start (host/daemon.py).
        out.append(SourceChange(
            "intloom.toml", "port", f"intloom.toml sets port {config.port}; the host listens "
            f"on {service.port}, and the next start listens on {config.port}."))
    newly = [source for source in dict.fromkeys(config.workflows)
             if os.path.normpath(source) not in loaded_paths]
    for source, infos in loaded.items():
        if os.path.normpath(source) not in listed:
            names = ", ".join(i.name for i in infos if i.ready) or None
            moved = _moved(root, infos, newly) if names else None
            if moved is not None:
                # Listed under another path whose tree hashes to the same identities (a file
                # alone in its directory moved with it): the next start restores their Runs,
                # and "no longer listed: its Runs are held" was a false alarm.
                out.append(SourceChange(
                    source, "moved",
                    f"{source} is no longer listed in intloom.toml, and {moved} is: the same "
                    f"code ({names}, the same identity), which the next start loads from there "
                    "and continues its Runs with; the host still runs it from where it "
                    "loaded it.", names))
                continue
            # No Workflow of it ready: it failed to load at the host's start (boot lists a
            # failed source by its path), so nothing of it runs.
            runs = (f"the host still runs its Workflows ({names})" if names else
                    "the host failed to load it when it started and runs none of it")
            out.append(SourceChange(
                source, "unlisted",
                f"{source} is no longer listed in intloom.toml; {runs}.", names))
    # The identity hashes the Workflow protocol in: an intloom of another one computes
    # another identity for every tree, edited or not. One of the same (a host that says
    # its own) computes the same: an upgrade must not hide that a Workflow was edited,
    # which holds its Runs at the next start.
    if service.workflow_protocol:
        if service.workflow_protocol != WORKFLOW_PROTOCOL:
            out.append(SourceChange(
                "intloom", "intloom",
                f"The host runs Workflow protocol {service.workflow_protocol}; the intloom "
                f"installed now runs {WORKFLOW_PROTOCOL}, so the next start holds every "
                "unfinished Run (\"incompatible protocol\"): finish or cancel them first, or "
                f"keep intloom {service.package_version}."))
            return out
    elif service.package_version != __version__ or service.protocol_version != PROTOCOL:
        return out  # a host too old to say its Workflow protocol: identities not comparable
    trees: Trees = {}  # each source tree read once, for all the Workflows that share it
    untouched = _Untouched(root, service.started_at)
    for source, infos in loaded.items():
        if os.path.normpath(source) not in listed:
            continue
        for info in infos:
            if not info.ready:
                # It failed to load: nothing of it runs, whatever its bytes now. Written
                # since, it is likely fixed, and status said the old failure alone (authoring
                # .md promises that status and flows say what changed meanwhile).
                since = _modified_since(root, root / source, service.started_at)
                if since:
                    out.append(SourceChange(
                        source, "retried",
                        f"{source} failed to load when the host started{since}: the next "
                        "start loads it again.", None))
                continue
            entry = root / source
            loop = link_loop(root, source)
            if loop is not None:
                # exists() is False for a loop too: "no longer exists" sent the user looking
                # for a file that is there.
                out.append(SourceChange(
                    source, "unreadable", f"{loop} The host runs {info.name} {info.version} "
                    "as it loaded it.", info.name))
                break
            refused = _refused(entry)
            if refused is not None:
                # Path.exists() let the PermissionError out: status, start (reusing the
                # host) and doctor failed CLI_INTERNAL_ERROR, exit 70.
                out.append(SourceChange(
                    source, "unreadable", f"{source} cannot be looked at: {refused}. The host "
                    f"runs {info.name} {info.version} as it loaded it.", info.name))
                break
            if not entry.exists() and not entry.is_symlink():
                out.append(SourceChange(
                    source, "unreadable", f"{source} no longer exists; the host runs "
                    f"{info.name} {info.version} as it loaded it.", info.name))
                break  # one line for the source, whichever of its Workflows
            if untouched(entry):
                continue
            try:
                now = workflow_identity(info.name, info.version, entry, trees=trees)
            except IntloomError as exc:
                out.append(SourceChange(source, "unreadable", exc.message, info.name))
                continue
            if now != info.identity:
                # ``now`` hashes the new files with the loaded version, which an edit may
                # have bumped: an identity no Workflow need have, so it is not named.
                out.append(SourceChange(
                    source, "edited",
                    f"{changed_tree(source)} changed since the host loaded {info.name} "
                    f"{info.version} (identity {info.identity[:12]}"
                    f"{_modified_since(root, entry, service.started_at)}); the host runs the "
                    "Python code it loaded (a data file its Steps open is read as it is now).",
                    info.name))
    return out


def workflow_since_start(root: Path, service: ServiceView, flows: list[WorkflowInfo],
                         workflow: str) -> list[SourceChange]:
    """How the source of the loaded Workflow ``workflow`` differs on disk from what the
    host loaded (``edited``, ``unreadable``), for ``flow``: an edit said nothing there,
    though ``status`` and ``start`` said it, and the new Run, begun on the old code, was
    held at the next start. Only that source's tree is read."""
    source = next((i.source for i in flows if i.name == workflow), None)
    if source is None:
        return []
    if _Untouched(root, service.started_at)(root / source):
        return []
    changes = since_start(root, service, [i for i in flows if i.source == source])
    return [c for c in changes if c.source == source and c.change in ("edited", "unreadable")]


def _moved(root: Path, infos: list[WorkflowInfo], newly: list[str]) -> str | None:
    """The newly listed source whose tree gives every ready Workflow of ``infos`` (one
    source the host loaded, no longer listed) the identity the host loaded it with, or
    None. Hashed without importing anything: the identity covers the name, the version and
    the tree's bytes."""
    ready = [info for info in infos if info.ready]
    for source in newly:
        entry = root / source
        if link_loop(root, source) is not None or _refused(entry) is not None:
            continue
        try:
            if all(workflow_identity(info.name, info.version, entry) == info.identity
                   for info in ready):
                return source
        except (IntloomError, OSError):
            continue
    return None


def named_source(source: str, workflow: str | None = None) -> str:
    """``source``, and its ``workflow`` when that is not the source's own name: "triage
    (triage)" named a package as its Workflow twice."""
    if workflow and workflow != posixpath.basename(source.rstrip("/")):
        return f"{source} ({workflow})"
    return source


def changed_tree(source: str, workflow: str | None = None) -> str:
    """What changed of an edited ``source`` (its ``workflow``, if named), as a sentence's
    subject: a package, or the tree of a file source, its directory (the identity covers
    every Python file there and below). "workflows/example.py changed" was said of three
    listed files when only their shared helpers.py had."""
    named = named_source(source, workflow)
    if not source.endswith((".py", ".pyi")):
        return named
    return f"the source tree of {named}, {posixpath.dirname(source) or '.'}/,"


def _modified_since(root: Path, entry: Path, started_at: str) -> str:
    """``; a.py, helpers.py modified since the host started``: the files of the source tree
    written since then, which are likely the edit (a hint from their mtimes, not a proof);
    "" when none is or that cannot be told."""
    from intloom.authoring.identity import named_files, written_since

    try:
        started = datetime.fromisoformat(started_at).timestamp()
    except ValueError:
        return ""
    paths = written_since(entry, started)
    if not paths:
        return ""
    try:
        names = [path.relative_to(root).as_posix() for path in paths]
    except ValueError:
        return ""
    return f"; {named_files(names)} modified since the host started"


def against_host(root: Path, service: ServiceView
                 ) -> tuple[list[WorkflowInfo], list[SourceChange]] | None:
    """The running host's Workflows (its ``flows``), and ``since_start`` of them. None when
    the host no longer answers (a stop meanwhile): what it loaded no longer matters then, as
    the next start loads the project as it is, so callers say nothing."""
    from intloom.client.client import Client

    try:
        with Client.connect(root) as client:
            flows = client.workflows()
    except IntloomError:
        return None
    return flows, since_start(root, service, flows)


def held_after(kinds: set[str]) -> str | None:
    """Which unfinished Runs the next start holds (needs attention) for changes of these
    kinds, with what to do, or None when it holds none for them: every Run of a Workflow it
    does not load (unlisted, unreadable), and of an edited one only those that began with
    other code than the code on disk then ("its unfinished Runs are then held" was false
    after an edit undone: that start restores the Runs that began with the code there)."""
    held, keep = [], []
    if kinds & {"unlisted", "unreadable"}:
        held.append("every unfinished Run of a Workflow it cannot load")
        keep.append("keep its source listed and readable")
    if "edited" in kinds:
        held.append("the unfinished Runs of a changed Workflow that began with other code than "
                    "the code on disk at that start")
        keep.append("keep the code they began with")
    if not held:
        return None
    return (f"that start holds {' and '.join(held)} (needs attention): finish or cancel them "
            f"first, or {', or '.join(keep)}")


# How much of a stopped host's log is read for what it loaded: its start's lines come first.
_LOG_HEAD: Final = 1 << 20
# What holds a Run at the next start rather than resuming it, and an intloom.toml that
# stops that start (the stop's "Run intloom start to resume them" was then said alone).
_HOLDS: Final = ("edited", "unreadable", "unlisted", "config")


def since_log(root: Path, log: Path | None) -> list[SourceChange]:
    """What changed on disk since a host that has stopped loaded its Workflows, as its log
    says (``workflow_loaded``, written at its start): the changes for which the next start
    holds a Workflow's unfinished Runs rather than resuming them (``edited``, ``unreadable``,
    ``unlisted``), or an ``intloom.toml`` it refuses (``config``, alone: which sources it
    lists is not known then). [] when the log cannot be read, or another intloom wrote it
    (the identity hashes the version in)."""
    from intloom.client.hostlog import read_log

    # Read as the stop's own lines are: a FIFO put in its place hung ``intloom stop``.
    data = read_log(log, _LOG_HEAD, tail=False)
    if data is None:
        return []
    head = data.splitlines()
    version: object = None
    opened = ""  # when that host started: the files of an edit are those written since
    flows: list[WorkflowInfo] = []
    for line in head:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        event = entry.get("event")
        if event == "log_opened":
            version = entry.get("packageVersion")
            opened = str(entry.get("time") or "")
        elif event == "workflow_loaded":
            name, wf_version, identity, source = (
                entry.get(key) for key in ("workflow", "version", "identity", "source"))
            if (isinstance(name, str) and isinstance(wf_version, str)
                    and isinstance(identity, str) and isinstance(source, str)):
                flows.append(WorkflowInfo(name=name, version=wf_version, identity=identity,
                                          source=source, stages=[]))
        elif event in ("service_ready", "service_stopping", "service_start_failed"):
            break
    if version != __version__ or not flows:
        return []
    # started_at: the stop's "changed" line named no file, where status's named the ones
    # modified since the host started.
    service = ServiceView(project_root=str(root), pid=0, instance_id="", port=0,
                          started_at=opened, package_version=__version__)
    return [change for change in since_start(root, service, flows) if change.change in _HOLDS]
