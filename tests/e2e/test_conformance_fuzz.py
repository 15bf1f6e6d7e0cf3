"""Two hundred seeded random mutations of journal files; the host never crashes over one.

Each mutation (flip, truncate, insert or zero a random range of one file under
``.intloom/runtime/``: segments, live and done snapshots, the manifest) is applied to a copy
of a crashed project's runtime directory. Every one is then opened the way a host start
opens it, in this process (the store opens, restores, and closes; ``doctor``'s preview,
``verify`` and ``inspect``'s history read it); one in twenty is also given to a real host
(``intloom start``, ``doctor``, ``stop``). Nothing may raise but a documented error code,
and the mutated file must be byte-identical afterwards: never deleted, never rewritten.

One exception, by design: ``manifest.json`` carries no checksum, so a mutation that leaves
a valid manifest (a changed timestamp, say) cannot be told from one intloom wrote, and the
next compaction replaces it like any other. A damaged (unreadable) manifest is kept.
"""

from __future__ import annotations

import collections
import random
import shutil
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from intloom.authoring.loader import LoadResult, load_workflows
from intloom.diagnostics.previews import preview_runs
from intloom.errors import IntloomError
from intloom.executor.runtime import RestoredRun, Runtime
from intloom.project import ProjectPaths, load_config
from intloom.store import Store, read_history, verify_report
from intloom.store.files import Layout
from intloom.store.snapshots import SnapshotError, read_manifest
from tests.e2e.conformance_harness import (
    FIXTURE,
    Baseline,
    build_baseline,
    project_with_runtime,
)
from tests.helpers import Project

pytestmark = pytest.mark.e2e

SEED = 20261130
MUTATIONS = 200
REAL_HOST_EVERY = 20
# What a start may fail with over damaged files (docs/format.md, docs/recovery.md).
START_CODES = frozenset({"STORAGE_ERROR", "JOURNAL_CORRUPT", "JOURNAL_INCOMPATIBLE"})


@dataclass(frozen=True)
class Mutation:
    path: str  # relative to the runtime directory
    op: str  # flip | zero | truncate | cut | insert
    at: int
    size: int
    noise: bytes  # xor masks for flip, the bytes for insert

    def __str__(self) -> str:
        return f"{self.op} {self.size} byte(s) of {self.path} at {self.at}"

    def apply(self, runtime: Path) -> bytes:
        target = runtime / self.path
        data = bytearray(target.read_bytes())
        at, size = self.at, self.size
        if self.op == "flip":
            for i, mask in zip(range(at, min(at + size, len(data))), self.noise, strict=False):
                data[i] ^= mask
        elif self.op == "zero":
            if all(b == 0 for b in data[at:at + size]):
                data[at] ^= 0xFF  # zeroing zeros changes nothing: make it a mutation
            else:
                data[at:at + size] = bytes(len(data[at:at + size]))
        elif self.op == "truncate":
            del data[at:]
        elif self.op == "cut":  # a range removed from the middle
            del data[at:at + size]
        else:  # insert
            data[at:at] = self.noise
        target.write_bytes(bytes(data))
        return bytes(data)


def mutations(runtime: Path, count: int, seed: int = SEED) -> list[Mutation]:
    """``count`` seeded mutations of the files under ``runtime`` (every kind of file)."""
    rng = random.Random(seed)
    files = sorted(str(p.relative_to(runtime)) for p in runtime.rglob("*") if p.is_file())
    assert {"manifest.json"} < set(files) and any(f.startswith("snap/done/") for f in files)
    out: list[Mutation] = []
    for _ in range(count):
        path = rng.choice(files)
        length = (runtime / path).stat().st_size
        op = rng.choice(["flip", "flip", "zero", "truncate", "cut", "insert"])
        at = rng.randrange(1 if op in ("truncate", "cut") else 0, length)
        size = rng.choice([1, 1, 2, 4, 16, 64, 512])
        noise = bytes(rng.randrange(1, 256) for _ in range(size))
        out.append(Mutation(path, op, at, size, noise))
    return out


def valid_manifest(runtime: Path) -> bool:
    try:
        read_manifest(Layout(runtime))
    except SnapshotError:
        return False
    return True


def boot_in_process(root: Path, workflows: LoadResult) -> str:
    """What ``intloom start`` does with the runtime directory: open, restore, close."""
    paths = ProjectPaths(root)
    try:
        store = Store.open(paths.runtime, instance_id=str(uuid.uuid4()), package_version="0.1.0")
    except IntloomError as exc:
        return exc.code
    try:
        restored = [RestoredRun(j.run_id, j.state, j.problem) for j in store.restored.runs]
        Runtime(workflows.workflows, store, package_version="0.1.0").restore(restored)
    finally:
        store.close_blocking()
    return "started"


