"""scripts/demo: drive the real CLI through a stop and a crash, narrating each step."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BOLD = "" if os.environ.get("NO_COLOR") or not sys.stdout.isatty() else "\033[1m"
RESET = "" if not BOLD else "\033[0m"
INTLOOM = [sys.executable, "-m", "intloom"]


def say(text: str) -> None:
    print(f"\n{BOLD}== {text}{RESET}", flush=True)


def cli(project: Path | None, *args: str, check: bool = True, show: bool = True) -> Any:
    """Run `intloom --json ARGS` in the project, echo it, and return its JSON."""
    where = ["--project", str(project)] if project is not None else []
    cmd = [*INTLOOM, *where, *args, "--json"]
    if show:
        print(f"$ intloom {' '.join(shlex.quote(a) for a in args)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = proc.stdout.strip()
    data = json.loads(out) if out else None
    if show:
        print(json.dumps(data, indent=2)[:1500])
    if check and proc.returncode != 0:
        raise SystemExit(
            f"intloom {' '.join(args)} failed ({proc.returncode}): {out} {proc.stderr}"
        )
    return data


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(") ")[-1].startswith("Z")
    except OSError:
        return True


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="intloom-demo-") as tmp:
        project = Path(tmp) / "demo-project"
        host_pid: int | None = None
        try:
            say("1. Create a project: one Workflow (an effect, a routed outcome, a confirmation)")
            cli(None, "init", str(project))
            say("2. Start the host in the background")
            started = cli(project, "start")
            host_pid = started["service"]["pid"]
            port = started["service"]["port"]
            say("3. Run the example Workflow; it stops at its confirmation")
            run = cli(project, "flow", "example", "--intent", "release notes for v1.2")["run"]
            run_id, action = run["runId"], run["pendingAction"]["id"]
            print(f"-> Run {run_id} waits on {action}")
            say("4. Stop the host gracefully, then start it again")
            cli(project, "stop")
            again = cli(project, "start")
            host_pid = again["service"]["pid"]
            assert again["service"]["port"] == port, "the port is kept across restarts"
            view = cli(project, "runs")["runs"]
            same = next(r for r in view if r["runId"] == run_id)
            assert same["pendingAction"]["id"] == action
            print(f"-> same Run, same action id {action}, new host instance")
            say("5. Kill the host with SIGKILL while the Run waits")
            print(f"$ kill -9 {host_pid}")
            os.kill(host_pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not pid_gone(host_pid):
                if time.monotonic() > deadline:
                    raise SystemExit("the host did not die")
                time.sleep(0.02)
            say("6. What is left? status, doctor, and the recovery plan")
            cli(project, "status")
            cli(project, "doctor", check=False)
            cli(project, "recover", "--dry-run")
            say("7. Recover (removes only the dead host's service.json and service.lock)")
            cli(project, "recover")
            say("8. Start again: same port and token, the Run back in its wait")
            third = cli(project, "start")
            host_pid = third["service"]["pid"]
            runs = cli(project, "runs")["runs"]
            same = next(r for r in runs if r["runId"] == run_id)
            assert same["pendingAction"]["id"] == action, same
            print(f"-> Run {run_id} still waits on {action}")
            say("9. Answer the confirmation: the Run completes")
            done = cli(project, "answer", run_id, action, '{"isConfirmed": true}')["run"]
            assert done["status"] == "completed", done
            say("10. Stop")
            cli(project, "stop")
            host_pid = None
            print("\nDone: one Run survived a graceful stop and a SIGKILL, and nothing ran twice.")
        finally:
            if host_pid is not None and not pid_gone(host_pid):
                os.kill(host_pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
