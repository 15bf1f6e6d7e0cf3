"""The one renderer: every byte the CLI writes goes through here.

Business output goes to stdout, progress and errors (in text mode) to stderr. In JSON mode
exactly one JSON document reaches stdout and nothing else does. Rich is used only for tables
and spinners, only on a terminal, and only when ``NO_COLOR`` is unset; it is imported on
first use so that commands that never draw a table do not pay for it.

The text renderers take plain data (``plain(obj)``: camelCase dicts and lists, as on the
wire), so they render what another component returns without depending on its classes.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final, TextIO, overload

import msgspec

from intloom.cli.inputs import TEXT_PLACEHOLDER, options_placeholder
from intloom.errors import CATALOGUE, STARTING, ErrorView

__all__ = [
    "CopyableWatch",
    "OutputFailed",
    "PromptInterrupted",
    "Renderer",
    "asked",
    "asked_lines",
    "changed_lines",
    "ctrl_c_echoed",
    "diagnosis_lines",
    "doctor_lines",
    "history_rows",
    "log_line",
    "named_runs",
    "plain",
    "printable",
    "recover_lines",
    "restore_lines",
    "run_lines",
    "run_row",
    "run_title",
    "service_lines",
]

_json_encoder = msgspec.json.Encoder()
# Piped tables align a column only on cells up to this long: a record summary (inspect,
# at most 80) still aligns, a Workflow's load error does not widen every row.
_ALIGN_MAX = 80


def plain(obj: Any) -> Any:
    """``obj`` as JSON-shaped builtins, with the wire's field names."""
    try:
        return msgspec.to_builtins(obj, str_keys=True)
    except TypeError:
        # An effect's result keeps a dict's None, bool or tuple keys in the journal as they
        # are (msgpack holds them); a JSON document cannot, so inspect shows each key as its
        # JSON text rather than failing on the whole journal.
        return _json_keys(msgspec.to_builtins(obj))


def _json_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key if isinstance(key, str) else _key_text(key): _json_keys(item)
                for key, item in value.items()}
    if isinstance(value, list):
        return [_json_keys(item) for item in value]
    return value


def _key_text(key: Any) -> str:
    if isinstance(key, int | float) and not isinstance(key, bool):
        text: str = msgspec.to_builtins({key: None}, str_keys=True).popitem()[0]
        return text  # as str_keys writes it
    return _json_encoder.encode(key).decode()


# What a terminal would act on instead of showing, in text a Workflow or a person supplied
# (an exception's message, a question, an intent): C0 and C1 controls and DEL (ESC starts
# an escape sequence, NUL and CR hide what precedes them, a newline would break a one-line
# error), the Unicode line and paragraph separators, the bidirectional overrides and
# isolates (they reorder what follows on the line), and lone surrogates (not encodable
# text). Also what shows as nothing, so that a Run id or an answer could look like another:
# the directional marks (LRM, RLM, ALM), the zero-width space, word joiner and invisible
# operators, and the BOM. Every other character, emoji and accents included, is shown as
# it is.
_HIDDEN = ("\x00-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028\u2029\u202a-\u202e"
           "\u2060-\u2064\u2066-\u2069\ufeff\ud800-\udfff")
# The zero-width joiner and non-joiner make emoji sequences (a family emoji is three joined
# by U+200D) and Persian and Indic words: between two other non-ASCII characters they are
# shown as they are. Next to ASCII (a Run id, an answer) or at an end of the text they
# join nothing visible, only hide, so they are escaped there.
_JOINERS: Final = frozenset("\u200c\u200d")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(unsafe, joins), compiled at the first text write: ~2 ms of a command's start-up,
    which a ``--json`` command never needs."""
    return (re.compile(f"[{_HIDDEN}\u200c\u200d]"),
            re.compile(f"[^\x00-\x7f{_HIDDEN}\u200c\u200d]"))


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in _JOINERS:
        text, at = match.string, match.start()
        joins = _patterns()[1]
        if at > 0 and joins.match(text, at - 1) and joins.match(text, at + 1):
            return char
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` safe to write to a terminal or a pipe, on one line: each character of
    ``_HIDDEN`` and each joiner (but one between two non-ASCII characters) becomes its
    Python escape (``\\x1b``, ``\\n``, ``\\u202e``). Applied by every text-mode write of
    the Renderer; JSON output is never touched."""
    return _patterns()[0].sub(_escaped, text)


# What ``Renderer.streamed_document`` writes at once: written item by item, the document
# went out in ~8 KiB writes, and a pipe holds less of them than of one write (each write
# begins a page of its own unless it fits in the last one's room): a reader waiting for
# the pipe to fill (64 KiB) waited for ever.
_STREAM_BATCH: Final = 1 << 20

# Tables longer than this are not laid out by Rich on a terminal (``Renderer._table``).
_RICH_ROWS: Final = 500


def _terminal_columns(stream: TextIO) -> int | None:
    """How many columns the terminal ``stream`` writes to shows (``COLUMNS`` first, as Rich
    reads it); None when it is no terminal: piped lines are never laid out for a width."""
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        return None


