"""The ``intloom`` console command (and ``python -m intloom``): ``main`` in a short process.

A CLI process lives ~0.1 s and, while it imports, allocates mostly objects that live as long
as it does (modules, classes, functions). The cyclic collector's passes over them during
import, and its full pass at exit, cost it ~15-25 ms (measured on a 2-vCPU VM with
``scripts/bench cli``) and free almost nothing. So collection is off while the command is
imported, what exists then is frozen (never scanned again), collection is back on while the
command runs (``attach`` and ``start --foreground`` may run for hours), and what exists at the
end is frozen so the exit pass has nothing to walk.
"""

from __future__ import annotations

import gc
from typing import NoReturn

__all__ = ["run"]


def run() -> NoReturn:
    gc.disable()
    try:
        from intloom.cli.app import main
    finally:
        gc.freeze()
        gc.enable()
    code = main()
    gc.freeze()
    raise SystemExit(code)
