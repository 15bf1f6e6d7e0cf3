"""``intloom verify``: every journal and file of the store, checked. Offline, read-only.

``inspect RUN`` reads one Run's segments and snapshot; ``start`` and ``doctor`` read only what
a restore reads (the snapshots and the log after them). Damage in history a snapshot already
covers, in another Run's ``snap/done/`` file or in a segment no start reads any more is found
only by reading everything, which is this command (a scrub, as ``git fsck`` is for a
repository). It writes nothing, needs no host and works the same whether one runs or not.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from intloom.cli import exit_codes
from intloom.cli.options import CliState, command

__all__ = ["verify"]


def _document(root: str, report: Any, seconds: float) -> dict[str, Any]:
    statuses = Counter(j.status for j in report.runs)
    # Of the sound ones: a corrupt Run's fold stops at the damage, short of its end.
    unfinished = sum(1 for j in report.runs if j.status == "ok"
                     and j.state is not None and j.state.phase != "terminal")
    problems = [{"runId": j.run_id, "status": j.status, "problem": j.problem}
                for j in sorted(report.runs, key=lambda j: j.run_id) if j.status != "ok"]
    files = [{"path": f.path, "kind": f.kind, "problem": f.problem} for f in report.files]
    # A torn file is what a crash mid-write leaves, with nothing acknowledged in it (a start
    # restores past it and `start --strict` accepts it): listed, but no reason to exit 3
    # after every such crash, for good (old segments are read here as long as they exist).
    damaged = [f for f in files if f["kind"] != "torn"]
    return {
        "projectRoot": root,
        "sound": not problems and not damaged,
        "runs": {"total": len(report.runs), "ok": statuses["ok"],
                 "corrupt": statuses["corrupt"], "incompatible": statuses["incompatible"],
                 "unfinished": unfinished},
        "segmentsRead": report.stats.segments_read,
        "bytesRead": report.stats.bytes_read,
        "seconds": round(seconds, 3),
        "problems": problems,
        "files": files,
    }


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _lines(doc: dict[str, Any]) -> list[str]:
    runs = doc["runs"]
    # Of the sound Runs only: "(5 unfinished)" beside doctor's 6 read as a miscount, where a
    # corrupt Run's journal stops at its damage and whether it ended is not known.
    among = "" if runs["ok"] == runs["total"] else f" of the {runs['ok']:,} sound"
    head = (f"Verified {_count(runs['total'], 'Run')} "
            f"({runs['unfinished']:,} unfinished{among}) in "
            f"{_count(doc['segmentsRead'], 'segment')}, {_count(doc['bytesRead'], 'byte')}, "
            f"{doc['seconds']} s: ")
    listed = [f"  File {f['path']} is {f['kind']}: {f['problem']}" for f in doc["files"]]
    if doc["sound"] and not listed:
        return [head + "every journal and file checks out."]
    if doc["sound"]:
        torn = len(listed)
        return [head + "every journal checks out; "
                f"{_count(torn, 'file')} {'is' if torn == 1 else 'are'} torn, as a crash "
                "mid-write or a full disk leaves it (no acknowledged record is lost; a "
                "start restores past it):", *listed]
    lines = [head + f"{runs['corrupt']:,} corrupt, {runs['incompatible']:,} incompatible, "
             f"{_count(len(doc['files']), 'file finding')}."]
    lines.extend(f"  {p['runId']} is {p['status']}: {p['problem']}" for p in doc["problems"])
    lines.extend(listed)
    lines.append("Nothing was changed: damaged and unexpected files are kept byte-identical. "
                 "intloom inspect RUN shows a Run record by record; docs/recovery.md says "
                 "what each finding means and what to do.")
    return lines


@command
def verify(state: CliState) -> int:
    """Check every journal and file of the store, old segments too. Works offline.

    Exit 0 when everything checks out (a file torn by a crash is listed, and is no damage),
    3 when something is damaged or unexpected.
    """
    from intloom.diagnostics.journal import verify_store
    from intloom.diagnostics.previews import check_journals_dir
    from intloom.project import ProjectPaths

    root = state.root()
    paths = ProjectPaths(root)
    check_journals_dir(paths)  # never read journals through a link
    began = time.monotonic()
    report = verify_store(paths.runtime)
    doc = _document(str(root), report, time.monotonic() - began)
    state.verdict = exit_codes.OK if doc["sound"] else exit_codes.DOCTOR_ATTENTION
    state.renderer.result(doc, lambda: _lines(doc))
    return state.verdict
