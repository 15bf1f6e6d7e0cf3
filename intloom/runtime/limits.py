"""Bounds on what user code and clients can put in a Run's journal and views.

A Run's view crosses the socket in every reply about it (``flow``, ``attach``, ``answer``,
``cancel``) and in ``runs``; its journal is read back at every start. What user code hands
the host (a question, a confirmation's context, an Agent task, an effect's name and key, an
exception's text) is therefore bounded here, so one Run can never make a reply too large for
the 4 MiB frame or the journal grow without limit. docs/authoring.md ("Limits") lists them;
error messages are bounded by ``intloom.errors.MAX_MESSAGE``.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "MAX_AGENT_ID",
    "MAX_EFFECT_ID",
    "MAX_INTENT_BYTES",
    "MAX_LABEL",
    "MAX_LOGGED_MESSAGE",
    "MAX_OUTCOME",
    "MAX_RECORD_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_TOOLS_BYTES",
    "intent_too_large",
]

# A question/confirmation request or an Agent task, as JSON: far more than a person reads at
# a prompt, and 16 such views still fit in one 4 MiB frame. Larger data belongs in a file or
# a store of your own, with a reference (a path, an id) in the request.
MAX_REQUEST_BYTES: Final = 256 * 1024
# An Agent Step's Tools as every view of its task shows them: their names and descriptions,
# UTF-8 bytes together. A description says what the Agent needs to pick and call a Tool;
# without a bound, one Step's 5 MB description made every runs and every claim of its task fail.
MAX_TOOLS_BYTES: Final = 64 * 1024
# An effect's name or key, in characters (a key is an idempotency key: a hash, a URL, an id).
MAX_EFFECT_ID: Final = 1024
# An Agent's claim id and Tool call id, in characters: each is in the host log's lines of its
# calls and in a stop's report (a 1 MiB id made lines a stop's report could not read back).
MAX_AGENT_ID: Final = 1024
# A Run's intent, UTF-8 bytes: the CLI's --intent-file limit, kept by the host for every client.
MAX_INTENT_BYTES: Final = 1 << 20
# A Workflow's version and an Agent Step's agent id, in characters: labels in every view of
# their Runs. Without a bound, a 5 MB version made every reply listing its Runs too large
# (runs failed for the whole host until a restart, even after a cancel).
MAX_LABEL: Final = 256
# A Step's outcome, in characters. Route outcomes are names of at most 64 characters, so a
# longer outcome can never be routed; past this one it is not even recorded.
MAX_OUTCOME: Final = 1024
# How much of a message cut to ``MAX_MESSAGE`` the host log keeps (the full text, up to here).
MAX_LOGGED_MESSAGE: Final = 64 * 1024
# One journal record's frame body (docs/format.md): the store refuses a longer one before
# writing it (a reader takes it for damage), and the executor measures a record against it
# where a refusal must come before the records that precede it are appended.
MAX_RECORD_BYTES: Final = 64 << 20


def intent_too_large(size: int) -> str:
    """Why an intent of ``size`` UTF-8 bytes is refused, and the fix: the host's words, and a
    client's that the frame's bound refuses before the host sees it (one sentence for both,
    so that neither names another limit than the one to meet)."""
    return (f"The intent is {size:,} bytes, over the {MAX_INTENT_BYTES:,}-byte limit; no Run "
            "was created. Put large input in a file your Steps read, and pass its path (or a "
            "short description) as the intent.")
