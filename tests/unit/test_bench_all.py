"""The plumbing of ``scripts/bench``: ``all`` hands its own options to every figure it runs,
and its report names what was measured where; the peers' interpreter is checked once. The
figures here are stand-ins that record the options they were given (test_bench_smoke runs
the real ones)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from scripts.bench_common import filesystem
from scripts.bench_report import bench_all
from scripts.benchmarks import build_parser, parser_defaults


def _all_args(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(["all", *argv])
    assert args.figure == "all"
    return args


def _recording(seen: dict[str, argparse.Namespace]) -> dict[str, Any]:
    def figure(name: str) -> Any:
        def run(options: argparse.Namespace) -> dict[str, Any]:
            seen[name] = options
            return {"figure": name}
        return run
    return {name: figure(name) for name in ("first", "second")}


def _defaults(name: str) -> argparse.Namespace:
    return parser_defaults("memory")  # a real figure's defaults: its --dir is None


@pytest.mark.timeout(30)
def test_all_runs_every_figure_in_the_directory_it_was_given(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = tmp_path / "out"
    seen: dict[str, argparse.Namespace] = {}
    args = _all_args(["--dir", str(scratch), "--out", str(out), "--no-chart"])
    report = bench_all(args, _recording(seen), _defaults)
    assert {name: options.dir for name, options in seen.items()} == {
        "first": str(scratch), "second": str(scratch)}
    # The report's "scratch files on ..." names the file system of that directory.
    assert report["machine"]["filesystem"] == filesystem(scratch)
    written = json.loads((out / "performance.json").read_text())
    assert written["machine"]["filesystem"] == filesystem(scratch)
    assert (out / "performance.md").read_text().startswith("# Performance")


@pytest.mark.timeout(30)
def test_all_without_dir_leaves_each_figure_its_default(tmp_path: Path) -> None:
    seen: dict[str, argparse.Namespace] = {}
    args = _all_args(["--out", str(tmp_path), "--no-chart"])
    bench_all(args, _recording(seen), _defaults)
    assert [options.dir for options in seen.values()] == [None, None]


@pytest.mark.timeout(30)
def test_all_refuses_to_skip_a_figure_it_does_not_have(tmp_path: Path) -> None:
    seen: dict[str, argparse.Namespace] = {}
    args = _all_args(["--skip", "first,secnod", "--out", str(tmp_path), "--no-chart"])
    with pytest.raises(SystemExit) as refused:
        bench_all(args, _recording(seen), _defaults)
    assert "unknown figure(s) secnod" in str(refused.value)
    assert "The figures are: first, second." in str(refused.value)
    assert seen == {} and not (tmp_path / "performance.md").exists()  # nothing ran


@pytest.mark.timeout(30)
def test_the_peers_interpreter_is_probed_once_per_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each peer child used to import DBOS and LangGraph once more first (~1.5 s each, 15
    times in a default ``peers`` figure). Here the peers' interpreter is a stand-in that
    counts how often it is started."""
    from scripts import bench_peers

    started = tmp_path / "started"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho probe >> '{started}'\n")
    python.chmod(0o755)
    monkeypatch.setattr(bench_peers, "PEER_PY", python)
    assert [bench_peers.ensure_peer_venv() for _ in range(3)] == [python] * 3
    assert started.read_text().splitlines() == ["probe"]


@pytest.mark.parametrize("followers", [2, 0])
def test_events_refuses_more_followers_than_runs_before_starting_a_host(
    tmp_path: Path, followers: int
) -> None:
    from scripts.bench_events import bench_events

    args = build_parser().parse_args(["events", "--runs", "1", "--followers", str(followers),
                                      "--dir", str(tmp_path)])
    with pytest.raises(SystemExit) as refused:
        bench_events(args)
    assert f"--followers {followers} must be between 1 and --runs (1)" in str(refused.value)
    assert list(tmp_path.iterdir()) == []  # no project, no host


