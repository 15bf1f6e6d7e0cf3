"""What a person hands the CLI besides options: an intent, an answer, a terminal or not."""

from __future__ import annotations

import sys
from typing import Any, Final

import msgspec

from intloom.errors import IntloomError, a_an, quoted
from intloom.project import locale_misreads

__all__ = ["MAX_INPUT", "interactive", "read_answer", "read_intent"]

# Far above any real intent or answer, far below the protocol's frame cap, and it stops
# ``--intent-file /dev/zero`` from reading forever.
MAX_INPUT: Final = 1 << 20
# What is read past the limit: a last line break ("\r\n" at most), which is not part of an
# intent, and one byte to tell that more follows.
_READ: Final = MAX_INPUT + 3

ANSWER_SHAPES: Final = (
    'A confirmation answer is {"isConfirmed": true, "feedback": "optional text"}; a questions '
    'answer is [{"questionId": "q1", "isSkipped": false, "answer": "text"}, ...].'
)


def interactive(json_mode: bool) -> bool:
    """Prompts are allowed: not JSON mode, and both stdin and stderr are terminals."""
    if json_mode:
        return False
    try:
        return sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


# What to do instead, by what was too large.
_TOO_LARGE: Final = {
    "intent file": "Put large input in a file your Steps read, and pass its path (or a short "
                   "description) as the intent.",
    "answer": "Put large text in a file the Step can read, and give its path as the answer's "
              "text (a question's answer, or a confirmation's feedback).",
}


# How to hand the CLI what stdin could not, by what was read.
_INSTEAD: Final = {
    "intent file": "pass --intent TEXT or --intent-file PATH",
    "answer": "pass the answer as the ANSWER argument",
}


def _read_stdin(code: str, what: str, hint: bool) -> bytes:
    # A script or service manager may start the CLI without descriptor 0 (``<&-``): Python
    # then has no sys.stdin at all, and a descriptor it has may still fail to read.
    stdin = sys.stdin
    try:
        if stdin is None:
            raise OSError("stdin is closed")
        if hint and _is_terminal(stdin):
            # Nothing piped in: the read waits for the person to type it, and a silent
            # cursor looked like a hung command.
            noun = what.removesuffix(" file")
            sys.stderr.write(f"Reading the {noun} from stdin: type or paste it, then press "
                             "Ctrl-D on a line of its own (Ctrl-C cancels).\n")
            sys.stderr.flush()
        return stdin.buffer.read(_READ)
    except (OSError, ValueError) as exc:
        fact = ("stdin is closed" if stdin is None or isinstance(exc, ValueError)
                else f"{exc.strerror or exc}")
        raise IntloomError(
            code, f"The {what} could not be read from stdin (-): {fact}; nothing was sent. "
            f"Pipe it in (... | intloom ...), or {_INSTEAD[what]}."
        ) from None


def _read_bytes(source: str, code: str, what: str, *, hint: bool = True) -> bytes:
    """``hint``: say on stderr, when stdin is a terminal, how to end what is typed (a
    person's note: never with --json, whose stderr holds at most its error document)."""
    if source == "-":
        data = _read_stdin(code, what, hint)
        # "intent file" names a path; what stdin held is the intent itself.
        subject = f"The {what.removesuffix(' file')} read from stdin (-)"
    else:
        subject = f"The {what} {source}"
        try:
            with open(source, "rb") as fh:
                data = fh.read(_READ)
        except OSError as exc:
            raise IntloomError(
                code, f"The {what} {source} could not be read ({exc.strerror}). Check the path."
            ) from None
    # The line break echo and editors end a file with is dropped from an intent, so it does
    # not count: a file holding an intent of exactly the limit, which the host takes, was
    # refused for its newline.
    if len(data) == _READ or len(data.removesuffix(b"\n").removesuffix(b"\r")) > MAX_INPUT:
        raise IntloomError(
            code, f"{subject} is larger than the {MAX_INPUT:,}-byte limit; nothing was sent. "
            f"{_TOO_LARGE[what]}")
    return data


