"""What an error says when it is printed as text: its code, then its message."""

from __future__ import annotations

import subprocess
import sys

import pytest

from intloom.authoring.workflow import DefinitionError
from intloom.cli.inputs import UsageError
from intloom.errors import IntloomError

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(("error", "text"), [
    (IntloomError("NOT_FOUND", "Run RUN-1 is not known."), "NOT_FOUND: Run RUN-1 is not known."),
    (IntloomError("CLI_SERVICE_OFFLINE"),
     "CLI_SERVICE_OFFLINE: The project service is offline. Run intloom start."),
    (UsageError("--json and --quiet contradict each other."),
     "INVALID_REQUEST: --json and --quiet contradict each other."),
    (DefinitionError("WORKFLOW_DEFINITION_INVALID", "Workflow 'w': no Stage."),
     "WORKFLOW_DEFINITION_INVALID: Workflow 'w': no Stage."),
], ids=lambda v: type(v).__name__ if isinstance(v, IntloomError) else "")
def test_str_is_the_code_then_the_message(error: IntloomError, text: str) -> None:
    """A script's user often sees only str(): a traceback, a log's %s, an f-string. It gave
    the message alone, so the code the docs are keyed by was on ``.code`` only."""
    assert str(error) == text
    assert error.message == text.split(": ", 1)[1]  # the message itself is unchanged


def test_an_uncaught_error_names_its_code() -> None:
    proc = subprocess.run(
        [sys.executable, "-c",
         "from intloom import IntloomError\n"
         "raise IntloomError('NOT_FOUND', 'Run RUN-1 is not known to this host.')"],
        capture_output=True, text=True, timeout=50, check=False)
    assert proc.returncode == 1
    assert proc.stderr.rstrip().splitlines()[-1] == (
        "intloom.errors.IntloomError: NOT_FOUND: Run RUN-1 is not known to this host.")


def test_a_failed_reconnect_says_nothing_was_sent_once() -> None:
    """A host's CLI_SERVICE_CLOSING already says "Nothing was sent."; the Client's message
    around it said it again."""
    from intloom.client.client import _nothing_sent

    closing = IntloomError("CLI_SERVICE_CLOSING", "The service is shutting down. No request "
                           "was sent, so nothing was done. Nothing was sent. Run it again.")
    assert _nothing_sent(closing) == ""
    assert _nothing_sent(IntloomError("CLI_SERVICE_OFFLINE", "Run intloom start.")) == (
        " Nothing was sent.")
