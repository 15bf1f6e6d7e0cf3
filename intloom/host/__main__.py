"""``python -m intloom.host --project ROOT [--port N] [--strict] [--ready-fd FD]``.

The launcher's contract (``intloom.client.lifecycle``): the host reports over ``--ready-fd``
as described in ``intloom.host.readiness`` and exits 0 after a clean stop, 1 otherwise.
Test-only knobs: ``INTLOOM_TEST_HELLO_TIMEOUT``, ``INTLOOM_TEST_IDLE_TIMEOUT``,
``INTLOOM_TEST_FRAME_TIMEOUT`` and ``INTLOOM_TEST_WRITE_TIMEOUT`` (seconds) shorten the
connection timeouts,
``INTLOOM_TEST_MAX_CONNECTIONS`` lowers the connection cap, ``INTLOOM_TEST_MAX_UNPROVEN``
how many of them may be waiting for a hello, ``INTLOOM_TEST_FOLLOW_BACKLOG``
(bytes) a follower's backlog, ``INTLOOM_TEST_FOLLOW_SNDBUF`` (bytes) the kernel's send buffer
of a follower's connection, ``INTLOOM_TEST_SUSPEND_GRACE``
shortens how long a stop waits for Steps in flight, ``INTLOOM_TEST_REFUSED_QUIET`` (seconds)
the quiet period between two ``connection_refused`` lines of one reason,
``INTLOOM_TEST_RESTORE_LISTED`` lowers
how many Run ids each of a reply's restore lists names (and store problems it lists),
``INTLOOM_TEST_LOGS_CAP`` (bytes) the host logs' size past which a start removes the oldest
closed ones,
``INTLOOM_TEST_FATAL=1`` raises right after ready, ``INTLOOM_TEST_START_SIGNAL=WHERE:SIGNAL``
sends the host SIGNAL at that point of its start (``listening``: before service.json is
written; ``published``: right after), ``INTLOOM_TEST_HOLD_PUBLISHED=PATH`` holds the start
right after service.json is written until PATH exists, ``INTLOOM_TEST_HOLD_UNLISTENED=PATH``
holds a stop right after it closes its listener until PATH exists (each set one is logged
as ``test_hooks_armed`` at the start), and
``INTLOOM_TEST_PORTS=LO-HI``
confines a port-0 bind to those ports.
"""

from __future__ import annotations

import signal
import sys

from intloom.host.signals import HANDLED

if __name__ == "__main__":
    # First thing, before the imports that take most of the start-up (~0.2 s): a kill -TERM
    # in the host's first moments ended it by the default action, unlogged. Blocked, the
    # signal waits for Host's handlers, and the start stops as asked (CLI_SERVICE_CLOSING).
    # (The launcher blocks them across its fork and exec too, which closes the gap before.)
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)

import argparse
import contextlib
import os

import msgspec


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m intloom.host")
    parser.add_argument("--project", required=True, help="the project root (holds intloom.toml)")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--ready-fd", type=int, default=None)
    return parser.parse_args(argv)


def _report_early(fd: int | None, code: str, message: str) -> None:
    """Before the host exists: tell the launcher why, in the readiness protocol's shape."""
    if fd is None:
        print(f"Failure · {code}: {message}", file=sys.stderr)
        return
    line = msgspec.json.encode(
        {"event": "error", "error": {"code": code, "message": message, "retryable": False}}
    )
    with contextlib.suppress(OSError):
        os.write(fd, line + b"\n")


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        from pathlib import Path

        from intloom.errors import IntloomError
        from intloom.host.daemon import Host, HostOptions, with_test_hooks
        from intloom.host.readiness import ReadyChannel
        from intloom.project import find_root
    except Exception as exc:  # a broken install: say so instead of dying silently
        _report_early(args.ready_fd, "CLI_INTERNAL_ERROR",
                      f"The host could not import intloom ({type(exc).__name__}: {exc}).")
        return 1
    if args.port is not None and not 0 <= args.port <= 65535:
        _report_early(args.ready_fd, "INVALID_REQUEST",
                      f"--port {args.port} is outside 0..65535. Pick a valid port.")
        return 1
    try:
        root = find_root(Path(args.project), explicit=True)
        options = with_test_hooks(HostOptions(root=root, port=args.port, strict=args.strict))
    except IntloomError as exc:
        _report_early(args.ready_fd, exc.code, exc.message)
        return 1
    return Host(options, ReadyChannel(args.ready_fd)).run(own_process=True)


if __name__ == "__main__":
    sys.exit(main())