class UsageError(IntloomError):
    """A command line whose options contradict each other: ``INVALID_REQUEST``, and exit 2
    (``USAGE``) like any command line that could not be parsed."""

    usage = True

    def __init__(self, message: str) -> None:
        super().__init__("INVALID_REQUEST", message)


def _prompt_intent() -> str:
    """The intent typed at the prompt, asked for again while it is blank, saying why: at a
    terminal the person can just type it, where a failed command has them start over.
    Ctrl-C or EOF gives up (``KeyboardInterrupt``, ``typer.Abort``).

    attach's prompts ask it, on stderr: ``typer.prompt(err=True)`` wrote the prompt's last
    space to stdout, which holds only results (``flow > run.txt`` began with it)."""
    from intloom.cli.prompts import Terminal

    term = Terminal()
    term.instead = "--intent-file FILE (- reads standard input)"
    try:
        while True:
            text = term.ask("Intent")
            if text.strip():
                return text
            term.say("The intent is blank: say what the Run is for (Ctrl-C gives up).")
    finally:
        term.close()


def read_intent(intent: str | None, intent_file: str | None, *, prompt: bool,
                hint: bool = True) -> str:
    """The intent from --intent, --intent-file (``-`` is stdin) or, on a terminal, a prompt.
    ``hint``: as for ``read_answer``."""
    if intent is not None and intent_file is not None:
        raise UsageError("--intent and --intent-file are mutually exclusive; pass one.")
    if intent_file is not None:
        data = _read_bytes(intent_file, "CLI_INTENT_FILE_INVALID", "intent file", hint=hint)
        try:
            # The newline ``echo`` and editors add is not part of what was meant.
            text = data.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise IntloomError(
                "CLI_INTENT_FILE_INVALID",
                f"The intent file {intent_file} is not UTF-8 text. Save it as UTF-8.",
            ) from None
        if not text.strip():
            fact, fix = ((f"The intent file {intent_file} is empty or blank", "Write what the "
                          "Run is for in it") if intent_file != "-" else
                         ("The intent read from stdin (-) is empty or blank",
                          "Pipe in what the Run is for"))
            raise IntloomError("INVALID_REQUEST",
                               f"{fact}; nothing was sent. {fix}, or pass --intent TEXT.")
    elif intent is not None:
        text = intent
    elif prompt:
        text = _prompt_intent()
    else:
        raise IntloomError(
            "INVALID_REQUEST",
            "A Run needs an intent: pass --intent TEXT or --intent-file PATH (- reads stdin).",
        )
    if not text.strip():
        raise IntloomError("INVALID_REQUEST", "The intent is blank. Say what the Run is for.")
    return text


def _lone_surrogate(data: bytes) -> str | None:
    """Where ANSWER escapes half a surrogate pair (``"\\ud800"``): JSON's grammar allows it,
    msgspec refuses it with a reason that names something else ("Input data was truncated"),
    and no text can hold it. The standard library's decoder keeps the half, so it can say
    where; None when the answer has no such escape."""
    # Imported here: every command imports this module (app.py), and only a refused
    # answer needs the JSON decoder or the client's encoder checks (~8 ms at start-up).
    import json

    from intloom.client.outgoing import not_unicode_at

    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return not_unicode_at(value, "ANSWER")


# The placeholders of the answer command that flow, answer and runs print (render.asked),
# for the person to fill in.
TEXT_PLACEHOLDER: Final = "<text>"
_OPTIONS_END: Final = " or text>"


def options_placeholder(ids: str) -> str:
    return f"<{ids}{_OPTIONS_END}"


def _unfilled(value: Any) -> tuple[str, str] | None:
    """(question id, placeholder) of the first entry of a questions answer whose answer is
    still a placeholder of the printed command: sent as it was, the host took "<text>" as
    the person's answer (the first valid answer wins, for good) and the Step routed on it."""
    if not isinstance(value, list):
        return None
    for entry in value:
        text = entry.get("answer") if isinstance(entry, dict) else None
        if isinstance(text, str) and (text == TEXT_PLACEHOLDER or (
                text.startswith("<") and text.endswith(_OPTIONS_END))):
            return str(entry.get("questionId")), text
    return None