def read_everything(root: Path, workflows: LoadResult) -> None:
    """What doctor, verify and inspect read: none may raise over damaged bytes."""
    paths = ProjectPaths(root)
    preview_runs(paths, workflows, host_running=False)
    report = verify_report(paths.runtime)
    for journal in report.runs:
        read_history(paths.runtime, journal.run_id)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    return build_baseline(tmp_path_factory.mktemp("fuzz-baseline"))


def check(runtime: Path, mutation: Mutation, mutated: bytes, replaceable: bool,
          outcome: str) -> list[str]:
    problems: list[str] = []
    if outcome not in START_CODES | {"started"}:
        problems.append(f"{mutation}: start ended with {outcome}")
    target = runtime / mutation.path
    if not replaceable and (not target.exists() or target.read_bytes() != mutated):
        problems.append(f"{mutation}: the mutated file was deleted or rewritten")
    return problems


def test_two_hundred_random_mutations_never_crash_a_start_or_lose_a_file(
    baseline: Baseline, tmp_path: Path
) -> None:
    workflows = load_workflows(FIXTURE, load_config(FIXTURE))
    assert not workflows.problems
    outcomes: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    for i, mutation in enumerate(mutations(baseline.runtime, MUTATIONS)):
        root = tmp_path / f"m{i}"
        (root / ".intloom").mkdir(parents=True, mode=0o700)
        runtime = root / ".intloom" / "runtime"
        shutil.copytree(baseline.runtime, runtime)
        mutated = mutation.apply(runtime)
        replaceable = mutation.path == "manifest.json" and valid_manifest(runtime)
        try:
            read_everything(root, workflows)
            outcome = boot_in_process(root, workflows)
        except Exception:
            failures.append(f"#{i} {mutation}: {traceback.format_exc(limit=4)}")
            continue
        outcomes[outcome] += 1
        outcomes["valid manifest replaced"] += replaceable
        failures += [f"#{i} {p}" for p in check(runtime, mutation, mutated, replaceable,
                                                outcome)]
        shutil.rmtree(root)
    print(f"{MUTATIONS} mutations (seed {SEED}), opened as a start opens them: {dict(outcomes)}")
    assert not failures, "\n".join(failures)
    assert outcomes["started"] > MUTATIONS // 2  # most damage is contained, not fatal


def test_a_real_host_starts_over_a_sample_of_them(baseline: Baseline, tmp_path: Path) -> None:
    outcomes: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    sample = [(i, mutation) for i, mutation in enumerate(mutations(baseline.runtime, MUTATIONS))
              if not i % REAL_HOST_EVERY]
    # Each mutation is its own project, host and port: two go through their hosts at once
    # (two cores); the checks then run here, in order.
    with ThreadPoolExecutor(2) as pool:
        tried = list(pool.map(lambda case: _through_a_real_host(tmp_path, baseline, *case),
                              sample))
    for (i, mutation), (runtime, mutated, replaceable, outcome) in zip(sample, tried,
                                                                       strict=True):
        outcomes[outcome] += 1
        failures += [f"#{i} {p}" for p in check(runtime, mutation, mutated, replaceable,
                                                outcome)]
    print(f"{sum(outcomes.values())} of the mutations through a real host: {dict(outcomes)}")
    assert not failures, "\n".join(failures)


def _through_a_real_host(tmp_path: Path, baseline: Baseline, i: int, mutation: Mutation
                         ) -> tuple[Path, bytes, bool, str]:
    """Mutation ``i`` applied to a fresh project, then start, doctor and stop (its host
    reaped): the project's runtime, what the mutation changed, and the outcome."""
    project = project_with_runtime(tmp_path, f"m{i}", baseline.runtime)
    runtime = project.state / "runtime"
    try:
        mutated = mutation.apply(runtime)
        replaceable = mutation.path == "manifest.json" and valid_manifest(runtime)
        outcome = run_real_host(project)
    finally:
        project.track_host()
        project.reap()
    return runtime, mutated, replaceable, outcome


def run_real_host(project: Project) -> str:
    """``intloom start``, ``doctor``, ``stop``: a known code, never a traceback or 70."""
    started = project.cli("start", "--json")
    assert "Traceback" not in started.stdout + started.stderr
    doctor = project.cli("doctor", "--json")
    assert doctor.code in (0, 3, 4), (doctor.code, doctor.stdout, doctor.stderr)
    if started.code != 0:
        code = started.json["error"]["code"]
        return str(code)
    stopped = project.cli("stop", "--json")
    assert stopped.code == 0, stopped.stdout
    return "started"