@pytest.mark.timeout(30)
def test_a_quick_run_without_out_leaves_the_measured_report_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``all --quick`` wrote its smoke-sized figures over docs/performance.md by default."""
    import tempfile

    from scripts.bench_common import REPO

    docs = {name: (REPO / "docs" / name).read_bytes()
            for name in ("performance.md", "performance.json")}
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    bench_all(_all_args(["--quick", "--no-chart"]), {}, _defaults)
    assert {name: (REPO / "docs" / name).read_bytes() for name in docs} == docs
    [written] = tmp_path.glob("bench-quick-*/performance.md")
    assert written.read_text().startswith("# Performance")


def _one_fails(seen: dict[str, argparse.Namespace]) -> dict[str, Any]:
    def broken(options: argparse.Namespace) -> dict[str, Any]:
        seen["broken"] = options
        raise RuntimeError("intloom start exited 1: the host did not answer")

    def fine(options: argparse.Namespace) -> dict[str, Any]:
        seen["fine"] = options
        return {"figure": "memory", "runs": 3, "rss_mib": 30.0, "baseline_rss_mib": 20.0,
                "idle_rss_mib": 20.0, "live_rss_mib": 30.0, "restored_rss_mib": 29.0,
                "kib_per_run": 1.0, "ratio": 1.5, "verdict": "met"}

    return {"restore": broken, "memory": fine}


@pytest.mark.timeout(30)
def test_a_figure_that_raises_is_reported_as_failed_and_the_others_still_run(
    tmp_path: Path,
) -> None:
    """A figure that raised ended `bench all`: no figure after it ran, nothing was written."""
    seen: dict[str, argparse.Namespace] = {}
    args = _all_args(["--out", str(tmp_path), "--no-chart"])
    report = bench_all(args, _one_fails(seen), _defaults)
    assert set(seen) == {"broken", "fine"}  # the figure after the failed one ran
    assert report["failed"] == ["restore"]
    written = json.loads((tmp_path / "performance.json").read_text())
    failed = written["figures"]["restore"]
    assert failed["verdict"] == "error"
    assert failed["error"] == "RuntimeError: intloom start exited 1: the host did not answer"
    assert "raise RuntimeError" in failed["traceback"]
    assert written["figures"]["memory"]["verdict"] == "met"
    assert written["failed"] == ["restore"]
    text = (tmp_path / "performance.md").read_text()
    assert ("| `restore` | failed: RuntimeError: intloom start exited 1: the host did not "
            "answer | — | — | ≤ 2× | error |") in text
    assert "- **restore**: the figure failed" in text
    assert "Every target was met in this run." not in text
    assert "| host RSS, 3 waiting Runs | 30 MiB |" in text  # the other figure is reported
    from scripts.bench_chart import target_bars

    assert [bar[0] for bar in target_bars(written["figures"])] == [
        "RSS: 3 Runs vs idle (≤ 2×)"]  # the chart draws what was measured, skips the error


@pytest.mark.timeout(30)
def test_a_failed_peers_or_crash_section_says_it_failed_not_that_it_was_not_measured(
    tmp_path: Path,
) -> None:
    """Their sections said "Not measured in this run" of a figure that ran and failed."""
    figures = _one_fails({})
    figures = {"peers": figures["restore"], "crash": figures["restore"],
               "memory": figures["memory"]}
    args = _all_args(["--out", str(tmp_path), "--no-chart"])
    report = bench_all(args, figures, _defaults)
    assert report["failed"] == ["peers", "crash"]
    text = (tmp_path / "performance.md").read_text()
    said = ("_Failed in this run: RuntimeError: intloom start exited 1: the host did not "
            "answer (see the summary above)._")
    assert text.count(said) == 2, text
    assert "_Not measured in this run._" not in text


@pytest.mark.timeout(30)
def test_bench_all_exits_non_zero_naming_the_figure_that_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from scripts import benchmarks

    seen: dict[str, argparse.Namespace] = {}
    monkeypatch.setattr(benchmarks, "FIGURES", _one_fails(seen))
    with pytest.raises(SystemExit) as ended:
        benchmarks.main(["all", "--out", str(tmp_path), "--no-chart"])
    assert str(ended.value).startswith("scripts/bench all: 1 figure(s) failed: restore;")
    assert (tmp_path / "performance.md").exists()


def _gauge(monkeypatch: pytest.MonkeyPatch, ms: float, cpu: str = "CPU A") -> None:
    """The CPU gauge reads ``ms`` on a CPU of model ``cpu``: the VM at that speed, without
    being it."""
    from scripts import bench_report

    monkeypatch.setattr(bench_report, "cpu_calibration_ms", lambda: ms)
    monkeypatch.setattr(bench_report, "cpu_model", lambda: cpu)


def _quoted(out: Path, gauge: list[float], reference: dict[str, Any] | None = None,
            cpu: str | None = "CPU A") -> bytes:
    report: dict[str, Any] = {"when": "2026-12-05 08:38 UTC", "cpu_calibration_ms": gauge}
    if cpu is not None:
        report["machine"] = {"cpu": cpu}
    if reference is not None:
        report["cpu_reference"] = reference
    data = json.dumps(report).encode()
    (out / "performance.json").write_bytes(data)
    (out / "performance.md").write_bytes(b"# Performance\nthe quoted run\n")
    return data


@pytest.mark.timeout(30)
def test_all_refuses_to_replace_the_report_when_the_cpu_is_much_slower(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A throttled VM (gauge 35-37 ms against 14-15) replaced the quoted figures with ones
    whose CPU-bound ratios were misstated, and nothing in the report said so."""
    data = _quoted(tmp_path, [14.7, 14.1])
    _gauge(monkeypatch, 36.7)
    seen: dict[str, argparse.Namespace] = {}
    with pytest.raises(SystemExit) as refused:
        bench_all(_all_args(["--out", str(tmp_path), "--no-chart"]), _recording(seen),
                  _defaults)
    said = str(refused.value)
    assert "CPU (CPU A) is 2.6x slower than the fastest run on record on it" in said
    assert "(cpu_calibration_ms 36.7 now, 14.1 on 2026-12-05 08:38 UTC)" in said
    assert "--slow-cpu-ok" in said and "--out DIR" in said
    assert seen == {}  # nothing ran
    assert (tmp_path / "performance.json").read_bytes() == data
    assert (tmp_path / "performance.md").read_bytes() == b"# Performance\nthe quoted run\n"