def _cells_wide(rows: Sequence[Sequence[str]]) -> int:
    """How many terminal cells the widest aligned row takes: each column as wide as its
    widest cell, counted in screen cells (a CJK character takes two), every cell counted
    (one past the alignment limit lengthens its own row, and is wrapped just the same)."""
    from rich.cells import cell_len  # on a terminal only: piped output never asks

    widths = [max(cell_len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows \
        else []
    return sum(widths) + 2 * (len(widths) - 1)


class PromptInterrupted(KeyboardInterrupt):
    """Ctrl-C at a prompt, which ended its line after the ``^C`` the terminal echoed on it
    (``prompts.Terminal``): what is said of the Ctrl-C needs no line break of its own."""


def ctrl_c_echoed(stream: TextIO) -> bool:
    """Whether a Ctrl-C typed for this process showed ``^C`` on the terminal ``stream``
    writes to, where its cursor stood: ``stream`` is the controlling terminal, this process
    is in its foreground (only that gets the keyboard's SIGINT), and it echoes control
    characters (ECHO and ECHOCTL on). A pipe, a terminal that is not the controlling one, a
    background job or ``stty -echoctl`` echo nothing there."""
    import termios  # only once a Ctrl-C came

    try:
        fd = stream.fileno()
        if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
            return False
        lflag = termios.tcgetattr(fd)[3]
    except (AttributeError, ValueError, OSError, termios.error):
        return False
    return bool(lflag & termios.ECHO and lflag & termios.ECHOCTL)


def _color_allowed(stream: TextIO) -> bool:
    if "NO_COLOR" in os.environ:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _json_text(doc: Mapping[str, Any]) -> str:
    try:
        return _json_encoder.encode(doc).decode("utf-8")
    except UnicodeEncodeError:
        # A path that is not UTF-8 holds surrogates (os.fsdecode), which UTF-8 cannot
        # carry; a JSON escape can ("\\udcff"), and Python's json reads it back as the path.
        import json  # this rare path only: not on every command's start-up

        return json.dumps(msgspec.to_builtins(doc), separators=(",", ":"))


class CopyableWatch:
    """Whether text mode printed a command line for a person to run (``intloom stop``,
    ``intloom answer RUN ...``), whoever built it: the CLI, the diagnostics or the host.

    Such a line runs against the project of the shell's working directory, which is not
    always the one this invocation used (``--project``): main() then says once where to
    run them (docs/cli.md, "Commands to copy"). A Run's own command lines carry the
    ``--project`` instead (CliState.intloom), and ``intloom --project DIR ...`` does not
    count; watching what is written covers every other hint in prose, the host's messages
    too, which cannot know the client's working directory and are not rewritten here.
    """

    def __init__(self) -> None:
        self.seen = False
        self._pattern: re.Pattern[str] | None = None

    def __call__(self, text: str) -> None:
        if self.seen:
            return
        if self._pattern is None:
            from intloom.cli.app import COMMANDS  # loaded already: main() is the caller

            # ``intloom --help`` and ``intloom --project DIR stop`` do not match: neither
            # depends on the working directory.
            self._pattern = re.compile(
                r"(?<![\w.-])intloom (?:" + "|".join(map(re.escape, COMMANDS)) + r")\b")
        self.seen = self._pattern.search(text) is not None


class OutputFailed(OSError):
    """stdout refused what was written to it (a full disk, an I/O error): a fault of where
    the output goes, not of intloom's (a reader gone, EPIPE, stays a BrokenPipeError)."""


@contextmanager
def _writing() -> Iterator[None]:
    try:
        yield
    except (BrokenPipeError, OutputFailed):
        raise
    except OSError as exc:
        raise OutputFailed(exc.errno, exc.strerror) from exc


class PrintedRows(Sequence[Sequence[str]]):
    """A table's rows held as one string each, their cells made ``printable`` as they come
    (what ``Renderer.table`` writes of them): held as lists of cells, each row took several
    hundred bytes, and as much again for the table's printable copy (a 360,000-record
    journal's table)."""

    # ``printable`` escapes every C0 control: no cell holds this one.
    _SEP: Final = "\x00"

    def __init__(self, rows: Iterable[Sequence[str]] = ()) -> None:
        self._lines = [self._SEP.join(printable(cell) for cell in row) for row in rows]

    def headed(self, columns: Sequence[str]) -> PrintedRows:
        """These rows under ``columns`` (written as they are, as a header is)."""
        out = PrintedRows()
        out._lines = [self._SEP.join(columns), *self._lines]
        return out

    def __len__(self) -> int:
        return len(self._lines)

    @overload
    def __getitem__(self, index: int) -> Sequence[str]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Sequence[str]]: ...
    def __getitem__(self, index: int | slice) -> Sequence[str] | Sequence[Sequence[str]]:
        if isinstance(index, slice):
            return [line.split(self._SEP) for line in self._lines[index]]
        return self._lines[index].split(self._SEP)

    def __iter__(self) -> Iterator[Sequence[str]]:
        return (line.split(self._SEP) for line in self._lines)


class Renderer:
    """Writes documents, lines, tables, spinners and errors for one command invocation."""

    def __init__(self, *, json_mode: bool = False,
                 watch: Callable[[str], None] | None = None) -> None:
        self.json_mode = json_mode
        # Sees every line of text mode's lines, notes and errors (CopyableWatch).
        self.watch = watch
        # Set once stdout has its one document: an error after it (a foreground host that
        # stops on its own after its start result) goes to stderr, never as a second one.
        self.documented = False
        # Where the document goes when not sys.stdout: a ``start --foreground --json``
        # keeps stdout for it alone (``intloom.cli.streams``).
        self.stdout: TextIO | None = None
        # The line a Ctrl-C's ``^C`` was echoed on is ended (a prompt's) or drawn over (a
        # spinner's): ``after_ctrl_c`` adds no line break, which would leave an empty line.
        self._ctrl_c_line_ended = False

    # Streams are looked up at call time so that redirection (tests, pagers) is honoured.
    @property
    def out(self) -> TextIO:
        return sys.stdout if self.stdout is None else self.stdout

    @property
    def err(self) -> TextIO:
        return sys.stderr

    @property
    def rich_out(self) -> bool:
        return not self.json_mode and _color_allowed(self.out)

    @property
    def rich_err(self) -> bool:
        return not self.json_mode and _color_allowed(self.err)

    def document(self, doc: Mapping[str, Any]) -> None:
        """The single JSON document of a ``--json`` invocation."""
        with _writing():
            self.out.write(_json_text(doc) + "\n")
            self.out.flush()
        self.documented = True

    def streamed_document(self, head: Mapping[str, Any], key: str, items: Iterable[Any],
                          tail: Mapping[str, Any]) -> None:
        """``document({**head, key: list(items), **tail})``, the same bytes, written as each
        of ``items`` comes (never all held: a journal of 360,000 records, the Run's states
        included, took 840 MB as one document). ``key`` is in neither mapping."""
        try:
            ends = [_json_encoder.encode(part).decode("utf-8") for part in (head, tail)]
        except UnicodeEncodeError:
            # The rare document written escaped (_json_text): as one, as before.
            self.document({**head, key: list(items), **tail})
            return
        with _writing():
            out = self.out
            batch = [ends[0][:-1] + ("," if head else "")
                     + _json_encoder.encode(key).decode("utf-8") + ":["]
            size = len(batch[0])
            first = True
            for item in items:
                # Each item is one JSON value, as in the whole document (msgpack, which the
                # journal's records come from, holds no lone surrogate: _json_text's escaped
                # form is needed for paths, which head and tail carry).
                text = ("" if first else ",") + _json_text(item)
                first = False
                batch.append(text)
                size += len(text)
                if size >= _STREAM_BATCH:
                    # From the first byte out, an error (an item that cannot be read) goes
                    # to stderr, not into this document; before it, stdout is still free for
                    # the {"error": ...} document (it went to stderr, stdout left empty).
                    self.documented = True
                    out.write("".join(batch))
                    batch, size = [], 0
            batch.append("]" + ("," + ends[1][1:] if tail else "}") + "\n")
            self.documented = True
            out.write("".join(batch))
            out.flush()

    def raw(self, text: str) -> None:
        """Already-formatted output (a JSONL log record), written as is, flushed at once."""
        with _writing():
            self.out.write(text)
            self.out.flush()

    # Every text-mode write below passes its text through ``printable``: lines are built
    # from Workflow and user data (messages, questions, intents), and nothing of it may
    # reach a terminal as a control character or an escape sequence.

    def lines(self, lines: Sequence[str]) -> None:
        with _writing():
            for text in lines:
                self._watched(text)
                self.out.write(printable(text) + "\n")
            self.out.flush()

    def _watched(self, text: str) -> None:
        if self.watch is not None:
            self.watch(text)

    def note(self, text: str) -> None:
        """Progress and hints for a person: stderr, never in JSON mode."""
        if not self.json_mode:
            self._watched(text)
            self.err.write(printable(text) + "\n")
            self.err.flush()

    def after_ctrl_c(self, exc: BaseException | None = None) -> None:
        """Before what is said of a Ctrl-C (``exc``, what it raised, when known): the
        terminal echoed ``^C`` where the cursor stood, and the words went on after it on
        that line ("^CDetached from ..."). A line break first, once, where a terminal
        echoed it (``ctrl_c_echoed``); piped stderr and --json get nothing. The caller knows
        it was a Ctrl-C: not EOF, not SIGTERM (nothing echoes either)."""
        if isinstance(exc, PromptInterrupted):
            self._ctrl_c_line_ended = True
        if self.json_mode or self._ctrl_c_line_ended or not ctrl_c_echoed(self.err):
            return
        self._ctrl_c_line_ended = True
        self.err.write("\n")
        self.err.flush()

    def ctrl_c_line_ended(self) -> None:
        """A prompt ended the line a Ctrl-C was echoed on (``PromptInterrupted``), where
        what it raised is no longer at hand."""
        self._ctrl_c_line_ended = True

    def result(self, doc: Mapping[str, Any], text: Callable[[], Sequence[str]]) -> None:
        """``doc`` in JSON mode, else the lines ``text()`` builds."""
        if self.json_mode:
            self.document(doc)
        else:
            self.lines(text())

    def error(self, view: ErrorView) -> None:
        if self.json_mode and self.documented:
            # stdout holds the command's one document already (docs/cli.md, "Output rules").
            self.err.write(_json_text({"error": view}) + "\n")
            self.err.flush()
        elif self.json_mode:
            self.document({"error": view})  # code, message and retryable, always all three
        else:
            self._watched(view.message)
            self.err.write(printable(f"Failure · {view.code}: {view.message}") + "\n")
            self.err.flush()

    def table(self, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """A Rich table on a terminal; aligned plain lines (no header) when piped."""
        with _writing():
            self._table(columns, rows)

    def _table(self, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        if not isinstance(rows, PrintedRows):
            rows = [[printable(cell) for cell in row] for row in rows]
        if self.rich_out and len(rows) > _RICH_ROWS:
            # Rich lays out every row: 10,000 Runs took 11.9 s to print on a terminal (1.1 s
            # piped). Aligned plain lines under a header, as piped output is but for that.
            rows = (rows.headed(columns) if isinstance(rows, PrintedRows)
                    else [list(columns), *rows])
        elif self.rich_out:
            from rich.cells import cell_len
            from rich.console import Console
            from rich.markup import escape
            from rich.table import Table

            # emoji=False: ":warning:" in an intent is text, as "[red]" is (escape() leaves
            # emoji codes to Rich, which drew them as the emoji).
            console = Console(file=self.out, emoji=False)
            widths = [max(cell_len(cell) for cell in (name, *(row[i] for row in rows)))
                      for i, name in enumerate(columns)]
            if sum(widths) + 2 * (len(widths) - 1) > console.width:
                # Too narrow for a row per line. Nothing is cut with "…" and no cell is
                # folded mid-word ("waitin/g"): the first cell, the id people copy into the
                # next command (RUN-…), gets a line of its own and the others follow it.
                # The header unwrapped too, like the rows: Rich's own wrap split it at any
                # width, and folded it mid-word ("WOR" / "KFLOW") on very narrow terminals.
                console.print(f"[bold]{escape(columns[0])}[/bold]", highlight=False,
                              soft_wrap=True)
                console.print(f"  [bold]{escape(' · '.join(columns[1:]))}[/bold]",
                              highlight=False, soft_wrap=True)
                for row in rows:
                    console.print(escape(row[0]), highlight=False, soft_wrap=True)
                    # An empty cell as "-": " ·  · " read as a stray separator.
                    console.print("  " + escape(" · ".join(cell or "-" for cell in row[1:])),
                                  highlight=False, soft_wrap=True)
                return
            table = Table(box=None, header_style="bold", pad_edge=False)
            for name in columns:
                table.add_column(name, no_wrap=True)
            for row in rows:
                table.add_row(*(escape(cell) for cell in row))  # "[red]" is text, not markup
            console.print(table)
            return
        # A cell longer than _ALIGN_MAX (a load error, say) overflows its own row rather than
        # padding every other row out to its width.
        widths = [0] * len(columns)
        for row in rows:
            for i, cell in enumerate(row):
                if widths[i] < len(cell) <= _ALIGN_MAX:
                    widths[i] = len(cell)
        room = _terminal_columns(self.out)
        if room is not None and _cells_wide(rows) > room:
            # A terminal without colour (NO_COLOR, TERM=dumb) or with a long table: rows
            # wider than it were wrapped by it mid-id, mid-time. Laid out as Rich's path
            # lays out a narrow table: the first cell on a line of its own, then the rest.
            for row in rows:
                self.out.write(row[0] + "\n")
                self.out.write("  " + " · ".join(cell or "-" for cell in row[1:]) + "\n")
            self.out.flush()
            return
        for row in rows:
            cells = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
            self.out.write("  ".join(cells).rstrip() + "\n")
        self.out.flush()

    @contextmanager
    def spinner(self, text: str) -> Iterator[Callable[[str], None]]:
        """A spinner on stderr (terminal only); yields a function that updates its text."""
        if not self.rich_err:
            yield lambda _text: None
            return
        from rich.console import Console
        from rich.markup import escape

        console = Console(file=self.err, emoji=False)  # as in table()
        try:
            with console.status(escape(printable(text))) as status:
                yield lambda new: status.update(escape(printable(new)))
        except BaseException:
            # Rich's status draws over its line as it leaves, a ^C echoed on it too: what
            # is said of the Ctrl-C starts a line already.
            self._ctrl_c_line_ended = True
            raise


# ----- runs ------------------------------------------------------------------------------


def _error_of(run: Mapping[str, Any]) -> Mapping[str, Any]:
    err = run.get("lastError")
    return err if isinstance(err, Mapping) else {}


def _suspended(run: Mapping[str, Any], suspended: bool) -> bool:
    """``suspended`` (the Run's event stream ended with ``suspended``: its host suspended
    it) holds for this view: failed/RUN_INTERRUPTED, not dismissed. A restored interrupted
    Run reads the same, so only the stream can tell the two apart."""
    return (suspended and run.get("status") == "failed" and not run.get("dismissed")
            and _error_of(run).get("code") == "RUN_INTERRUPTED")


def run_title(run: Mapping[str, Any]) -> str:
    """IntLoom's titles; a Run its host suspended keeps ``Execution failed`` (its lines say
    it has not ended: ``run_lines``)."""
    status = run.get("status")
    if status == "waiting":
        if run.get("pendingAgentCall"):
            return "Waiting for the client Agent"
        return "Waiting for an answer"
    if status == "completed":
        return "Completed"
    if status == "failed":
        if run.get("dismissed"):
            return "Dismissed"
        return "Stopped" if _error_of(run).get("code") == "RUN_STOPPED" else "Execution failed"
    return "Running"


def _cursor(run: Mapping[str, Any]) -> str:
    cursor = run.get("cursor") or {}
    return f"{cursor.get('stage', '-')} / {cursor.get('step') or '-'}"


# A confirmation's context longer than this is cut in text (``--json`` has all of it).
_CONTEXT_MAX = 300


def _compact(value: Any) -> str:
    return _json_encoder.encode(value).decode("utf-8")


def _option_text(option: Mapping[str, Any]) -> str:
    oid = str(option.get("id", "?"))
    label = option.get("label")
    shown = oid if not label or label == oid else f"{oid} ({label})"
    # What the author wrote to tell options apart: attach shows it, and a person answering
    # from flow's or runs' text has only this.
    return f"{shown}: {option['description']}" if option.get("description") else shown


def _answer_command(intloom: str, run_id: str, action_id: str, answer: Any) -> str:
    # JSON as one shell word: ids and texts may hold quotes.
    return f"{intloom} answer {run_id} {action_id} {shlex.quote(_compact(answer))}"


# A pendingAction's kind, as views carry it (the reference's values).
CONFIRMATION: Final = "user_ask_confirmation"
_KIND_WORDS: Final = {CONFIRMATION: "confirmation", "user_ask_questions": "questions"}


def kind_word(action: Mapping[str, Any]) -> str:
    """A pendingAction's kind in text: "confirmation" or "questions"."""
    kind = action.get("kind", "?")
    return _KIND_WORDS.get(kind, str(kind)) if isinstance(kind, str) else "?"


def asked(run: Mapping[str, Any], *, intloom: str = "intloom"
          ) -> tuple[str, list[str], str] | None:
    """What a waiting Run asks a person: ("Confirm" or "Ask", lines saying what, and the
    ``intloom answer`` command to send an answer, placeholders in ``<...>``); None when it
    does not wait for a person. ``intloom``: how the commands begin (``intloom --project
    ROOT`` when the working directory is not in the Run's project: CliState.intloom)."""
    action = run.get("pendingAction")
    if run.get("status") != "waiting" or not isinstance(action, Mapping):
        return None
    run_id, action_id = str(run.get("runId", "?")), str(action.get("id", "?"))
    request = action.get("request")
    if action.get("kind") == CONFIRMATION:
        context = request.get("context") if isinstance(request, Mapping) else request
        text = _compact(context)
        if len(text) > _CONTEXT_MAX:
            text = f"{text[:_CONTEXT_MAX]}... (--json shows all of it)"
        command = _answer_command(intloom, run_id, action_id, {"isConfirmed": True})
        # The hint above the command, not after it: a person copies the command's whole line,
        # and "... '{...}'  (false declines; ...)" was a shell syntax error there.
        return "Confirm", [text, '(false declines; "feedback" is optional)'], command
    lines: list[str] = []
    template: list[dict[str, Any]] = []
    for question in request if isinstance(request, list) else []:
        if not isinstance(question, Mapping):
            continue
        qid = str(question.get("id", "?"))
        skip = " (skippable)" if question.get("isSkippable") else ""
        lines.append(f"{qid}{skip}: {question.get('question', '')}")
        if question.get("description"):  # as attach shows it, under the question
            lines.append(f"  {question['description']}")
        options = [o for o in question.get("options") or [] if isinstance(o, Mapping)]
        if options:
            lines.append("  options: " + " · ".join(_option_text(o) for o in options))
            ids = "|".join(str(o.get("id", "?")) for o in options)
            placeholder = options_placeholder(ids)
        else:
            placeholder = TEXT_PLACEHOLDER
        template.append({"questionId": qid, "isSkipped": False, "answer": placeholder})
    return "Ask", lines, _answer_command(intloom, run_id, action_id, template)


def asked_lines(run: Mapping[str, Any], *, intloom: str = "intloom") -> list[str]:
    """``asked(run)`` for a list of Runs (``runs``): a header naming the Run, then indented;
    for a Run waiting on a client Agent, its task (no command answers that)."""
    found = asked(run, intloom=intloom)
    call = run.get("pendingAgentCall")
    if found is None and run.get("status") == "waiting" and isinstance(call, Mapping):
        # status sends a person here for "what each waiting Run asks": a bare "waiting" row
        # left the task's id, phase and Agent to --json.
        task = _compact(call.get("request"))
        if len(task) > _CONTEXT_MAX:
            task = f"{task[:_CONTEXT_MAX]}... (--json shows all of it)"
        tools = call.get("tools")
        run_id = run.get("runId", "?")
        return [
            f"{run_id} waits on client Agent task {call.get('id', '?')} "
            f"({call.get('phase', '?')}, for Agent {str(call.get('agentId', '?'))!r}):",
            f"  task: {task}",
            *([f"  tools: {', '.join(map(str, tools))}"] if isinstance(tools, list) and tools
              else []),
            "  a client Agent claims and completes it through intloom.client.Client; "
            f"{intloom} attach {run_id} follows it",
        ]
    if found is None:
        return []
    action = run.get("pendingAction")
    action = action if isinstance(action, Mapping) else {}
    _label, what, command = found
    return [
        f"{run.get('runId', '?')} waits on {action.get('id', '?')} ({kind_word(action)}):",
        *(f"  {line}" for line in what),
        f"  answer: {command}",
    ]


def run_lines(run: Mapping[str, Any], *, suspended: bool = False,
              intloom: str = "intloom") -> list[str]:
    """A Run view for a person: title, ids, where it stands, and what to do next.
    ``suspended``: the Run's event stream ended with ``suspended`` (see ``_suspended``).
    ``intloom``: how its commands begin (see ``asked``)."""
    run_id = run.get("runId", "?")
    lines = [
        f"{run_title(run)} · {run.get('flowName', '?')}",
        f"Run     {run_id}",
        f"Cursor  {_cursor(run)}",
    ]
    if run.get("status") == "running":
        lines.append(f"Follow  {intloom} attach {run_id}")
    action = run.get("pendingAction")
    if run.get("status") == "waiting" and isinstance(action, Mapping):
        lines.append(f"Action  {action.get('id')} ({kind_word(action)})")
        found = asked(run, intloom=intloom)
        if found is not None:
            label, what, command = found
            lines.extend(f"{label if i == 0 else '':<8}{line}" for i, line in enumerate(what))
            lines.append(f"Answer  {command}")
        lines.append(f"Resume  {intloom} attach {run_id}")
    call = run.get("pendingAgentCall")
    if run.get("status") == "waiting" and isinstance(call, Mapping):
        lines.append(f"Agent   {call.get('agentId')} · task {call.get('id')} · {call.get('phase')}")
        # What was published and what comes next, as a person's wait shows its request and
        # the answer command: the task's id alone left a new user nothing to go on.
        task = _compact(call.get("request"))
        if len(task) > _CONTEXT_MAX:
            task = f"{task[:_CONTEXT_MAX]}... (--json shows all of it)"
        lines.append(f"Task    {task}")
        tools = call.get("tools")
        if isinstance(tools, list) and tools:
            lines.append(f"Tools   {', '.join(map(str, tools))}")
        # The command alone on its line, as Answer's: pasted whole, the note after it was a
        # shell syntax error at its "(".
        lines.append(f"Follow  {intloom} attach {run_id}")
        lines.append("        a client Agent claims and completes the task through "
                     "intloom.client.Client")
    if run.get("status") == "failed":
        err = _error_of(run)
        if err.get("code") == "RUN_STOPPED":
            if err.get("message") != CATALOGUE["RUN_STOPPED"][0]:
                # What the stop cut (an effect in flight) or found (a held Run): not news
                # only in the plain case.
                lines.append(f"RUN_STOPPED: {err.get('message', '')}")
            lines.append("Committed data is retained.")
        elif _suspended(run, suspended):
            # Its host stopped (or lost its log) under it: the view reads failed, as
            # IntLoom's does, but the journal ends at a saved boundary and the next start
            # restores the Run by the restart table, as its message says.
            lines.append(f"RUN_INTERRUPTED: {_error_of(run).get('message', '')}")
            lines.append(
                "Suspended by its host, not ended: committed data is retained, and the next "
                "intloom start restores the Run as said above (stop a host that still runs "
                f"first). Then follow it: {intloom} attach {run_id}"
            )
        elif run.get("dismissed"):
            lines.append(f"{err.get('code', 'UNKNOWN')}: {err.get('message', '')}")
            lines.append(
                "You dismissed it: it does not come back on a restart. Its journal keeps the "
                f"evidence: {intloom} inspect {run_id}"
            )
        elif err.get("code") == "RUN_CHECKPOINT_FAILED":
            lines.append(f"RUN_CHECKPOINT_FAILED: {err.get('message', '')}")
            lines.append(
                "Stopped by this host, not necessarily ended: the next intloom start restores "
                "the Run from its last durable checkpoint (it may wait, resume or complete, "
                "or be reported RUN_INTERRUPTED); intloom doctor previews it."
            )
        else:
            lines.append(f"{err.get('code', 'UNKNOWN')}: {err.get('message', '')}")
            lines.append(
                "Failure does not undo committed data. Inspect the results before running again."
            )
    return lines


def run_row(run: Mapping[str, Any]) -> list[str]:
    status = str(run.get("status", "?"))
    code = _error_of(run).get("code")
    if code:
        # A dismissed Run (cancel on one restored RUN_INTERRUPTED) needs nothing any more:
        # without the word, it read as one still waiting to be checked (--json has
        # "dismissed": true).
        status = f"{status} ({code}, dismissed)" if run.get("dismissed") else f"{status} ({code})"
    return [
        str(run.get("runId", "?")),
        str(run.get("flowName", "?")),
        status,
        _cursor(run).replace(" / ", "/"),
        str(run.get("updatedAt", "")),
    ]


# ----- service, diagnosis, doctor, recover -----------------------------------------------


def _ids(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


# The Run ids one line of text names: a restore that interrupted or held 30,000 Runs made
# status, start and runs print each on one line of 1.4 MB. The JSON keeps every id.
NAMED_RUNS: Final = 20


def named_runs(ids: Sequence[str], more: str, total: int | None = None) -> str:
    """``ids`` joined, the first ``NAMED_RUNS`` of them, then how many more and ``more``:
    where they are all listed. ``total``: how many there are, when ``ids`` is the first of
    them only (a host's restore lists are cut at ``RESTORE_LISTED``)."""
    named = ids[:NAMED_RUNS]
    shown = ", ".join(named)
    total = max(total or 0, len(ids))
    if total <= len(named):
        return shown
    return f"{shown} and {total - len(named)} more ({more})"


def restore_count(restore: Mapping[str, Any], key: str) -> int:
    """How many Runs the restore list ``key`` has: ``counts`` says, as a host cuts each list;
    a host before it listed them all."""
    counts = restore.get("counts")
    listed = len(_ids(restore.get(key)))
    if isinstance(counts, Mapping) and isinstance(counts.get(key), int):
        return max(int(counts[key]), listed)
    return listed


def restore_lines(restore: Mapping[str, Any] | None) -> list[str]:
    """What the last restore did, by restart-table outcome; nothing when there was nothing."""
    if not restore:
        return []
    resumed, waiting, interrupted, attention = (
        restore_count(restore, key)
        for key in ("resumed", "waiting", "interrupted", "needsAttention"))
    if not (resumed or waiting or interrupted or attention):
        return ["Restore  no unfinished Runs to restore"]
    lines = [
        f"Restore  resumed {resumed} · waiting {waiting} · "
        f"interrupted {interrupted} · needs attention {attention}"
    ]
    if interrupted:
        ids = _ids(restore.get("interrupted"))
        named = named_runs(ids, "intloom runs lists them all", interrupted)
        # One Run: its own id, ready to paste, not the placeholder.
        which = ids[0] if interrupted == 1 and len(ids) == 1 else "RUN"
        lines.append(
            f"Interrupted (RUN_INTERRUPTED, nothing replayed): {named}. "
            f"Run intloom inspect {which} to see what was in flight."
        )
    if attention:
        named = named_runs(_ids(restore.get("needsAttention")),
                           "intloom doctor lists them all", attention)
        lines.append(
            f"Needs attention (journal kept as is, not loaded): {named}. Run intloom doctor."
        )
        lines.extend(_held_why(_ids(restore.get("needsAttention")), restore.get("reasons")))
    return lines


# Reasons a start or status names for its held Runs; doctor says every one, in full.
_HELD_REASONS: Final = 3


def _held_why(ids: list[str], reasons: Any) -> list[str]:
    """Why the listed held Runs are held, one line per reason (a host before 2026-12-05
    sends none): "  Why: ..." when one reason holds them all."""
    if not isinstance(reasons, Mapping):
        return []
    groups: dict[str, list[str]] = {}
    for run_id in ids:
        why = reasons.get(run_id)
        if isinstance(why, str) and why:
            groups.setdefault(_one_line(why), []).append(run_id)
    if len(groups) == 1 and len(next(iter(groups.values()))) == len(ids):
        return [f"  Why: {next(iter(groups))}."]
    lines = [f"  {named_runs(group, 'intloom doctor lists them all')}: {why}."
             for why, group in list(groups.items())[:_HELD_REASONS]]
    if len(groups) > _HELD_REASONS:
        more = len(groups) - _HELD_REASONS
        lines.append(f"  And {more} more reason{'' if more == 1 else 's'} (intloom doctor).")
    return lines


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _workflow_problem_lines(problems: list[Mapping[str, Any]], loaded: Any = None
                            ) -> list[str]:
    """One line per Workflow source that failed to load, then what it means: the host runs
    the others (``loaded`` of them; when none loaded, it serves no Workflow), and holds the
    Runs of a broken one until it loads."""
    if not problems:
        return []
    lines = [
        f"Failed to load {p.get('source', '?')} · {p.get('code', '?')}: "
        f"{_one_line(str(p.get('message', '')))}"
        for p in problems
    ]
    others = ("No Workflow loaded, so no Run can be started." if loaded == 0
              else "The other Workflows run.")
    lines.append(
        f"{others} Runs of a Workflow that failed to load are held (not restored) until it "
        "loads: fix the source, then intloom stop and intloom start."
    )
    return lines


def service_lines(service: Mapping[str, Any], title: str = "Service running") -> list[str]:
    lines = [
        f"{title} · {service.get('projectRoot', '?')}",
        f"127.0.0.1:{service.get('port', '?')} · PID {service.get('pid', '?')} · "
        f"instance {service.get('instanceId', '?')}",
    ]
    if service.get("packageVersion"):
        lines.append(
            f"Started {service.get('startedAt', '?')} · intloom {service['packageVersion']}"
        )
    problems = [p for p in service.get("workflowProblems") or [] if isinstance(p, Mapping)]
    if "workflowCount" in service:
        failed = f" · {len(problems)} failed to load" if problems else ""
        lines.append(f"Workflows {service['workflowCount']} loaded{failed}")
    lines.extend(_workflow_problem_lines(problems, service.get("workflowCount")))
    if service.get("workflowCount") == 0 and "workflowProblems" in service and not problems:
        # An empty intloom.toml (or workflows = []) read "Workflows 0 loaded" and no more,
        # until a flow failed NOT_FOUND; doctor said it, this did not.
        lines.append("No Workflow source was listed in intloom.toml when the host started, so "
                     "no Run can be started: "
                     'add one (e.g. workflows = ["workflows/example.py"]), then intloom stop '
                     "and intloom start.")
    lines.append(
        f"Runs running {service.get('runningRuns', 0)} · waiting {service.get('waitingRuns', 0)}"
        f" · completed {service.get('completedRuns', 0)} · failed or stopped "
        f"{service.get('failedRuns', 0)}"
    )
    if service.get("waitingRuns"):
        # The count alone left a person to guess where the questions are.
        lines.append("Waiting  intloom runs shows what each waiting Run asks, and the command "
                     "that answers it")
    store_problems = [p for p in service.get("storeProblems") or [] if isinstance(p, Mapping)]
    for problem in store_problems[:NAMED_RUNS]:
        lines.append(f"Store file .intloom/runtime/{problem.get('path', '?')} · "
                     f"{problem.get('kind', '?')}: {problem.get('problem', '?')}")
    omitted = service.get("storeProblemsOmitted")
    more = len(store_problems[NAMED_RUNS:]) + (omitted if isinstance(omitted, int) else 0)
    if more > 0:
        lines.append(f"Store files  and {more} more (intloom doctor lists them all)")
    if any(p.get("kind") != "missing" for p in store_problems):
        lines.append("Damaged and unexpected files are kept byte-identical and read past; "
                     "intloom doctor says what each means and what to do.")
    missing = {str(p.get("path", "")).partition("/")[0] for p in store_problems
               if p.get("kind") == "missing" and p.get("path") != "snap/live"}
    if "snap" in missing:
        lines.append("A missing snapshot was rebuilt from the log and written again.")
    if any(p.get("kind") == "missing" and p.get("path") == "snap/live" for p in store_problems):
        lines.append("Snapshots were lost with every record of their Runs, which were not "
                     "restored; intloom doctor says how to put them back.")
    restore = service.get("restore")
    held = (restore_count(restore, "needsAttention") if isinstance(restore, Mapping)
            else None)
    if "wal" in missing:
        # "Those Runs are held" only when the restore held some: it was said of none.
        lines.append("A missing or emptied segment may have held Runs' records"
                     + (": those Runs are held" if held != 0 else "")
                     + "; put the file back from a copy (intloom doctor).")
    if service.get("logFile"):
        lines.append(f"Log {service['logFile']}")
    if service.get("logError"):
        lines.append(f"Log error {service['logError']} New work is refused; run intloom stop.")
    if service.get("journalError"):
        fix = (f"; {service['journalFix']};" if service.get("journalFix") else
               ", free space on the disk that holds .intloom/runtime (or fix it),")
        lines.append(f"Journal error {service['journalError']}. Every checkpoint fails until "
                     f"the host restarts: run intloom stop{fix} then intloom start.")
    if service.get("compactionError"):
        lines.append(f"Compaction {service['compactionError']}")
    lines.extend(restore_lines(restore if isinstance(restore, Mapping) else None))
    return lines


def changed_lines(changed: Sequence[Mapping[str, Any]], new_run: str | None = None
                  ) -> list[str]:
    """A running host's Workflows against the project on disk (``start`` reusing it,
    ``status``, ``flow`` for its Workflow: ``new_run``, the Run it created), and what to
    do about it."""
    if not changed:
        return []
    from intloom.client.drift import held_after  # only when something changed

    lines = [f"Changed  {c['message']}" for c in changed]
    held = held_after({str(c["change"]) for c in changed})
    runs = ("New Runs use" if new_run is None else
            f"Run {new_run}, like every new Run, uses")
    lines.append(
        f"{runs} what the host loaded when it started. To load the change: intloom stop, "
        "then intloom start" + (f"; {held} (intloom doctor lists them)." if held else "."))
    return lines


# How a stopping host's refusal begins (the server adds what to do).
CLOSING = CATALOGUE["CLI_SERVICE_CLOSING"][0].rstrip(".")

_OWNER_STATUS = {
    "alive": "Process still exists",
    "gone": "Process has exited",
    "absent": "Process has exited",
    "unknown": "Unknown",
}


def _evidence_lines(evidence: Any, indent: str = "    ") -> list[str]:
    """What was checked to reach a verdict, one ``check: found`` line each."""
    if isinstance(evidence, str):
        return [indent + evidence]
    lines = []
    for item in evidence if isinstance(evidence, list) else []:
        if isinstance(item, Mapping):
            lines.append(f"{indent}{item.get('check', '?')}: {item.get('found', '')}")
    return lines


_TO_DOCTOR: Final = "Run intloom doctor."
# In doctor's own output: its checks, printed next, are what running it would say.
_IN_DOCTOR: Final = "Each check below says what to do next."


def diagnosis_lines(diagnosis: Mapping[str, Any], *, in_doctor: bool = False) -> list[str]:
    service = diagnosis.get("service")
    if diagnosis.get("status") == "running" and isinstance(service, Mapping):
        return service_lines(service)
    lines = [str(diagnosis.get("message", diagnosis.get("status", "?")))]
    for owner in diagnosis.get("owners") or []:
        if not isinstance(owner, Mapping):
            continue
        state = _OWNER_STATUS.get(str(owner.get("status")), str(owner.get("status")))
        lines.append(f"{owner.get('resource', '?')} · PID {owner.get('pid', '?')} · {state}")
        lines.extend(_evidence_lines(owner.get("evidence")))
    owners = [o for o in diagnosis.get("owners") or [] if isinstance(o, Mapping)]
    passing = str(diagnosis.get("message", "")).startswith((CLOSING, STARTING))
    # Only where an owner may still be alive: a host starting or shutting down says what to
    # do itself, and with every owner gone (a foreign program on the port) no lock is anyone's.
    if (diagnosis.get("status") == "blocked" and not passing
            and (not owners or any(o.get("status") not in ("gone", "absent") for o in owners))):
        advice = _IN_DOCTOR if in_doctor else _TO_DOCTOR
        if not in_doctor and lines[0].endswith(_TO_DOCTOR):
            advice = ""  # the message just said it (a host that is not the one named)
        lines.append(f"{advice} Do not delete locks whose owners are still active.".lstrip())
    return lines


def doctor_lines(report: Mapping[str, Any]) -> list[str]:
    lines = diagnosis_lines(report, in_doctor=True)
    if report.get("startProblem"):
        # Right under "offline. Run intloom start.", as status prints it: the check that
        # names it (config, runtime_dir) may come several lines later.
        lines.append(str(report["startProblem"]))
    for check in report.get("checks") or []:
        if not isinstance(check, Mapping):
            continue
        name = check.get("id", check.get("name", "?"))
        lines.append(f"{name} · {check.get('status', '?')}: {check.get('message', '')}")
        step = check.get("next", check.get("nextStep"))
        if step:
            lines.append(f"  next: {step}")
    previews = [p for p in report.get("runs") or [] if isinstance(p, Mapping)]
    if previews:
        lines.append("Unfinished Runs, and what a restart would do:")
    # Those that need a person first; the rest, past DOCTOR_RUNS_SHOWN, only counted (30,000
    # held Runs printed 10.8 MB of lines; the journals check above counts every row).
    previews.sort(key=lambda p: not _needs_a_person(p))
    for preview in previews[:DOCTOR_RUNS_SHOWN]:
        verdict = _verdict(preview)
        journal = f" · journal {preview['journal']}" if preview.get("journal") else ""
        lines.append(
            f"  {preview.get('runId', '?')}{journal} · {verdict.get('row', '?')}: "
            f"{verdict.get('reason', '')}"
        )
        if preview.get("problem"):
            lines.append(f"    {preview['problem']}")
    rest = previews[DOCTOR_RUNS_SHOWN:]
    if rest:
        rows = Counter(str(_verdict(p).get("row", "?")) for p in rest)
        counted = ", ".join(f"{n:,} {row}" for row, n in sorted(rows.items()))
        lines.append(f"  ... and {len(rest):,} more ({counted}): intloom doctor --json lists "
                     "every Run with its reason.")
    return lines


# How many unfinished Runs doctor's text names one by one.
DOCTOR_RUNS_SHOWN: Final = 50
# The rows a restart goes on with by itself; any other (interrupted), or a Run with a
# problem (held, corrupt), needs a person and is listed first.
_GOES_ON: Final = frozenset({"resume", "route", "restore_wait", "recover"})


def _verdict(preview: Mapping[str, Any]) -> Mapping[str, Any]:
    verdict = preview.get("verdict")
    return verdict if isinstance(verdict, Mapping) else {}


def _needs_a_person(preview: Mapping[str, Any]) -> bool:
    return bool(preview.get("problem")) or _verdict(preview).get("row") not in _GOES_ON


def _kept_lines(result: Mapping[str, Any]) -> list[str]:
    """The temp files of interrupted writes that recover found and left as they are."""
    kept = [str(t.get("path", "?")) for t in result.get("leftovers") or []
            if isinstance(t, Mapping)]
    if not kept:
        return []
    if len(kept) == 1:
        return [f"Kept as it is: {kept[0]}, the temp file of a write that was interrupted "
                "(recover never removes it; intloom doctor says more)."]
    return [f"Kept as they are: {', '.join(kept)}, temp files of writes that were "
            "interrupted (recover never removes them; intloom doctor says more)."]


def recover_lines(result: Mapping[str, Any]) -> list[str]:
    paths = [str(p) for p in result.get("paths") or []]
    if result.get("dryRun"):
        plan = ", ".join(paths) if paths else "no stale resources"
        lines = [f"Recovery plan: {plan}. No cleanup performed."]
        for item in result.get("plan") or []:
            if isinstance(item, Mapping):
                lines.append(f"  {item.get('path', '?')}")
                lines.extend(_evidence_lines(item.get("evidence")))
        return lines + _kept_lines(result)
    if result.get("recovered"):
        return [
            f"Removed: {', '.join(paths)}." if paths else "Removed stale service resources.",
            "Stale execution resources removed. Run intloom start; committed data is retained.",
            *_kept_lines(result),
        ]
    return ["There are no stale resources to clean up.", *_kept_lines(result)]


# ----- journal history and logs ----------------------------------------------------------

# Shown in their own columns, or too long to help in a table (--json has every field).
_RECORD_SKIP = frozenset(
    {"phase", "at", "state", "run_id", "identity", "schemas", "package_version", "protocol"}
)
_SUMMARY_MAX = 80


def _summary(record: Mapping[str, Any]) -> str:
    """The fields of a record that say what happened, as ``key=value``, kept short."""
    parts = []
    for key, value in record.items():
        if key in _RECORD_SKIP or value is None:
            continue
        if isinstance(value, Mapping | list):
            value = _json_encoder.encode(value).decode("utf-8")
        parts.append(f"{key}={value}")
    text = " ".join(parts)
    return text if len(text) <= _SUMMARY_MAX else text[: _SUMMARY_MAX - 3] + "..."


def history_rows(entries: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """One row per journal entry: seq, phase, time, what it says, its checks, where it is."""
    return [history_row(entry) for entry in entries]


def history_row(entry: Mapping[str, Any]) -> list[str]:
    """``history_rows``'s row for one entry."""
    record = entry.get("record")
    record = record if isinstance(record, Mapping) else {}
    what = _summary(record)
    if entry.get("problem"):
        what = f"{what} ({entry['problem']})".strip()
    return [
        str(entry.get("seq", "?")),
        str(entry.get("phase") or record.get("phase") or "?"),
        str(entry.get("at") or record.get("at") or ""),
        what,
        f"{entry.get('checksum', '?')}/{entry.get('verdict', '?')}",
        f"{entry.get('file', '?')}@{entry.get('offset', '?')}",
    ]


_TIME_KEYS = ("time", "ts", "at", "timestamp")
_LEVEL_KEYS = ("level", "lvl")
_EVENT_KEYS = ("event", "msg", "message")


def _first(record: Mapping[str, Any], keys: Sequence[str]) -> tuple[str | None, Any]:
    for key in keys:
        if key in record:
            return key, record[key]
    return None, None


def log_line(record: Mapping[str, Any]) -> str:
    """``time level event key=value ...`` for one structured log record."""
    time_key, time = _first(record, _TIME_KEYS)
    level_key, level = _first(record, _LEVEL_KEYS)
    event_key, event = _first(record, _EVENT_KEYS)
    used = {time_key, level_key, event_key}
    rest = []
    for key, value in record.items():
        if key in used:
            continue
        if isinstance(value, Mapping | list | bool) or value is None:  # as the JSONL says
            value = _json_encoder.encode(value).decode("utf-8")
        rest.append(f"{key}={value}")
    head = f"{time or '-'} {level or '-'!s:<7} {event or '-'}"  # "warning" is 7
    return f"{head} {' '.join(rest)}".rstrip()
