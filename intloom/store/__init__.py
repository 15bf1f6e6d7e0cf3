"""The checkpoint store: a host-wide append-only log with group commit, per-Run snapshots.

The format is documented in docs/format.md. Writers go through :class:`Store`; everything
else here is read-only.
"""

from __future__ import annotations

from intloom.store.faults import FaultPlan
from intloom.store.history import (
    History,
    HistoryEntry,
    histories,
    read_history,
    read_summary,
    scanned_history,
)
from intloom.store.reader import (
    FileProblem,
    RunJournal,
    ScanStats,
    SharedRead,
    StoreReport,
    read_ended,
    read_runs,
    read_runs_report,
    verify,
    verify_report,
    verify_run,
    verify_run_scans,
)
from intloom.store.writer import DEFAULT_SEGMENT_BYTES, Store

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "FaultPlan",
    "FileProblem",
    "History",
    "HistoryEntry",
    "RunJournal",
    "ScanStats",
    "SharedRead",
    "Store",
    "StoreReport",
    "histories",
    "read_ended",
    "read_history",
    "read_runs",
    "read_runs_report",
    "read_summary",
    "scanned_history",
    "verify",
    "verify_report",
    "verify_run",
    "verify_run_scans",
]
