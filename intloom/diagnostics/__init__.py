"""Diagnosis, ``doctor`` and ``recover``: who owns the project's host resources, and proof of it.

``diagnose`` and ``run_doctor`` are read-only. ``recover`` removes only ``service.json`` and
``service.lock``, and only once their owner is provably gone.
"""

from __future__ import annotations

from intloom.diagnostics.doctor import DoctorReport, run_doctor
from intloom.diagnostics.owners import Diagnosis, Owner, diagnose
from intloom.diagnostics.recover import RecoverResult, recover

__all__ = [
    "Diagnosis",
    "DoctorReport",
    "Owner",
    "RecoverResult",
    "diagnose",
    "recover",
    "run_doctor",
]
