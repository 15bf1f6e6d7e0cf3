"""``intloom runs --json`` against a live host, next to ``python -c "import typer"``.

Both are whole processes, timed from spawn to reap (``os.wait4``), interleaved after warm-up
rounds that fill the bytecode caches. ``PYTHONDONTWRITEBYTECODE`` is removed from the
children's environment so that the caches are written and used, as on a user's machine.
A ``python -c pass`` row shows the interpreter's own start-up. The order of the commands
changes every round (``bench_common.round_order``), so that none always runs first.
"""

from __future__ import annotations

import subprocess
from typing import Any

from scripts.bench_common import (
    INTLOOM,
    VENV_PY,
    bench_env,
    judged,
    median,
    note,
    project,
    rnd,
    round_order,
    scratch,
    wait4_spawn,
)


def import_profile(cmd: list[str], cwd: Any, top: int = 12) -> list[dict[str, Any]]:
    """The modules with the largest self import time (``-X importtime``), in ms."""
    proc = subprocess.run([str(VENV_PY), "-X", "importtime", *cmd], cwd=cwd,
                          env=bench_env(), capture_output=True, text=True, timeout=60)
    rows: list[dict[str, Any]] = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        own, cumulative, name = line[len("import time:"):].split("|")
        rows.append({"module": name.strip(), "self_ms": rnd(int(own) / 1e3, 2),
                     "cumulative_ms": rnd(int(cumulative) / 1e3, 2)})
    rows.sort(key=lambda r: r["self_ms"], reverse=True)
    return rows[:top]


def bench_cli(args: Any) -> dict[str, Any]:
    env = bench_env()
    with scratch(args.dir, "bench-cli-") as base, project(base) as host:
        host.start()
        with host.client() as client:
            for _ in range(args.runs):
                client.create_run("loop", '{"target": 1}', wait=True)
        commands = {
            "runs": [str(INTLOOM), "runs", "--json"],
            "typer": [str(VENV_PY), "-c", "import typer"],
            "pass": [str(VENV_PY), "-c", "pass"],
        }
        for _ in range(3):  # warm-up: bytecode caches written, files in the page cache
            for cmd in commands.values():
                wait4_spawn(cmd, cwd=host.root, env=env)
        samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in commands}
        orders: list[list[str]] = []
        for rep in range(args.repeats):
            # Run in a fixed order, `runs` always came first, right after the previous
            # round's `pass`, and `typer` always after it.
            orders.append(round_order(list(commands), rep))
            for name in orders[-1]:
                samples[name].append(wait4_spawn(commands[name], cwd=host.root, env=env))
        note("cli: profiling imports of `intloom runs --json`")
        profile = import_profile(["-m", "intloom", "runs", "--json"], host.root)
        host.stop()
    rows: dict[str, dict[str, Any]] = {
        name: {
            "wall_ms": rnd(median([s[0] for s in got]) * 1e3),
            "cpu_ms": rnd(median([s[1] for s in got]) * 1e3),
            "runs_wall_ms": [rnd(s[0] * 1e3) for s in got],
        }
        for name, got in samples.items()
    }
    ratio, verdict = judged(rows["runs"]["wall_ms"] / rows["typer"]["wall_ms"], 1.3,
                            at_most=True, digits=3)
    return {
        "figure": "cli", "repeats": args.repeats, "target": "ratio <= 1.3",
        "bytecode_caches": "warm (PYTHONDONTWRITEBYTECODE unset for the children)",
        "commands": rows, "wall_ms": rows["runs"]["wall_ms"],
        "baseline_wall_ms": rows["typer"]["wall_ms"], "ratio": ratio,
        "ratio_cpu": rnd(rows["runs"]["cpu_ms"] / rows["typer"]["cpu_ms"], 3),
        "over_typer_ms": rnd(rows["runs"]["wall_ms"] - rows["typer"]["wall_ms"]),
        "verdict": verdict, "import_profile": profile, "orders": orders,
    }
