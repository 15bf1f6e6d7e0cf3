"""The prompts' ``Terminal`` on a pty in this process: a line is read once typed; a wake
makes the prompt run its check, which may drop it, and what was typed at a dropped prompt
never answers the next one."""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
import typer

from intloom.cli.prompts import Terminal

pytestmark = pytest.mark.timeout(30)
T = TypeVar("T")


class Gone(Exception):
    pass


@pytest.fixture
def pty_pair() -> Iterator[tuple[int, Terminal]]:
    """The pty's leader (what a person types into) and a Terminal reading its follower."""
    leader, follower = os.openpty()
    term = Terminal(follower)
    try:
        yield leader, term
    finally:
        term.close()
        os.close(follower)
        os.close(leader)


def echoed(leader: int, text: bytes) -> None:
    """Until the terminal echoes ``text``: it is in the line being typed."""
    seen, deadline = b"", time.monotonic() + 10
    while text not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, seen
        if select.select([leader], [], [], remaining)[0]:
            seen += os.read(leader, 1024)


def in_turn(leader: int, capsys: pytest.CaptureFixture[str], prompt: str,
            lines: list[bytes], call: Callable[[], T]) -> tuple[list[T], list[BaseException],
                                                                str]:
    """``call`` on a thread, each of ``lines`` typed once ``prompt`` was shown for it, as a
    person types (lines typed at once are a paste, which a prompt refuses): what it
    returned, what it raised, and what it told on stderr. Nothing is on stdout, which
    holds results only."""
    got: list[T] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            got.append(call())
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    told, out, deadline = "", "", time.monotonic() + 10
    for n, line in enumerate(lines, 1):
        while told.count(prompt) < n:
            assert time.monotonic() < deadline and thread.is_alive(), (told, failures)
            captured = capsys.readouterr()
            told, out = told + captured.err, out + captured.out
            time.sleep(0.01)  # a poll of the captured stderr
        os.write(leader, line)
    thread.join(10)
    captured = capsys.readouterr()
    assert out + captured.out == "", out + captured.out
    return got, failures, told + captured.err


def test_a_typed_line_is_the_answer(pty_pair: tuple[int, Terminal]) -> None:
    leader, term = pty_pair
    os.write(leader, "  fix it é\r".encode())
    assert term.line("Q: ") == "  fix it é"


def test_a_wake_whose_check_passes_keeps_the_prompt(pty_pair: tuple[int, Terminal]) -> None:
    leader, term = pty_pair
    checks: list[int] = []
    term.check = lambda: checks.append(1)
    term.wake()
    term.wake()  # wakes coalesce: one check is enough
    os.write(leader, b"y\r")
    assert term.confirm("Confirm?") is True
    assert checks == [1]


@pytest.mark.parametrize("raised", [Gone, KeyboardInterrupt])
def test_a_dropped_prompt_forgets_what_was_typed_at_it(
    pty_pair: tuple[int, Terminal], raised: type[BaseException],
) -> None:
    """Whatever its check raises. A KeyboardInterrupt there (a SIGTERM taken as Ctrl-C, which
    flushes nothing as a typed Ctrl-C does) left the half-typed answer in the terminal, for
    the shell to read as a command once the CLI exited."""
    leader, term = pty_pair
    os.write(leader, b"rm")  # no Enter
    echoed(leader, b"rm")

    def check() -> None:
        raise raised

    term.check = check
    term.wake()
    with pytest.raises(raised):
        term.line("Q: ")
    term.check = lambda: None
    os.write(leader, b"y\r")
    assert term.line("Confirm? [y/n]: ") == "y"  # not "rmy"


def test_eof_aborts_ending_the_prompts_line(pty_pair: tuple[int, Terminal],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """EOF (or Ctrl-C) at a prompt left its line open: attach's next words, that it
    detached, were printed on it, "Confirm? [y/n]: Detached from RUN-..."."""
    import typer

    leader, term = pty_pair
    os.write(leader, b"\x04")
    with pytest.raises(typer.Abort):
        term.ask("Feedback")
    assert capsys.readouterr().err == "Feedback: \n"


def test_a_wake_after_close_is_ignored(pty_pair: tuple[int, Terminal]) -> None:
    _, term = pty_pair
    term.close()
    term.wake()  # the follower thread may outlive the prompts: never writes a reused fd


def test_a_confirmation_typed_wrong_says_what_to_type(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str]
) -> None:
    """"maybe" at ``Confirm? [y/n]`` said only "Error: invalid input": not what was
    refused, nor what to type instead."""
    leader, term = pty_pair
    got, failures, told = in_turn(leader, capsys, "Confirm? [y/n]: ",
                                  [b"Maybe\r", b"x" * 500 + b"\r", b"n\r"],
                                  lambda: term.confirm("Confirm?"))
    assert got == [False] and not failures, (got, failures, told)
    assert "invalid input" not in told, told
    # As typed (it was shown lower-cased), and a long line only by its start.
    assert "'Maybe' is not an answer: type y (yes) or n (no)" in told, told
    assert f"'{'x' * 40}…' is not an answer" in told and "x" * 41 not in told, told


