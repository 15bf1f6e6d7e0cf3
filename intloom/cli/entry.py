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
import os
import sys

from intloom.cli import exit_codes

# What this module imports runs before run()'s guard against a Ctrl-C pressed right after
# Enter, so it imports as little as it can (typing ~2 ms, threading ~0.7 ms, on a 2-vCPU VM).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["run"]


def run() -> NoReturn:
    if os.name != "posix":
        # The host and the store use POSIX file locks and descriptors throughout (fcntl,
        # /proc, fdatasync): on another OS every command failed CLI_INTERNAL_ERROR, exit 70,
        # "report it".
        sys.stderr.write(f"Failure · CLI_PLATFORM_UNSUPPORTED: intloom runs on Linux (a "
                         f"POSIX system), not on {sys.platform}; nothing was done. Run it under "
                         "Linux (on Windows, in WSL).\n")
        raise SystemExit(exit_codes.FAILURE)
    gc.disable()
    try:
        from intloom.cli.app import main
    except KeyboardInterrupt:
        # Ctrl-C before main() could catch it (pressed right after Enter, or stopping a
        # shell loop of commands): said and exited as main() does for one during the
        # command, without its renderer (not imported yet): no word in JSON mode.
        args = sys.argv[1:]
        if "--json" not in (args[: args.index("--")] if "--" in args else args):
            sys.stderr.write("Interrupted.\n")
        raise SystemExit(exit_codes.INTERRUPTED) from None
    finally:
        gc.freeze()
        gc.enable()
    code = main()
    gc.freeze()
    _end_despite_their_threads(code)
    raise SystemExit(code)


def _end_despite_their_threads(code: int) -> None:
    """doctor and inspect import the Workflow sources (start --foreground runs them): a
    module that started a thread that never ends and is not a daemon (a poller, a metrics
    client) kept the command from exiting once it was done, as Python joins such threads at
    exit. The command's output is flushed and the process ends, as the host's does."""
    import contextlib
    import threading

    main_thread = threading.main_thread()
    if not any(thread is not main_thread and thread.is_alive() and not thread.daemon
               for thread in threading.enumerate()):
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a reader gone (| head) is no failure here
            stream.flush()
    os._exit(code)
