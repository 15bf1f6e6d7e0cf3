"""Errors with stable codes.

Every error a user can see carries a stable ``code``, a ``message`` built from facts, and a
``retryable`` flag. The projection that crosses the socket or reaches the terminal is always
the flat :class:`ErrorView` -- never a cause, a stack or a secret.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

__all__ = [
    "CATALOGUE", "MAX_MESSAGE", "NO_CONNECTION_FIX", "STARTING", "ErrorView", "IntloomError",
    "a_an", "as_call",
    "carried", "clip", "error_view", "message_of", "quoted", "quoting_bounded",
    "starting_message",
]

# The most characters of an error message a Run keeps (its lastError, an effect's failure):
# user code's exception text, an Agent's failure message, is cut there, with a marker
# saying how much was cut (docs/authoring.md). Without it one Step that raised a 5 MB
# message made every Run view and `intloom runs` reply carry it.
MAX_MESSAGE: Final = 4096


def as_call(exc: BaseException) -> str:
    """``SystemExit(2)``: how user code's exit or interrupt is named (``SystemExit: 2`` would
    read as an error message, and a bare ``0`` says nothing)."""
    name = type(exc).__name__
    return f"{name}({', '.join(_repr_of(arg) for arg in exc.args)})" if exc.args else name


def _repr_of(value: object) -> str:
    """``repr(value)`` of what user code passed (``sys.exit(obj)``). Its ``__repr__`` is user
    code too: one that raised escaped from the error handling naming the exit, which left a
    sync Step's Run running for ever and failed an async one's CLI_INTERNAL_ERROR."""
    try:
        return repr(value)
    except Exception as inner:
        return f"<{type(value).__name__} object: its __repr__ raised {type(inner).__name__}>"


def message_of(exc: BaseException) -> str:
    """``str(exc)`` of what user code raised. Its ``__str__`` is user code too: one that
    raises (a library's exception missing what its message is built from) is named here,
    rather than escaping from the error handling that reports it."""
    try:
        text = str(exc)
    except Exception as inner:
        return (f"(its message cannot be shown: its __str__ raised "
                f"{type(inner).__name__})")
    # A lone surrogate (os.fsdecode of a name that is not UTF-8): neither the journal nor
    # the socket can carry it, and the Run's failure record itself failed to encode,
    # leaving the Run "running" for ever. Kept as its escape, as text mode shows it.
    return carried(text)


def carried(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate kept as its escape (``\\udcff``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


# How a host in its start-up is described, by status and doctor and in the refusal a request
# gets meanwhile; renderers recognise a diagnosis by this beginning.
STARTING: Final = "The service is starting"


# How a diagnosis of a host on its way out begins (owners.STOPPING, unlistened_message).
SHUTTING_DOWN: Final = "The service is shutting down"


def starting_message(pid: int, since: str, then: str) -> str:
    """A host in its start-up (pid ``pid``, started at ``since``), then what to do."""
    return (f"{STARTING} (pid {pid}, since {since}): it holds the project's lock and is "
            "loading its Workflows and restoring its Runs; it serves once it writes "
            f"service.json. {then}")


class LoadInterrupted(BaseException):
    """The process's own signal handling ending an import of Workflow code (the host's stop
    signal, a CLI's Ctrl-C). Every other BaseException that code raises -- an exit, an
    interrupt, a class of its own (``pytest.skip`` at module level raises one) -- is its
    failure, contained; this one passes."""


# How the host refuses a blank intent; flow's look before its prompt (cli/commands/runs.py)
# tells that refusal, which follows the Workflow's look-up, from any other.
BLANK_INTENT: Final = "The intent is blank"


def unlistened_message(pid: int, port: int, then: str) -> str:
    """A host that closed its listener on its way out (pid ``pid``, port ``port``): it saves
    its Runs, then exits; then what to do. status, doctor and recover say it, and so does a
    command refused on its way in: one wording, however each goes on."""
    return (f"{SHUTTING_DOWN}: the host (pid {pid}) has stopped listening on "
            f"127.0.0.1:{port} and is saving its Runs, then exits. {then}")


# Names starting with a vowel letter said as "you" ("a UUID", "a UserDict"): the others
# starting with a, e, i, o or u take "an" ("an int", "an object", "an Update").
_YOU: Final = ("uni", "use", "usa", "usu", "uti", "uu", "ura", "ure", "uri", "ubi")


def a_an(name: str) -> str:
    """``name`` (a type's, as messages show it) with its indefinite article: "an int", "a
    Notes". Built from a type name, a fixed "a" read "a int", "a object"."""
    lower = name.lower()
    vowel = lower[:1] in ("a", "e", "i", "o", "u") and not lower.startswith(_YOU)
    return f"{'an' if vowel else 'a'} {name}"


def clip(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` cut to ``limit`` characters, with a marker naming how many were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit:,} more characters cut]"


# How much of a string a person gave (an id, a name) a message quotes: ids and names are
# short, and one of megabytes, quoted whole, made the message as long.
QUOTED: Final = 200


def quoted(value: str) -> str:
    """``value`` as a message quotes it: whole when short, else its start and its length."""
    return value if len(value) <= QUOTED else f"{value[:QUOTED]}… ({len(value):,} characters)"


def quoting_bounded(message: str, values: Iterable[object], longer_than: int = QUOTED) -> str:
    """``message`` with each string of ``values`` longer than ``longer_than`` that it quotes
    cut as ``quoted`` cuts it."""
    for value in values:
        if isinstance(value, str) and len(value) > max(longer_than, QUOTED) and value in message:
            message = message.replace(value, quoted(value))
    return message


class ErrorView(msgspec.Struct, frozen=True, gc=False):
    """The only shape in which an error leaves the process: always all three fields (DESIGN
    §3: `{code, message, retryable}`; scripts read ``retryable`` without a default)."""

    code: str
    message: str
    retryable: bool = False


# code -> (default message, retryable). Messages follow the catalogue of the TypeScript
# IntLoom we match, so scripts that grep for them keep working.
CATALOGUE: Final[dict[str, tuple[str, bool]]] = {
    # Runtime
    "RUN_CHECKPOINT_FAILED": (
        "The Run recovery checkpoint could not be saved. Execution cannot safely continue.",
        False,
    ),
    "RUN_INTERRUPTED": (
        "Execution was interrupted with an uncertain outcome. "
        "Inspect committed effects before starting new work.",
        False,
    ),
    "RUN_STOPPED": ("The Run was stopped.", False),
    "RUN_STATE_INVALID": ("The Run state violates its invariants.", False),
    "RUN_INITIALIZATION_FAILED": ("The Run initialization failed.", False),
    "STAGE_STATE_INVALID": ("The Stage State must satisfy its Schema and JSON boundary.", False),
    "INVALID_CURSOR": ("The cursor does not identify an executable step.", False),
    "INVALID_TRANSITION": ("The transition does not identify a valid next target.", False),
    "EXECUTION_OWNERSHIP_LOST": ("The result no longer belongs to the current execution.", False),
    "STEP_OUTCOME_NOT_HANDLED": ("No transition handles the step outcome.", False),
    "STEP_EXECUTION_FAILED": ("The step execution failed.", False),
    "STEP_RESULT_INVALID": (
        "The step returned an invalid result. Return only a non-empty outcome string.",
        False,
    ),
    "STEP_INTERACTION_INVALID": ("The step violates the interaction protocol.", False),
    "TOOL_EXECUTION_FAILED": (
        "The Agent Tool execution failed. Check the Tool implementation and dependencies.",
        False,
    ),
    "AGENT_TASK_FAILED": ("The client Agent reported that its task failed.", False),
    "WORKFLOW_DEFINITION_INVALID": ("The Workflow definition is invalid.", False),
    "WORKFLOW_LOAD_FAILED": ("The Workflow could not be loaded.", False),
    "JOURNAL_CORRUPT": ("The Run journal is damaged.", False),
    "JOURNAL_INCOMPATIBLE": ("The Run journal cannot be restored by this intloom.", False),
    # Kernel
    "INVALID_REQUEST": ("The request is invalid.", False),
    "NOT_FOUND": ("The requested resource was not found.", False),
    "CONFLICT": ("The request conflicts with the current state.", False),
    "BUSY": ("The requested resource is busy.", True),
    "STORAGE_ERROR": ("The storage operation failed.", False),
    "KERNEL_UNAVAILABLE": ("The kernel is unavailable.", True),
    # CLI and client
    "CLI_PROJECT_INVALID": ("No intloom project was found.", False),
    "CLI_SERVICE_OFFLINE": ("The project service is offline. Run intloom start.", False),
    "CLI_SERVICE_BUSY": (
        "The project service is locked. Run intloom doctor; "
        "use intloom recover only after its owner has exited.",
        False,
    ),
    "CLI_SERVICE_CONFLICT": (
        "Stop the running service before changing its port.",
        False,
    ),
    "CLI_SERVICE_METADATA_INVALID": ("Service metadata is invalid.", False),
    "CLI_SERVICE_TIMEOUT": ("The service did not answer in time.", False),
    "CLI_SERVICE_UNAVAILABLE": ("The local service is unavailable.", False),
    "CLI_SERVICE_CLOSING": ("The service is shutting down.", False),
    "CLI_RECOVERY_BLOCKED": ("Recovery is blocked. No cleanup performed.", False),
    "CLI_RECOVERY_CONFLICT": (
        "Project state changed during recovery. Run intloom doctor again.",
        False,
    ),
    "CLI_RUN_FAILED": ("The Run failed.", False),
    "CLI_INTENT_FILE_INVALID": ("The intent file could not be read.", False),
    "CLI_INIT_TARGET_NOT_EMPTY": ("The init target is not empty.", False),
    "CLI_INIT_TARGET_INVALID": ("The init target is not a directory.", False),
    "CLI_INIT_FAILED": ("The project could not be scaffolded.", False),
    "CLI_INTERNAL_ERROR": ("The local operation failed.", False),
    "CLI_PLATFORM_UNSUPPORTED": ("intloom runs on Linux (a POSIX system) only.", False),
    "CLI_OUTPUT_FAILED": ("The output could not be written to stdout.", False),
    "PROJECT_CONNECTION_FAILED": ("Could not connect to the project service.", True),
    "PROJECT_REQUEST_FAILED": (
        "The request did not complete; it was not replayed. Query the Run before retrying.",
        False,
    ),
    "PROJECT_RESPONSE_INVALID": ("The project service sent an invalid response.", False),
    "RESPONSE_TOO_LARGE": (
        "The host's reply is larger than the 4 MiB frame limit and was not sent.",
        False,
    ),
    "PROTOCOL_MISMATCH": ("The client and the host speak different protocol versions.", False),
    "UNAUTHORIZED": ("The connection token was not accepted.", False),
    "LOG_WRITE_FAILED": ("The host log could not be written.", False),
}


class IntloomError(Exception):
    """An error with a stable code, a message built from facts, and a retry hint.

    Construct with the code and, optionally, a message that names the thing, the fact and
    the fix. Without a message the catalogue default is used.
    """

    def __init__(
        self, code: str, message: str | None = None, *, retryable: bool | None = None,
        here: str | None = None,
    ) -> None:
        default_message, default_retryable = CATALOGUE.get(code, ("The operation failed.", False))
        self.code = code
        self.message = message if message is not None else default_message
        self.retryable = default_retryable if retryable is None else retryable
        # The message as intloom doctor says it, when the message advises running intloom
        # doctor (in doctor's own output that sends its reader back to it): the same facts
        # and fix, built from the same parts -- never the message edited, which would also
        # change a path or a quoted value that happened to hold the words. Stays in the
        # process: an ErrorView carries the message only.
        self.here = here if here is not None else self.message
        super().__init__(self.message)

    def view(self) -> ErrorView:
        """The flat projection that may leave the process."""
        return ErrorView(code=self.code, message=self.message, retryable=self.retryable)

    def recordable(self) -> ErrorView:
        """``view()`` as a journal record and the socket carry it, for an error Workflow code
        raised: its message as text, a lone surrogate kept as its escape (``\\udcff``, as
        ``message_of`` keeps one). A Step's IntloomError with a file name from os.fsdecode
        in its message failed to encode as the Run's end, and the Run stayed "running" for
        ever. (A CLI's own error keeps the surrogate: its JSON writes it as an escape that
        reads back as the path's byte.)"""
        message = self.message
        if type(message) is not str:  # user code may pass anything: the record takes text
            try:
                message = str(message)
            except Exception:
                message = f"(its message, a {type(message).__name__}, cannot be shown)"
        return ErrorView(code=self.code, message=carried(message),
                         retryable=bool(self.retryable))

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt without calling __init__, whose signature is each subclass's own: calling
        # it with (code, message) could not rebuild a UsageError (one argument), and lost
        # what a subclass keeps beside them (a DefinitionError's ``at``).
        return (_rebuilt, (type(self), self.args), dict(self.__dict__))

    def __str__(self) -> str:
        # The code first, as the CLI's "Failure · CODE: message" and DBOS's "DBOS Error
        # <code>:" say it: an uncaught error's traceback, a log's %s and an f-string are
        # often all a script's user sees, and the code is what a script or a reader looks up.
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        # Its own class: a HelloFailed or a DefinitionError read "IntloomError(...)" in a
        # traceback's chained cause, a log's %r or a REPL, so except clauses for the subclass
        # looked wrong beside it.
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"


def _rebuilt(cls: type[IntloomError], args: tuple[object, ...]) -> IntloomError:
    """An IntloomError (of any subclass) as pickled, before its attributes are set back."""
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    return error


def error_view(code: str, message: str | None = None) -> ErrorView:
    """A catalogue error view, optionally with a more specific message."""
    return IntloomError(code, message).view()


# The way out when connection.json is gone and every owner has exited: recover will not run
# without the saved port to check (DESIGN), so the user removes the stale files.
NO_CONNECTION_FIX: Final[str] = (
    "Put .intloom/connection.json back if you moved it, then run intloom recover. If it is "
    "lost, or was never written (a project's first start ended before its host saved it): "
    "once intloom doctor shows every owner exited and the OS lock on service.lock free, "
    "remove .intloom/service.lock and .intloom/service.json yourself, then run intloom "
    "start (it writes a new connection.json)."
)