@pytest.mark.timeout(30)
def test_slow_cpu_ok_replaces_it_saying_so_and_keeps_the_fastest_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _quoted(tmp_path, [14.7, 14.1])
    _gauge(monkeypatch, 36.7)
    seen: dict[str, argparse.Namespace] = {}
    report = bench_all(_all_args(["--out", str(tmp_path), "--no-chart", "--slow-cpu-ok"]),
                       _recording(seen), _defaults)
    assert set(seen) == {"first", "second"}
    assert report["cpu_calibration_ms"] == [36.7, 36.7]
    # The next run is held to the fast machine, not to this slow one.
    assert report["cpu_reference"] == {"ms": 14.1, "when": "2026-12-05 08:38 UTC",
                                       "cpu": "CPU A"}
    text = (tmp_path / "performance.md").read_text()
    assert "**Made in a slow spell of the VM** (`--slow-cpu-ok`): its CPU gauge read 2.6×" in text
    _gauge(monkeypatch, 30.0)  # still slow against 14.1, though faster than the last run
    with pytest.raises(SystemExit, match=r"2\.1x slower"):
        bench_all(_all_args(["--out", str(tmp_path), "--no-chart"]), _recording({}), _defaults)


@pytest.mark.timeout(30)
def test_a_run_at_the_usual_speed_replaces_it_without_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _quoted(tmp_path, [36.7, 37.0], reference={"ms": 14.1, "when": "2026-12-05 08:38 UTC"})
    _gauge(monkeypatch, 13.9)
    report = bench_all(_all_args(["--out", str(tmp_path), "--no-chart"]), _recording({}),
                       _defaults)
    assert report["cpu_reference"] == {"ms": 13.9, "when": report["when"],
                                       "cpu": "CPU A"}  # a new fastest
    assert "Made in a slow spell" not in (tmp_path / "performance.md").read_text()


