"""The bound on what a follower may leave unread (``FollowBacklog``): the limit beyond its
history. Events are written from the publish that made them durable, so nothing waits for a
slow reader; the bound is what tells a slow one from one still reading a long history."""

from __future__ import annotations

import pytest

from intloom.host.server import FollowBacklog

pytestmark = pytest.mark.timeout(10)

LIMIT = 64 * 1024


def test_a_history_longer_than_the_limit_still_on_its_way_is_no_slow_reader() -> None:
    backlog = FollowBacklog(LIMIT)
    history = 1024 * 1024  # a long-lived Run's history: one write when the follower attaches
    backlog.sent(history, history=True)
    # The peer has read 100 KiB of it when the Run publishes again: under the limit beyond it.
    assert not backlog.too_slow(history - 100 * 1024)
    assert not backlog.too_slow(history + LIMIT)
    assert backlog.too_slow(history + LIMIT + 1)


def test_live_events_count_against_the_limit_alone() -> None:
    backlog = FollowBacklog(LIMIT)
    backlog.sent(10 * LIMIT, history=False)  # live batches add nothing to the allowance
    assert not backlog.too_slow(LIMIT)
    assert backlog.too_slow(LIMIT + 1)
