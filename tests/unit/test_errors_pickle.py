"""Errors cross process boundaries (ProcessPoolExecutor, multiprocessing: they pickle what a
worker raises). Each must arrive as the class it was, with every fact it carried."""

from __future__ import annotations

import pickle

import pytest

from intloom.authoring.workflow import DefinitionError
from intloom.cli.inputs import UsageError
from intloom.client.client import HelloFailed, ServiceStarting, ServiceUnlistened
from intloom.errors import IntloomError

pytestmark = pytest.mark.timeout(30)


def _made() -> list[IntloomError]:
    defined = DefinitionError("WORKFLOW_DEFINITION_INVALID", "Workflow 'w', Step 'a': no.")
    defined.at = ("workflows/w.py", 12)
    return [
        IntloomError("CONFLICT", "Run RUN-1 has ended.", retryable=True, here="doctor's words"),
        IntloomError("NOT_FOUND"),  # the catalogue's message
        UsageError("--json and --quiet contradict each other."),
        defined,
        ServiceStarting("CLI_SERVICE_UNAVAILABLE", "The host is starting.", retryable=True),
        ServiceUnlistened("CLI_SERVICE_CLOSING", "The service is shutting down."),
        HelloFailed("The listener closed the connection.", "closed", here="said here"),
        HelloFailed("The host is stopped by a signal.", None, here="said here", paused=4321),
    ]


@pytest.mark.parametrize("sent", _made(), ids=lambda e: type(e).__name__)
def test_an_error_pickled_is_the_same_error(sent: IntloomError) -> None:
    """A UsageError could not be unpickled at all (TypeError: its __init__ takes one argument,
    and it was called with two), and a DefinitionError lost its ``at``."""
    got = pickle.loads(pickle.dumps(sent))
    assert type(got) is type(sent)
    assert got.__dict__ == sent.__dict__
    assert (got.args, str(got), repr(got)) == (sent.args, str(sent), repr(sent))
