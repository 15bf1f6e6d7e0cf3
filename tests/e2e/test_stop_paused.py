"""``stop --timeout`` is a hard deadline, and its timeout message is true: against a real
host paused by SIGSTOP (it accepts connections in the kernel but answers nothing), the
whole command ends within the timeout, and it says the stop request was *not* sent,
because the host never completed the hello. The host is resumed (SIGCONT) in ``finally``,
answers again, and is stopped and reaped."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from tests.helpers import Project, eventually, ok, pid_alive

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_stop_of_a_paused_host_says_so_at_once_and_sends_nothing(
    project: Project,
) -> None:
    """A host paused by SIGSTOP: stop waited out its hello for the whole timeout (10 s by
    default), then said so in a timeout whose first words blamed the cleanup. It reads the
    pause first and says it at once, with the way to resume or stop the host; nothing is
    sent, so the host, resumed, still serves."""
    assert project.cli("start").code == 0
    pid = project.host_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        # Stopped by then, as a host a person paused is (one paused during the stop's hello
        # is waited for as long as --timeout allows).
        eventually(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED,
                   timeout=10, what="the host to be stopped by the signal")
        began = time.monotonic()
        stop = project.cli("stop", "--json")
        took = time.monotonic() - began
    finally:
        os.kill(pid, signal.SIGCONT)
    assert stop.code != 0, stop.stdout
    error = stop.json["error"]
    assert error["code"] == "CLI_SERVICE_UNAVAILABLE", error
    assert error["message"].startswith(
        f"The project's host (pid {pid}) is alive but stopped by a signal"), error["message"]
    assert "nothing was sent" in error["message"], error["message"]
    assert f"kill -CONT {pid}" in error["message"], error["message"]
    # Not the 10 s of the default timeout (generously bounded on a shared 2-core machine).
    assert took < 5, took

    # Resumed, the host never got a stop request: it still serves, and stops when asked.
    assert ok(project.cli("status", "--json"))["service"]["pid"] == pid
    assert ok(project.cli("stop", "--json"))["stopped"] is True
    eventually(lambda: not pid_alive(pid), timeout=15, what=f"host {pid} to exit")


def test_a_client_whose_retry_met_a_paused_host_serves_again_once_it_is_resumed(
    project: Project,
) -> None:
    """A read timed out on a paused host (SIGSTOP) and was sent again on the same Client, as
    its message says, while the host was still paused: connecting again failed, and the
    Client "stays closed" for good, though that same host served again after kill -CONT
    and nothing was in flight."""
    from intloom.client import Client
    from intloom.errors import IntloomError

    assert project.cli("start").code == 0
    pid = project.host_pid()
    with Client.connect(project.root, timeout=2, request_timeout=1) as client:
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(IntloomError) as first:
                client.runs()
            assert first.value.code == "PROJECT_REQUEST_FAILED" and first.value.retryable
            with pytest.raises(IntloomError) as again:
                client.runs()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert again.value.code == "PROJECT_CONNECTION_FAILED", again.value
        assert again.value.retryable is True, again.value
        assert "connects again at its next request" in again.value.message, again.value
        # The host, resumed, first reads the two connections it dropped: room for that.
        client.request_timeout = 30
        assert client.runs() == []  # the same Client, the same host instance
    assert ok(project.cli("stop", "--json"))["stopped"] is True
    eventually(lambda: not pid_alive(pid), timeout=15, what=f"host {pid} to exit")
