"""Record time stamps: the cached formatting must equal datetime's, at every millisecond."""

from __future__ import annotations

from datetime import UTC, datetime
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intloom.executor import clock

pytestmark = pytest.mark.timeout(60)


def _reference(ns: int) -> str:
    stamp = datetime.fromtimestamp(ns // 1_000_000 / 1000, tz=UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@settings(max_examples=300, deadline=None)
@given(instants=st.lists(st.integers(0, 4_102_444_800 * 10**9), min_size=1, max_size=5))
def test_now_formats_every_instant_like_isoformat(instants: list[int]) -> None:
    for ns in instants + instants:  # the second pass is answered from the cache
        with mock.patch("intloom.executor.clock.time.time_ns", return_value=ns):
            assert clock.now() == _reference(ns)


def test_the_cache_never_serves_another_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    base = 1_796_000_000_123_000_000  # 2026-12-01T...: .123
    for offset_ns, milli in ((0, "123"), (999_999, "123"), (1_000_000, "124"), (0, "123")):
        monkeypatch.setattr("intloom.executor.clock.time.time_ns",
                            lambda v=base + offset_ns: v)
        assert clock.now().endswith(f".{milli}Z")


def test_the_cached_second_never_serves_another_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    base = 1_796_000_000_000_000_000  # a whole second
    for offset_ns in (999_000_000, 1_000_000_000, 999_000_000, 61_000_000_000):
        monkeypatch.setattr("intloom.executor.clock.time.time_ns",
                            lambda v=base + offset_ns: v)
        assert clock.now() == _reference(base + offset_ns)


def test_a_run_ids_stamp_is_its_created_at() -> None:
    """The id's stamp was read from the clock apart from the Run's createdAt: it could be a
    millisecond later than the Run said it was created."""
    at = "2026-12-04T19:06:28.232Z"
    run_id = clock.run_id(at)
    assert run_id.startswith("RUN-20261204T190628232Z-") and len(run_id) == 45, run_id
    assert clock.run_id().startswith("RUN-2")  # the clock's now, in the same shape
