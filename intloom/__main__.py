"""``python -m intloom``: the ``intloom`` command."""

from __future__ import annotations

from intloom.cli.entry import run

run()
