"""A program that runs a foreground host in its own process (``start_service(...,
foreground=True)``) keeps its own SIGUSR1 and SIGUSR2 handlers once the host has stopped:
the host handles them only while it runs (it logs and ignores them)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.helpers import REPO, Project

PROGRAM = textwrap.dedent('''
    import signal
    import sys
    import threading

    from intloom.client.lifecycle import start_service, stop_service

    def mine(signum, frame):
        pass

    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, mine)
    root = sys.argv[1]

    def stop_when_ready(result):
        threading.Thread(target=stop_service, args=(root,), daemon=True).start()

    start_service(root, foreground=True, on_ready=stop_when_ready, timeout=60)
    print(",".join("mine" if signal.getsignal(s) is mine else repr(signal.getsignal(s))
                   for s in (signal.SIGUSR1, signal.SIGUSR2)))
''')


def test_a_program_keeps_its_handlers_after_its_foreground_host_stops(
        project: Project) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(project.root)], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    project.pids.add(proc.pid)  # the host runs in it: reaped with the project
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, err
    assert out.strip() == "mine,mine", (out, err)
