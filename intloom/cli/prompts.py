"""Terminal prompts for a pending question or confirmation (``intloom attach``).

Prompts and what they show go to stderr; only the Run's final view goes to stdout. A
prompt that is cancelled (Ctrl-C, EOF) raises ``typer.Abort`` (or ``KeyboardInterrupt``):
the Run keeps waiting.

A prompt never holds up the rest of attach: the typed line is read from stdin's descriptor
once the terminal has a whole line (the terminal edits it, as for ``input()``), and another
thread can wake the wait (:meth:`Terminal.wake`). A woken prompt calls its ``check``, which
raises to drop the prompt when what it asks for is no longer pending.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
import typer

from intloom.cli.render import CONFIRMATION, PromptInterrupted, printable

__all__ = ["Terminal", "ctrl_c_ignored", "detach_hint", "prompt_answer"]


def ctrl_c_ignored() -> bool:
    """SIGINT was ignored when intloom started (a shell's ``trap '' INT``, a job a script
    started with ``&``), and Python keeps it so: Ctrl-C does nothing, and a prompt that said
    "Ctrl-C detaches" sent the user pressing it in vain. EOF (Ctrl-D) still detaches."""
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def detach_hint() -> str:
    """How to leave attach's prompts without answering, said above the first of them: only
    a refused answer said it, and a person at the first prompt did not know that leaving
    was possible, nor that the Run goes on waiting."""
    if ctrl_c_ignored():
        return "Ctrl-D detaches without answering and leaves the Run waiting."
    return "Ctrl-C (or Ctrl-D) detaches without answering and leaves the Run waiting."


# The longest a prompt sleeps before it looks whether Ctrl-C came: a SIGINT that lands just
# before select() goes to sleep (or whose handler the kernel runs on another thread) is only
# flagged for the main thread and wakes no select; an untimed one waited for a key.
_SIGNAL_LOOK = 0.25
# The most a terminal in canonical mode passes of one line: Linux's line buffer holds 4,096
# bytes, the newline included, and drops what is typed past it. A line this long may have
# lost its end, and sending it would record an answer cut short.
_LINE_MAX = 4095
# How much of a refused reply is shown back.
_SHOWN = 40


def _nothing() -> None:
    return None


class Terminal:
    """The terminal a person answers on while the Run's events are printed around them.

    ``output()`` is for another thread's lines: they start on a line of their own, and the
    open prompt is shown again after them (at its next wake, which that thread gives).
    ``wake()`` (any thread) makes the open prompt, or the next one, call ``check`` (main
    thread), which raises to drop it: the line being typed is discarded, so nothing typed
    for it answers the next prompt.
    """

    def __init__(self, fd: int | None = None) -> None:
        self._fd = sys.stdin.fileno() if fd is None else fd
        self._wake_r, self._wake_w = os.pipe()
        for end in (self._wake_r, self._wake_w):
            os.set_blocking(end, False)
        self._lock = threading.RLock()  # one writer at a time; guards the pipe's life too
        self._closed = False
        self._shown = False  # the open prompt is the last thing on the screen
        self.check: Callable[[], None] = _nothing
        # Where a line this terminal cannot pass whole (too long, or not text) is given
        # instead: set by the caller, which knows the command.
        self.instead = "a file given to the command instead of this prompt"
        # Said once, above the first prompt shown (``detach_hint``), not at every prompt.
        self.hint: str | None = None

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)

    def wake(self) -> None:
        """From any thread: the prompt should look again whether it is still wanted."""
        with self._lock:
            if not self._closed:
                with contextlib.suppress(BlockingIOError):  # already woken
                    os.write(self._wake_w, b"\0")

    @contextlib.contextmanager
    def output(self) -> Iterator[None]:
        """Write another thread's lines below an open prompt, never into it."""
        with self._lock:
            if self._shown:
                self._write("\n")
                self._shown = False
            yield

    def say(self, text: str) -> None:
        """A line of what is asked: Workflow text, escaped as the Renderer escapes it."""
        with self._lock:
            self._write(printable(text) + "\n")

    def fresh(self) -> None:
        """Forget what was typed before now: keys pressed while the Run ran on, or at an
        earlier prompt, were not typed for what is asked next (a stray "y" and Enter
        confirmed a confirmation not yet shown)."""
        with contextlib.suppress(OSError, termios.error):  # termios.error is no OSError
            termios.tcflush(self._fd, termios.TCIFLUSH)

    def line(self, prompt: str) -> str:
        """Show ``prompt``; the line typed, without its newline. EOF raises ``typer.Abort``;
        whatever ``check`` raises drops the prompt. A line that may have lost its end, or
        that is not text in the terminal's encoding, is refused and asked for again."""
        hint, self.hint = self.hint, None
        if hint is not None and os.isatty(self._fd):
            self.say(hint)
        while True:
            typed = self._typed(prompt)
            refusal = self._refusal(typed)
            if refusal is None:
                encoding = getattr(sys.stdin, "encoding", None) or "utf-8"
                return typed.decode(encoding)
            # Before it is said: the rest of a paste, already typed, would answer the prompt
            # asked again before the person read why.
            self.fresh()
            self.say(refusal)

    def _refusal(self, typed: bytes) -> str | None:
        """Why ``typed`` is not taken as typed; None when it is."""
        if len(typed) >= _LINE_MAX and self._canonical():
            return (f"That line is {len(typed):,} bytes, the most a terminal passes on one "
                    "line: what was typed past that was dropped, so nothing was taken from "
                    f"it. Give a long answer with {self.instead}.")
        encoding = getattr(sys.stdin, "encoding", None) or "utf-8"
        try:
            typed.decode(encoding)
        except UnicodeDecodeError as exc:
            return (f"That line is not {encoding} text (byte 0x{typed[exc.start]:02x} at "
                    f"byte {exc.start + 1}), so nothing was taken from it: the terminal's "
                    f"encoding differs from the locale's ({encoding}). Type it again, set "
                    f"LANG to a {encoding} locale, or give it with {self.instead}.")
        if self._canonical() and self._pasted():
            # More lines came with it, before any was read: a paste, not a person answering
            # this prompt. Taken, its lines answered the next prompts of the action (and
            # sent it) unread, or outlived the command and ran in the shell. Refused, the
            # rest there now is discarded with it (``line``); a paste whose rest arrives
            # only after this look (a slow link) is not seen as one.
            return ("That line is followed by more text pasted with it, so nothing was taken "
                    "from it or from what followed: type the answer to this prompt alone, or "
                    f"give text of several lines with {self.instead}.")
        return None

    def _pasted(self) -> bool:
        """Whether more text is there to read now, after a whole line was read: the rest of
        a paste. Empty lines there are read and let go: an Enter that sends CR LF (a
        terminal in newline mode, a serial or telnet client) makes two line ends, and the
        empty second one was taken for a paste at every answer."""
        while True:
            try:
                ready, _, _ = select.select([self._fd], [], [], 0)
                if not ready:
                    return False
                more = os.read(self._fd, 4096)
            except (OSError, ValueError):
                return False
            if not more:
                return False  # an EOF (Ctrl-D) typed right behind the line: no paste
            if more.strip(b"\r\n"):
                return True

    def _canonical(self) -> bool:
        """The terminal edits lines itself (ICANON): it then passes one of 4,095 bytes at
        most."""
        try:
            return bool(termios.tcgetattr(self._fd)[3] & termios.ICANON)
        except (OSError, termios.error):
            return False

    def _typed(self, prompt: str) -> bytes:
        try:
            return self._line(prompt)
        except (KeyboardInterrupt, typer.Abort) as exc:
            # Ctrl-C or EOF at the prompt: what attach says next (it detached) starts a line
            # of its own, not "Confirm? [y/n]: Detached from ...".
            with self._lock:
                shown, self._shown = self._shown, False
                if shown:
                    self._write("\n")
            if shown and isinstance(exc, KeyboardInterrupt):
                # That line held the ^C the terminal echoed: no second break (an empty
                # line) before those words. Not shown, the ^C went on a line of its own.
                raise PromptInterrupted from None
            raise

    def _line(self, prompt: str) -> bytes:
        typed = b""
        while True:
            with self._lock:
                if not self._shown:
                    self._write(prompt)
                    self._shown = True
            ready, _, _ = select.select([self._fd, self._wake_r], [], [], _SIGNAL_LOOK)
            if not ready:
                continue
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
                try:
                    self.check()
                except KeyboardInterrupt:
                    # Leaving: _typed ends the prompt's line. What was typed at it is
                    # forgotten still (a SIGTERM taken as Ctrl-C flushes nothing itself),
                    # or the shell would read it as a command.
                    self.fresh()
                    raise
                except BaseException:
                    self._drop()
                    raise
                continue
            chunk = os.read(self._fd, 4096)
            if not chunk:
                raise typer.Abort()
            typed += chunk
            if typed.endswith(b"\n"):
                with self._lock:
                    self._shown = False
                return typed[:-1]

    def _drop(self) -> None:
        """End the dropped prompt's line; forget what was typed at it."""
        with self._lock:
            if self._shown:
                self._write("\n")
                self._shown = False
        self.fresh()

    @staticmethod
    def _write(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    def confirm(self, text: str) -> bool:
        """``text [y/n]: `` until y(es) or n(o); no default."""
        while True:
            typed = self.line(f"{text} [y/n]: ").strip()
            value = typed.lower()
            if value in ("y", "yes"):
                return True
            if value in ("n", "no"):
                return False
            # No default: Enter alone is refused too (see _confirmation). What was typed is
            # shown as typed, and a long line only by its start.
            cut = typed if len(typed) <= _SHOWN else f"{typed[:_SHOWN]}…"
            shown = repr(cut) if typed else "An empty line"
            key = "Ctrl-D" if ctrl_c_ignored() else "Ctrl-C"
            self.say(f"{shown} is not an answer: type y (yes) or n (no); {key} detaches "
                     "and leaves the Run waiting.")

    def ask(self, text: str) -> str:
        """``text: ``; the line as typed ("" for Enter)."""
        return self.line(f"{text}: ")


def _confirmation(term: Terminal, request: Any) -> dict[str, Any]:
    context = request.get("context") if isinstance(request, Mapping) else request
    term.say("Confirmation requested:")
    for line in msgspec.json.format(msgspec.json.encode(context), indent=2).splitlines():
        term.say(line.decode("utf-8"))
    # No default: a stray Enter must not decide (declining may re-run earlier Steps).
    confirmed = term.confirm("Confirm?")
    feedback = term.ask("Feedback (optional, Enter to skip)")
    answer: dict[str, Any] = {"isConfirmed": confirmed}
    if feedback.strip():
        answer["feedback"] = feedback
    return answer


def _option_line(number: int, option: Mapping[str, Any]) -> str:
    """``  2. won't fix [wontfix] (close it as is)``: the id is what picking it answers."""
    oid = str(option.get("id"))
    label = str(option.get("label") or oid)
    shown = label if label == oid else f"{label} [{oid}]"
    extra = f" ({option['description']})" if option.get("description") else ""
    return f"  {number}. {shown}{extra}"


def _shown_option(option: Mapping[str, Any]) -> str:
    """``won't fix [wontfix]``, or the id alone when it is the label."""
    oid = str(option.get("id"))
    label = str(option.get("label") or oid)
    return label if label == oid else f"{label} [{oid}]"


def _by_label(options: list[Mapping[str, Any]], raw: str
              ) -> tuple[int, Mapping[str, Any]] | None:
    """The one option (its number and itself) whose label is ``raw``, case aside; None when
    no option's is, or several are (then ``raw`` is an answer as typed)."""
    if not raw:
        return None
    folded = raw.casefold()
    found = [(number, option) for number, option in enumerate(options, start=1)
             if str(option.get("label") or option.get("id")).casefold() == folded]
    return found[0] if len(found) == 1 else None


def _question(term: Terminal, question: Mapping[str, Any]) -> dict[str, Any]:
    """One question's answer entry. A number picks an option and answers with its id (the
    stable identifier a Step routes on; the label is for people and may change), and so
    does the label of exactly one option, typed in any case; any other text is the answer
    as typed (options are suggestions)."""
    qid = str(question.get("id"))
    skippable = bool(question.get("isSkippable", False))
    term.say(f"{question.get('question', qid)}")
    if question.get("description"):
        term.say(f"  {question['description']}")
    options = [o for o in question.get("options") or [] if isinstance(o, Mapping)]
    for number, option in enumerate(options, start=1):
        term.say(_option_line(number, option))
    hint = "a number or your own answer" if options else "your answer"
    if skippable:
        hint += "; Enter skips"
    while True:
        raw = term.ask(f"[{hint}]").strip()
        if not raw and skippable:
            return {"questionId": qid, "isSkipped": True}
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
        if options and raw.isascii() and raw.isdigit():
            number = int(raw)
            # Options whose ids are numbers ("3", "1", "5"): a number was taken for a
            # position only, so "1" silently picked the first option, not the one with id
            # 1, and "5", a real id, was refused.
            by_id = [(n, o) for n, o in enumerate(options, start=1) if str(o.get("id")) == raw]
            if 1 <= number <= len(options):
                # A position always picks (every option stays pickable by its number, even
                # when labels are numbers too), and the pick is said, with the option whose
                # id the number also is.
                option = options[number - 1]
                oid = str(option.get("id"))
                other = [(n, o) for n, o in by_id if n != number]
                also = (f" ({raw} is also the id of option {other[0][0]}, "
                        f"{_shown_option(other[0][1])}: type {other[0][0]} for that one.)"
                        if other else "")
                if oid != raw:
                    term.say(f"Picked option {number}, {_shown_option(option)}: the answer "
                             f"is its id, {oid}.{also}")
                return {"questionId": qid, "isSkipped": False, "answer": oid}
            if len(by_id) == 1:
                term.say(f"Picked option {by_id[0][0]}, {_shown_option(by_id[0][1])}, by its "
                         "id.")
                return {"questionId": qid, "isSkipped": False, "answer": raw}
            # A mistyped pick must not become the answer "7": a Step routing on option ids
            # would fail on it.
            term.say(
                f"There is no option {number}: type a number from 1 to {len(options)}, or "
                "your own answer (a number alone always picks an option; to answer with a "
                "number, use intloom answer)."
            )
            continue
        picked = _by_label(options, raw)
        if picked is not None:
            number, option = picked
            oid = str(option.get("id"))
            if oid != raw:
                # Sent as typed, an option's label was free text, not that option: a Step
                # routing on option ids failed on it, or took it for another answer.
                term.say(f"Picked option {number}, {_shown_option(option)}: the answer is "
                         f"its id, {oid}.")
            return {"questionId": qid, "isSkipped": False, "answer": oid}
        if raw:
            return {"questionId": qid, "isSkipped": False, "answer": raw}
        term.say("This question needs an answer.")


def prompt_answer(action: Mapping[str, Any], term: Terminal) -> Any:
    """Ask a person, on ``term``, for the answer to ``action`` (a PendingAction as plain
    data)."""
    term.fresh()
    request = action.get("request")
    if action.get("kind") == CONFIRMATION:
        return _confirmation(term, request)
    questions = [q for q in request or [] if isinstance(q, Mapping)]
    return [_question(term, q) for q in questions]
