"""The suite's Ctrl-C tests send SIGINT to hosts and CLIs it launches, which inherit its
SIGINT: started with SIGINT ignored (``scripts/test &`` in a script), every one of them
waited out its timeout and failed. tests/conftest.py gives SIGINT back its default."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.timeout(60)

_IGNORED_IN_A_CHILD = ("import signal; "
                       "print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)")


def test_a_process_a_test_launches_gets_ctrl_c() -> None:
    child = subprocess.run([sys.executable, "-c", _IGNORED_IN_A_CHILD],
                           capture_output=True, text=True, timeout=30)
    assert child.stdout.strip() == "False", (child.stdout, child.stderr)


def test_so_even_when_the_suite_was_started_with_sigint_ignored() -> None:
    """The test above, run by a pytest started as ``cmd &`` starts one in a script."""
    test = f"{__file__}::test_a_process_a_test_launches_gets_ctrl_c"
    inner = (f"trap '' INT; exec {shlex.quote(sys.executable)} -m pytest -q "
             f"-p no:cacheprovider -n 0 {shlex.quote(test)}")
    run = subprocess.run(["sh", "-c", inner], cwd=REPO, capture_output=True, text=True,
                         timeout=50)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