def test_a_confirmation_with_sigint_ignored_names_ctrl_d_not_ctrl_c(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str]
) -> None:
    """Started with SIGINT ignored (a shell's `trap '' INT`, a script's `cmd &`), the prompt
    said "Ctrl-C detaches", and Ctrl-C did nothing however often it was pressed."""
    leader, term = pty_pair
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # then Ctrl-D: EOF at the prompt asked again
        got, failures, told = in_turn(leader, capsys, "Confirm? [y/n]: ",
                                      [b"maybe\r", b"\x04"], lambda: term.confirm("Confirm?"))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert got == [] and [type(f) for f in failures] == [typer.Abort], (got, failures)
    assert "type y (yes) or n (no); Ctrl-D detaches and leaves the Run waiting." in told, told
    got, failures, told = in_turn(leader, capsys, "Confirm? [y/n]: ", [b"maybe\r", b"y\r"],
                                  lambda: term.confirm("Confirm?"))
    assert got == [True] and not failures, (got, failures)
    assert "Ctrl-C detaches and leaves the Run waiting." in told, told


@pytest.mark.parametrize("blank", [b"   ", b""])
def test_a_blank_intent_at_the_prompt_is_asked_again_saying_why(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, blank: bytes,
) -> None:
    """``flow`` on a terminal without --intent: a line of spaces failed the command
    (INVALID_REQUEST, "The intent is blank"), and Enter alone was asked again without a word."""
    from intloom.cli.inputs import read_intent

    leader, term = pty_pair
    stdin = os.fdopen(os.dup(term._fd), "r", encoding="utf-8")
    monkeypatch.setattr("sys.stdin", stdin)
    try:
        got, failures, told = in_turn(leader, capsys, "Intent: ",
                                      [blank + b"\r", b"fix the release\r"],
                                      lambda: read_intent(None, None, prompt=True))
    finally:
        stdin.close()
    assert got == ["fix the release"] and not failures, (got, failures, told)
    assert told.count("Intent: ") == 2, told  # asked again
    assert "The intent is blank: say what the Run is for" in told, told
    # (in_turn: stdout holds results only; it held the prompt's last space)


