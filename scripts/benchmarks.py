"""``scripts/bench FIGURE [options]``: one sub-command per figure, each printing one JSON object.

Every figure but ``events`` (an absolute p99) and ``crash`` (counts) is compared against a
baseline measured in the same run, on the same disk -- never a hard-coded number.
``scripts/bench all`` runs every figure and regenerates ``docs/performance.md`` and
``docs/performance.png``. A figure that raises is reported with verdict "error" and its
error, the others still run and are written, and ``all`` then exits 1 naming it. See
docs/performance.md for the method.

    steps        µs per durable Step (1 Run) vs raw write+fdatasync of the same bytes
    concurrency  aggregate durable Steps/s, 64 concurrent Runs vs 1 Run
    peers        µs per Step: intloom vs DBOS and LangGraph (in .bench-venv) vs the floor
    restart      `intloom start` to ready: 100,000 journal records vs 1,000
    restore      `intloom start` to ready: 1,000 unfinished Runs vs 0
    cli          `intloom runs --json` against a live host vs `python -c "import typer"`
    memory       host resident memory: 1,000 waiting Runs vs an idle host
    events       latency of an event reaching an attached client, 64 busy Runs
    crash        the in-flight effect after SIGKILL: intloom vs DBOS vs LangGraph
    all          every figure, then docs/performance.md and its chart
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from scripts.bench_common import SLOW_CPU, emit


def _steps(a: argparse.Namespace) -> dict[str, Any]:
    from scripts.bench_steps import bench_steps

    return bench_steps(a)


def _concurrency(a: argparse.Namespace) -> dict[str, Any]:
    from scripts.bench_steps import bench_concurrency

    return bench_concurrency(a)


def _peers(a: argparse.Namespace) -> dict[str, Any]:
    from scripts.bench_peers import bench_peers

    return bench_peers(a)


def _restart(a: argparse.Namespace) -> dict[str, Any]:
    from scripts.bench_host import bench_restart

    return bench_restart(a)


def _restore(a: argparse.Namespace) -> dict[str, Any]:
    from scripts.bench_host import bench_restore

    return bench_restore(a)


def _cli(a: argparse.Namespace) -> dict[str, Any]:
    from scripts.bench_cli import bench_cli

    return bench_cli(a)


def _memory(a: argparse.Namespace) -> dict[str, Any]:
    from scripts.bench_host import bench_memory

    return bench_memory(a)


def _events(a: argparse.Namespace) -> dict[str, Any]:
    from scripts.bench_events import bench_events

    return bench_events(a)


def _crash(a: argparse.Namespace) -> dict[str, Any]:
    from scripts.bench_crash import bench_crash

    return bench_crash(a)


def _all(a: argparse.Namespace) -> dict[str, Any]:
    from scripts.bench_report import bench_all

    return bench_all(a, FIGURES, parser_defaults)


FIGURES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "steps": _steps,
    "concurrency": _concurrency,
    "peers": _peers,
    "restart": _restart,
    "restore": _restore,
    "cli": _cli,
    "memory": _memory,
    "events": _events,
    "crash": _crash,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scripts/bench", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="figure", required=True, metavar="FIGURE")

    def add(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("--dir", default=None, help="where scratch files go (default: $TMPDIR)")
        return p

    p = add("steps", "µs per durable Step vs raw append+fdatasync of the same bytes")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=8, help="pairs of (Run, floor chunk)")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--kind", choices=["async", "sync", "both"], default="both")

    p = add("concurrency", "aggregate Steps/s, N concurrent Runs vs 1 Run")
    p.add_argument("--runs", type=int, default=64)
    p.add_argument("--steps", type=int, default=300, help="Steps per concurrent Run")
    p.add_argument("--solo-steps", type=int, default=3000, help="Steps of the lone Run")
    p.add_argument("--repeats", type=int, default=4,
                   help="1-Run measurements, each beside one of N Runs created together and "
                   "one of N created one after another")
    p.add_argument("--kind", choices=["async", "sync", "both"], default="both")

    p = add("peers", "µs per Step: intloom vs DBOS vs LangGraph (own venv) vs the floor")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--only", default=None,
                   help="comma list of variants (default: all); see bench_peers.VARIANTS")

    p = add("restart", "`intloom start` to ready: a Run with many journal records vs few")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--baseline-records", type=int, default=1_000)
    p.add_argument("--repeats", type=int, default=5)

    p = add("restore", "`intloom start` to ready: N unfinished Runs vs 0")
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=5)

    p = add("cli", "`intloom runs --json` vs `python -c 'import typer'`")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--runs", type=int, default=5, help="Runs the live host holds")

    p = add("memory", "host RSS: N waiting Runs vs an idle host")
    p.add_argument("--runs", type=int, default=1000)

    p = add("events", "an event reaching an attached client while N Runs are busy")
    p.add_argument("--runs", type=int, default=64)
    p.add_argument("--followers", type=int, default=4)
    p.add_argument("--seconds", type=float, default=8.0)

    p = add("crash", "SIGKILL during an effect: intloom vs DBOS vs LangGraph")
    p.add_argument("--only", default=None, help="comma list of intloom,dbos,langgraph")

    p = add("all", "every figure; writes docs/performance.md and docs/performance.png")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--out", default=None,
                   help="directory for the report (default: docs/; with --quick a new temp dir)")
    p.add_argument("--skip", default="", help="comma list of figures to leave out")
    p.add_argument("--no-chart", action="store_true", help="leave the PNG out (no matplotlib)")
    p.add_argument("--slow-cpu-ok", action="store_true",
                   help=f"replace the report even when the CPU gauge is over {SLOW_CPU}x "
                        "slower than the fastest run on record (a throttled VM)")
    return parser


def parser_defaults(figure: str) -> argparse.Namespace:
    """The default options of one figure, for ``all``."""
    return build_parser().parse_args([figure])


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.figure == "all":
        report = _all(args)
        if report["failed"]:  # the report is written; the exit status says it is incomplete
            raise SystemExit(f"scripts/bench all: {len(report['failed'])} figure(s) failed: "
                             f"{', '.join(report['failed'])}; each one's error is in "
                             "performance.json and performance.md, the other figures ran.")
        return
    emit(FIGURES[args.figure](args))


if __name__ == "__main__":
    main()
