"""The signals the host handles, for whoever must hold them off until it does (its
``__main__`` and the launcher): imports nothing else, so it is in place in the host's first
moments."""

from __future__ import annotations

import signal
from typing import Final

__all__ = ["HANDLED", "IGNORED", "REPEATED", "STOPS"]

# SIGQUIT (Ctrl-\) is a stop too, as it is for nginx and gunicorn: its default action dumped
# core and left the service files stale; the Python and JVM habit of a thread dump would
# leave a user who meant "quit" with a host still serving.
# SIGXCPU (the kernel's warning at a CPU-time limit, ``ulimit -t``, before the hard limit's
# SIGKILL) and SIGPWR (a power failure, from a UPS daemon) are stops for the same reason:
# their default actions ended the host with its service files stale and no word in its log.
STOPS: Final = tuple(sig for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                     signal.SIGQUIT, signal.SIGXCPU,
                                     getattr(signal, "SIGPWR", None))  # Linux only
                      if sig is not None)
# Sent again each CPU-second past the soft limit: a repeat is no "second signal" forcing
# the stop (the graceful stop it began goes on until the hard limit's SIGKILL).
REPEATED: Final = frozenset({signal.SIGXCPU})
# Signals the host has no use for, whose default action ends a process: a log rotation
# tool's ``kill -USR1`` (or a stray timer's SIGALRM, SIGVTALRM or SIGPROF) ended the host
# without a word and left its service files stale.
IGNORED: Final = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGVTALRM,
                  signal.SIGPROF)
HANDLED: Final = frozenset((*STOPS, *IGNORED))
