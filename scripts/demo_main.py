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


def _run(where: Path, args: tuple[str, ...], json_mode: bool) -> tuple[int, str, str]:
    """``intloom ARGS`` run in ``where``, as a person who typed ``cd`` there would run it
    (with --project from elsewhere, each command ended by saying where its commands to copy
    must run)."""
    cmd = [*INTLOOM, *args, *(["--json"] if json_mode else [])]
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=where)
    return proc.returncode, proc.stdout, proc.stderr


def show(project: Path, *args: str, ok: tuple[int, ...] = (0,)) -> None:
    """Run `intloom ARGS` as a person would and print what it prints."""
    print(f"$ intloom {' '.join(shlex.quote(a) for a in args)}", flush=True)
    code, out, err = _run(project, args, json_mode=False)
    text = (out + err).rstrip()
    print("\n".join("  " + line for line in text.splitlines()), flush=True)
    if code not in ok:
        raise SystemExit(f"intloom {' '.join(args)} exited {code}")


def data(project: Path, *args: str) -> Any:
    """Run `intloom ARGS --json` quietly and return its JSON (for ids the narration needs)."""
    code, out, err = _run(project, args, json_mode=True)
    if code != 0:
        raise SystemExit(f"intloom {' '.join(args)} failed ({code}): {out} {err}")
    return json.loads(out)


def cli(project: Path, *args: str) -> Any:
    """Run `intloom ARGS --json`, print a one-line summary, and return the JSON."""
    print(f"$ intloom {' '.join(shlex.quote(a) for a in args)} --json", flush=True)
    result = data(project, *args)
    print("  " + json.dumps(result)[:240] + ("…" if len(json.dumps(result)) > 240 else ""))
    return result


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
            show(project.parent, "init", project.name)
            print(f"$ cd {project.name}")
            say("2. Start the host in the background")
            show(project, "start")
            service = data(project, "status")["service"]
            host_pid, port = service["pid"], service["port"]
            say("3. Run the example Workflow; it stops at its confirmation")
            run = cli(project, "flow", "example", "--intent", "release notes for v1.2")["run"]
            run_id, action = run["runId"], run["pendingAction"]["id"]
            print(f"-> Run {run_id} waits on {action}")
            say("4. Stop the host gracefully, then start it again")
            show(project, "stop")
            show(project, "start")
            service = data(project, "status")["service"]
            host_pid = service["pid"]
            assert service["port"] == port, "the port is kept across restarts"
            show(project, "runs")
            same = next(r for r in data(project, "runs")["runs"] if r["runId"] == run_id)
            assert same["pendingAction"]["id"] == action
            print(f"-> the same Run waits on the same action {action}, under a new host instance")
            say("5. Kill the host with SIGKILL while the Run waits")
            print(f"$ kill -9 {host_pid}")
            os.kill(host_pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while not pid_gone(host_pid):
                if time.monotonic() > deadline:
                    raise SystemExit("the host did not die")
                time.sleep(0.02)  # poll interval while the kernel tears the process down
            say("6. What is left? status, doctor, and the recovery plan")
            show(project, "status")
            show(project, "stop", ok=(1,))
            show(project, "doctor", ok=(0, 3, 4))
            show(project, "recover", "--dry-run")
            say("7. Recover: removes only the dead host's service.json and service.lock")
            show(project, "recover")
            say("8. Start again: same port and token, the Run back in its wait")
            show(project, "start")
            service = data(project, "status")["service"]
            host_pid = service["pid"]
            assert service["port"] == port
            same = next(r for r in data(project, "runs")["runs"] if r["runId"] == run_id)
            assert same["pendingAction"]["id"] == action, same
            print(f"-> Run {run_id} still waits on {action}")
            say("9. Answer the confirmation: the Run completes")
            show(project, "answer", run_id, action, '{"isConfirmed": true}')
            assert data(project, "runs")["runs"][0]["status"] == "completed"
            say("10. Stop")
            show(project, "stop")
            host_pid = None
            print("\nDone: one Run survived a graceful stop and a SIGKILL, and nothing ran twice.")
        finally:
            if host_pid is not None and not pid_gone(host_pid):
                os.kill(host_pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