class _Members(list[tuple[str, Any]]):
    """A JSON object's members as written, in order, repeated names kept (``_twice``)."""


def _twice(data: bytes) -> tuple[str, str] | None:
    """(where, name) of the first object in ``data`` (valid JSON) that names a member twice.
    msgspec, like most readers, keeps the last one, others the first (RFC 8259, section 4:
    "unpredictable"): {"isConfirmed": true, "isConfirmed": false} was taken as declined."""
    # Imported here: only an answer needs it (see _lone_surrogate).
    import json

    try:
        value = json.loads(data, object_pairs_hook=_Members)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[Any, str]] = [(value, "ANSWER")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, _Members):
            seen: set[str] = set()
            for name, _ in item:
                if name in seen:
                    return path, name
                seen.add(name)
            parts = [(member, f"{path}.{name}") for name, member in item]
        elif isinstance(item, list):
            parts = [(member, f"{path}[{i}]") for i, member in enumerate(item)]
        else:
            continue
        stack.extend(reversed(parts))  # in order: the first repeat is named
    return None


def read_answer(answer: str, *, hint: bool = True) -> Any:
    """ANSWER as JSON (``-`` reads it from stdin); INVALID_REQUEST naming the shapes otherwise.
    ``hint``: say how to end an answer typed at a terminal (False with --json: its stderr
    holds nothing but an error document)."""
    if answer == "-":
        data = _read_bytes("-", "INVALID_REQUEST", "answer", hint=hint)
    else:
        try:
            data = answer.encode("utf-8")
        except UnicodeEncodeError:
            misread = locale_misreads(answer)
            if misread is not None:
                raise IntloomError(
                    "INVALID_REQUEST", f"ANSWER cannot be read: {misread}. Nothing was sent.",
                ) from None
            # argv bytes that are not UTF-8 reach Python as lone surrogates.
            raise IntloomError(
                "INVALID_REQUEST",
                "ANSWER holds bytes that are not UTF-8 text, as the command line passed them; "
                "nothing was sent. Pass the answer as UTF-8 text (set a UTF-8 locale, or "
                "write it to a UTF-8 file and pass - to read it from stdin).",
            ) from None
    # A file an editor saved as "UTF-8 with BOM" (Notepad, PowerShell's Out-File) and piped
    # in was refused as "invalid character (byte 0)", a byte the person cannot see; JSON
    # lets a reader ignore it (RFC 8259, section 8.1), and outside a string it means nothing.
    data = data.removeprefix(b"\xef\xbb\xbf")
    if not data.strip():
        raise IntloomError("INVALID_REQUEST", f"ANSWER is empty. {ANSWER_SHAPES}")
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        where = _lone_surrogate(data)
        if where is not None:
            raise IntloomError(
                "INVALID_REQUEST",
                f"{where} holds a lone surrogate escape (one half of a \\uXXXX pair, such as "
                "\\ud800 alone), which is not valid Unicode text; nothing was sent. Write the "
                "character itself, or both halves of its pair (\\ud83d\\ude00 is one character).",
            ) from None
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            # Only stdin can get here (argv is refused above). A UTF-16 file, what Windows
            # PowerShell's > writes, was called "not JSON" or "Invalid UTF-8 encoded string".
            utf16 = data.startswith((b"\xff\xfe", b"\xfe\xff"))
            what = ("it begins with a UTF-16 byte order mark: the file is UTF-16, as Windows "
                    "PowerShell's > writes it" if utf16 else
                    f"byte {bad.start:,} is 0x{data[bad.start]:02x}")
            how = ("iconv -f UTF-16 -t UTF-8, or Out-File -Encoding utf8" if utf16 else
                   "iconv -f ITS-ENCODING -t UTF-8")
            raise IntloomError(
                "INVALID_REQUEST",
                f"The answer read from stdin (-) is not UTF-8 text ({what}); nothing was sent. "
                f"Save it as UTF-8 ({how}) and pass it again.",
            ) from None
        if data.lstrip()[:1] not in (b"[", b"{"):
            # The answer's text alone (`intloom answer RUN ACTION fix`): msgspec's reason
            # ("Input data was truncated", "invalid character (byte 0)") says nothing of that.
            text = data.decode("utf-8", "replace").strip()
            shown = text if len(text) <= 40 else f"{text[:40]}..."
            raise IntloomError(
                "INVALID_REQUEST",
                f"ANSWER {shown!r} is not JSON: ANSWER is the whole answer as JSON, and a "
                f'question\'s text goes in its "answer" field; nothing was sent. {ANSWER_SHAPES} '
                "intloom runs prints the command to fill in for each waiting Run.",
            ) from None
        raise IntloomError(
            "INVALID_REQUEST", f"ANSWER is not valid JSON ({exc}). {ANSWER_SHAPES}"
        ) from None
    except RecursionError:
        # msgspec's decoder recurses per level, so its depth limit is the interpreter's.
        raise IntloomError(
            "INVALID_REQUEST", f"ANSWER is nested too deeply to read. {ANSWER_SHAPES}"
        ) from None
    twice = _twice(data) if b"{" in data else None
    if twice is not None:
        where, name = twice
        member = msgspec.json.encode(name).decode()
        raise IntloomError(
            "INVALID_REQUEST",
            f"{where} has the member {member} twice, so which one counts is unclear (JSON "
            "readers differ: some keep the first, some the last); nothing was sent. Keep one "
            f"{member} and send the answer again.",
        )
    unfilled = _unfilled(value)
    if unfilled is not None:
        qid, text = unfilled
        raise IntloomError(
            "INVALID_REQUEST",
            f"The answer to question {qid!r} is still the placeholder {text!r} of the printed "
            "answer command; nothing was sent. Replace it with the answer (an option's id, or "
            f'your text), or, for a skippable question, send {{"questionId": "{qid}", '
            '"isSkipped": true}.',
        )
    return value