def test_the_intent_prompt_given_up_ends_its_line(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``flow`` on a terminal, EOF or Ctrl-C at ``Intent:``: "Interrupted." was written on
    the prompt's line, "Intent: Interrupted.", and the prompt's last space on stdout."""
    import typer

    from intloom.cli.inputs import read_intent

    leader, term = pty_pair
    stdin = os.fdopen(os.dup(term._fd), "r", encoding="utf-8")
    monkeypatch.setattr("sys.stdin", stdin)
    try:
        os.write(leader, b"\x04")
        with pytest.raises(typer.Abort):
            read_intent(None, None, prompt=True)
    finally:
        stdin.close()
    told = capsys.readouterr()
    assert (told.out, told.err) == ("", "Intent: \n")


def test_keys_typed_before_an_action_is_asked_do_not_answer_it(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str],
) -> None:
    """A "y" and Enter pressed while the Run ran on (or at an earlier prompt) confirmed a
    confirmation before it was shown."""
    from intloom.cli.prompts import prompt_answer
    from intloom.cli.render import CONFIRMATION

    leader, term = pty_pair
    os.write(leader, b"y\r")
    echoed(leader, b"y\r\n")  # the terminal holds the line: typed ahead
    answers: list[object] = []
    failures: list[BaseException] = []

    def ask() -> None:
        try:
            answers.append(prompt_answer(
                {"kind": CONFIRMATION, "request": {"context": {"deploy": "v2"}}}, term))
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    seen, deadline = "", time.monotonic() + 10
    while "Confirm? [y/n]: " not in seen:  # typed only once it was asked
        assert time.monotonic() < deadline and thread.is_alive(), (seen, failures)
        seen += capsys.readouterr().err
        time.sleep(0.01)  # a poll of the captured stderr
    os.write(leader, b"n\r")
    while "Feedback (optional, Enter to skip): " not in seen:  # typed once asked, as a person
        assert time.monotonic() < deadline and thread.is_alive(), (seen, failures)
        seen += capsys.readouterr().err
        time.sleep(0.01)  # a poll of the captured stderr
    os.write(leader, b"\r")
    thread.join(10)
    assert not failures and answers == [{"isConfirmed": False}], (answers, failures)


def asked_again(leader: int, term: Terminal, capsys: pytest.CaptureFixture[str],
                pasted: bytes, retyped: bytes) -> tuple[str, str]:
    """``pasted`` (a refused line, then more lines) typed before the prompt, ``retyped``
    once the refusal is shown: the line the prompt took, and what it said."""
    os.write(leader, pasted)  # in the pty's buffers once written, wherever the line stops
    echoed(leader, pasted[:3])
    got: list[str] = []
    thread = threading.Thread(target=lambda: got.append(term.line("Q: ")), daemon=True)
    thread.start()
    told, deadline = "", time.monotonic() + 10
    while "That line is" not in told:
        assert time.monotonic() < deadline and thread.is_alive(), told
        told += capsys.readouterr().err
        time.sleep(0.01)  # a poll of the captured stderr
    os.write(leader, retyped)
    thread.join(10)
    return got[0], told + capsys.readouterr().err


def test_a_line_that_is_not_text_is_asked_for_again(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str],
) -> None:
    """It was decoded with replacement characters and recorded as the answer. The rest of
    the paste it came in is dropped with it: it answered the prompt asked again."""
    leader, term = pty_pair
    term.instead = "intloom answer RUN ACT -"
    got, told = asked_again(leader, term, capsys, b"caf\xe9 au lait\rmerci\r",
                            "café\r".encode())
    assert got == "café", told
    encoding = sys.stdin.encoding or "utf-8"
    assert (f"That line is not {encoding} text (byte 0xe9 at byte 4), so nothing was "
            "taken from it") in told, told
    assert "or give it with intloom answer RUN ACT -." in told, told
    assert told.count("Q: ") == 2, told


def test_a_line_the_terminal_may_have_cut_is_asked_for_again(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str],
) -> None:
    """The terminal passes 4,095 bytes of a line and drops the rest: the answer was
    recorded cut short, without a word (and then the paste's next line was)."""
    leader, term = pty_pair
    term.instead = "intloom answer RUN ACT -"
    got, told = asked_again(leader, term, capsys,
                            b"a" * 5000 + b"\rsee the second paragraph\r",
                            b"b" * 4094 + b"\r")  # the longest line that surely arrives whole
    assert got == "b" * 4094, told[-300:]
    assert ("That line is 4,095 bytes, the most a terminal passes on one line: what was "
            "typed past that was dropped, so nothing was taken from it. Give a long answer "
            "with intloom answer RUN ACT -.") in told, told[-600:]


class _Scripted:
    """A Terminal's say/ask for prompt_answer: typed lines in order, what was said kept."""

    def __init__(self, typed: list[str]) -> None:
        self.typed = typed
        self.said: list[str] = []

    def fresh(self) -> None:
        pass

    def say(self, text: str) -> None:
        self.said.append(text)

    def ask(self, prompt: str) -> str:
        return self.typed.pop(0)


def test_options_whose_ids_are_numbers_are_picked_without_a_silent_guess() -> None:
    """Options with ids 3, 1 and 5: "1" picked the first option (id 3) in silence, though
    1 is also the second's id, and "5", a real id, was refused as no option's number. A
    position still picks (every option stays pickable by its number) and says which, naming
    the option whose id it also is; a number that is only an id picks that option."""
    from intloom.cli.prompts import prompt_answer

    def asked(options: list[dict[str, str]], typed: str) -> tuple[str, list[str]]:
        action = {"kind": "questions",
                  "request": [{"id": "sev", "question": "How bad?", "options": options}]}
        term = _Scripted([typed])
        [answer] = prompt_answer(action, term)  # type: ignore[arg-type]
        return answer["answer"], term.said

    options = [{"id": "3", "label": "high"}, {"id": "1", "label": "low"},
               {"id": "5", "label": "critical"}]
    answer, said = asked(options, "1")
    assert answer == "3", said
    assert ("Picked option 1, high [3]: the answer is its id, 3. (1 is also the id of option "
            "2, low [1]: type 2 for that one.)") in said, said
    answer, said = asked(options, "5")
    assert answer == "5" and "Picked option 3, critical [5], by its id." in said, said
    answer, said = asked(options, "2")
    assert answer == "1" and "Picked option 2, low [1]: the answer is its id, 1." in said, said
    # Ids that are numbers without labels (the review's case): each is pickable by its number.
    bare = [{"id": str(n)} for n in (5, 4, 3, 2, 1)]
    for position in range(1, 6):
        answer, said = asked(bare, str(position))
        assert answer == str(6 - position), (position, said)


def test_a_pasted_block_of_lines_answers_nothing(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str],
) -> None:
    """Three lines pasted at a question's prompt answered that question and the next two
    of the same action, and sent the answer, none of the later prompts read: a line that
    comes with more lines already typed after it is a paste, refused with the rest."""
    leader, term = pty_pair
    term.instead = "intloom answer RUN ACT -"
    got, told = asked_again(leader, term, capsys, b"line one\rline two\rline three\r",
                            b"line two\r")
    assert got == "line two", told
    assert ("That line is followed by more text pasted with it, so nothing was taken from it "
            "or from what followed: type the answer to this prompt alone, or give text of "
            "several lines with intloom answer RUN ACT -.") in told, told
    assert told.count("Q: ") == 2, told


def test_an_enter_that_sends_cr_lf_is_no_paste(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str],
) -> None:
    """A terminal whose Enter sends CR LF (newline mode, a serial or telnet client) gives two
    line ends: the empty second line was always waiting, and every answer was refused as a
    paste."""
    leader, term = pty_pair
    os.write(leader, b"y\r\n")
    assert term.line("Q: ") == "y"
    assert "pasted" not in capsys.readouterr().err