@pytest.mark.timeout(30)
def test_a_quick_run_is_not_held_to_the_gauge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A smoke run writes its own report elsewhere: a slow VM does not stop it."""
    _quoted(tmp_path, [14.1, 14.1])
    _gauge(monkeypatch, 40.0)
    report = bench_all(_all_args(["--quick", "--out", str(tmp_path), "--no-chart"]), {},
                       _defaults)
    assert report["quick"] and report["cpu_calibration_ms"] == [40.0, 40.0]
    assert json.loads((tmp_path / "performance.json").read_text())["quick"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("gauge", [14.1, "fast", None, {"ms": 14.1}])
def test_a_report_whose_gauge_is_not_a_list_gives_no_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gauge: Any) -> None:
    """A report with a malformed gauge (hand-edited) made ``all`` raise TypeError before it
    ran anything; it is now read as one with no gauge on record."""
    from scripts.bench_report import cpu_references

    (tmp_path / "performance.json").write_text(json.dumps({"cpu_calibration_ms": gauge}))
    assert cpu_references(tmp_path / "performance.json") == {}
    _gauge(monkeypatch, 36.7)
    report = bench_all(_all_args(["--out", str(tmp_path), "--no-chart"]), _recording({}),
                       _defaults)
    assert report["cpu_reference"]["ms"] == 36.7


@pytest.mark.timeout(30)
def test_a_record_made_on_another_cpu_model_does_not_hold_a_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The VM moved from an Intel Xeon (gauge 14-15 ms) to an AMD EPYC (20-36 ms): every run
    there was refused as a slow spell, though the gauge only measured another CPU. Each
    model is held to its own record, and the other's is kept for when it comes back."""
    _quoted(tmp_path, [14.7, 14.1], cpu="Intel(R) Xeon(R) Processor")
    _gauge(monkeypatch, 23.0, cpu="AMD EPYC")  # 1.6x the Intel's record
    report = bench_all(_all_args(["--out", str(tmp_path), "--no-chart"]), _recording({}),
                       _defaults)
    assert report["cpu_reference"] == {"ms": 23.0, "when": report["when"], "cpu": "AMD EPYC"}
    assert report["cpu_references"] == {
        "Intel(R) Xeon(R) Processor": {"ms": 14.1, "when": "2026-12-05 08:38 UTC"},
        "AMD EPYC": {"ms": 23.0, "when": report["when"]},
    }
    assert "Made in a slow spell" not in (tmp_path / "performance.md").read_text()
    # Each model is still held to its own record.
    _gauge(monkeypatch, 36.0, cpu="AMD EPYC")
    with pytest.raises(SystemExit, match=r"\(AMD EPYC\) is 1\.6x slower.* 23 on"):
        bench_all(_all_args(["--out", str(tmp_path), "--no-chart"]), _recording({}), _defaults)
    _gauge(monkeypatch, 30.0, cpu="Intel(R) Xeon(R) Processor")
    with pytest.raises(SystemExit, match=r"Processor\) is 2\.1x slower.* 14\.1 on 2026-12-05"):
        bench_all(_all_args(["--out", str(tmp_path), "--no-chart"]), _recording({}), _defaults)


@pytest.mark.timeout(30)
def test_a_record_of_no_known_cpu_model_holds_every_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A report with no ``machine.cpu`` cannot say which model its gauge was read on: it
    holds any, rather than none (a slow spell is never waved through for want of a name)."""
    _quoted(tmp_path, [14.7, 14.1], cpu=None)
    _gauge(monkeypatch, 36.7, cpu="AMD EPYC")
    with pytest.raises(SystemExit, match=r"2\.6x slower"):
        bench_all(_all_args(["--out", str(tmp_path), "--no-chart"]), _recording({}), _defaults)