# Per id argument: what it names, its shape, and where to find one.
_IDS: Final = {
    "RUN": ("Run", "RUN-<UTC>-<random>", "intloom runs lists the current host's Runs"),
    "ACTION": ("action", "ASK-<random>", "intloom runs shows what each waiting Run asks, with "
               "the command that answers it"),
}


def run_id_problem(run_id: str, done: str = "nothing was read") -> IntloomError | None:
    """INVALID_REQUEST for a RUN that is empty, blank, or whose command-line bytes are not
    UTF-8 (they reach Python as lone surrogates), else None. ``done``: what that leaves
    undone (``nothing was sent`` for a command that asks the host). An empty id was
    NOT_FOUND from the host, "Run '' is not known", where an empty ACTION was a bad
    argument; bytes that are not UTF-8 failed reading the store CLI_INTERNAL_ERROR (exit 70),
    and logs said it had "no log records about" it, exit 0."""
    return id_problem("RUN", run_id, done)


def action_id_problem(action_id: str) -> IntloomError | None:
    """``run_id_problem`` for ``answer``'s ACTION."""
    return id_problem("ACTION", action_id, "nothing was sent")


def id_problem(arg: str, value: str, done: str) -> IntloomError | None:
    """INVALID_REQUEST naming id argument ``arg`` (RUN, ACTION) when ``value`` is empty,
    blank or not UTF-8, which no id is, with what an id looks like and where to find one."""
    noun, shape, where = _IDS[arg]
    if not value.strip():
        fact = "is empty" if not value else f"{quoted(value)!r} is blank (only whitespace)"
        return IntloomError("INVALID_REQUEST", f"{arg} {fact}; {done}. Pass the {noun}'s id "
                            f"({shape}; {where}).")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        misread = locale_misreads(value)
        fact = (f"cannot be read: {misread}" if misread is not None else
                "holds bytes that are not UTF-8 text, as the command line passed them, and no "
                f"{noun} id does ({a_an(noun)} id is {shape}, in ASCII)")
        return IntloomError("INVALID_REQUEST", f"{arg} {quoted(value)!r} {fact}; {done}. Check the "
                            f"{noun} id ({where}).")
    return None