# ----- how to leave without answering, said once ------------------------------------------

HINT = "Ctrl-C (or Ctrl-D) detaches without answering and leaves the Run waiting."
TWO_QUESTIONS = {"kind": "user_ask_questions",
                 "request": [{"id": "a", "question": "First?"},
                             {"id": "b", "question": "Second?"}]}


def test_the_first_prompt_says_how_to_leave_and_no_later_one_does(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str],
) -> None:
    """A person at attach's first prompt learned that Ctrl-C leaves it, and that the Run
    keeps waiting, only from the refusal of a wrong answer: it is said once, under what is
    asked and above its prompt, and not at the next prompts, of this action or the next."""
    from intloom.cli.prompts import detach_hint, prompt_answer

    leader, term = pty_pair
    term.hint = detach_hint()
    got, failures, told = in_turn(
        leader, capsys, "[your answer]: ", [b"one\r", b"two\r", b"three\r", b"four\r"],
        lambda: [prompt_answer(TWO_QUESTIONS, term), prompt_answer(TWO_QUESTIONS, term)])
    assert not failures and len(got) == 1, (got, failures, told)
    assert [entry["answer"] for answer in got[0] for entry in answer] == [
        "one", "two", "three", "four"]
    assert told.count(HINT) == 1, told
    assert told.index("First?") < told.index(HINT) < told.index("[your answer]: "), told


def test_the_hint_with_sigint_ignored_names_ctrl_d_alone(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str],
) -> None:
    """Ctrl-C does nothing then (``ctrl_c_ignored``): naming it sent the person pressing it."""
    from intloom.cli.prompts import detach_hint

    leader, term = pty_pair
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        term.hint = detach_hint()
    finally:
        signal.signal(signal.SIGINT, previous)
    got, failures, told = in_turn(leader, capsys, "Q: ", [b"y\r"], lambda: term.line("Q: "))
    assert got == ["y"] and not failures, (got, failures, told)
    assert told == "Ctrl-D detaches without answering and leaves the Run waiting.\nQ: ", told


def test_no_hint_where_stdin_is_no_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """No one there presses a key: the hint is for a person at a terminal."""
    read, write = os.pipe()
    term = Terminal(read)
    try:
        term.hint = HINT
        os.write(write, b"y\n")
        assert term.line("Q: ") == "y"
    finally:
        term.close()
        os.close(read)
        os.close(write)
    assert capsys.readouterr().err == "Q: "


def test_ctrl_c_at_a_shown_prompt_ends_its_line_once_and_says_so(
    pty_pair: tuple[int, Terminal], capsys: pytest.CaptureFixture[str],
) -> None:
    """The prompt's line held the ``^C`` a terminal echoes: the prompt ends it, and the
    interrupt says so (PromptInterrupted), so that the words of the detach add no empty
    line. Here the Ctrl-C comes while the prompt looks whether it is still wanted (its
    check): the line is ended once, and the interrupt still says so."""
    from intloom.cli.render import PromptInterrupted

    _, term = pty_pair

    def check() -> None:
        raise KeyboardInterrupt

    term.check = check
    term.wake()
    with pytest.raises(PromptInterrupted):
        term.line("Q: ")
    assert capsys.readouterr().err == "Q: \n"
