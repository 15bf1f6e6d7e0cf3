"""A State or a confirmation's context that msgspec cannot encode is refused naming the part
to blame: "cannot be encoded as JSON (Encoding objects of type object is unsupported)" left
the user to search a whole State for it."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest

from intloom.authoring.interaction import confirmation_request, unencodable_part
from intloom.authoring.savecheck import encode_state
from intloom.errors import IntloomError


class Box(msgspec.Struct):
    count: int = 0
    extra: Any = None
    renamed: Any = msgspec.field(default=None, name="shownAs")


@dataclasses.dataclass
class Holder:
    inner: Any


def test_the_state_names_the_part_msgspec_refuses() -> None:
    state = Box(extra={"notes": ["a", Holder(inner=object())]})
    with pytest.raises(IntloomError) as refused:
        encode_state(state, "Stage 's', Step 'x'", Box)
    assert refused.value.code == "STAGE_STATE_INVALID"
    message = refused.value.message
    assert message.startswith("Stage 's', Step 'x': the Stage State it left (Box) cannot be "
                              "encoded as JSON ($.extra.notes[1].inner is object: "), message


def test_a_renamed_field_and_a_key_are_named_as_encoded() -> None:
    assert unencodable_part(Box(renamed=[1, {2, 3}, object()])) == "$.shownAs[2] is object"
    assert unencodable_part(Box(extra={(1, 2): "v"})) == "$.extra has the key (1, 2) (tuple)"
    assert unencodable_part(Box(extra={"a": [1, 2**70, "x"]})) is None  # JSON has big ints
    # An UNSET field is left out of the encoding: the part to blame is the next one.
    assert unencodable_part(Box(extra=msgspec.UNSET, renamed=object())) == "$.shownAs is object"


def test_a_confirmation_context_names_the_part() -> None:
    with pytest.raises(IntloomError) as refused:
        confirmation_request({"order": {"id": 4, "client": object()}}, "Stage 's', Step 'x'")
    assert refused.value.code == "STEP_INTERACTION_INVALID"
    assert "($.order.client is object: " in refused.value.message, refused.value.message


def test_an_integer_too_long_for_json_text_is_the_states_fault_not_the_hosts() -> None:
    """An int of more than 4,300 digits raises ValueError from the JSON encoder (Python's
    int-to-text limit): the Run failed CLI_INTERNAL_ERROR, "The host failed while driving
    the Run (ValueError)"."""

    class Limits(msgspec.Struct):
        limit: int = 0

    with pytest.raises(IntloomError) as refused:
        encode_state(Limits(limit=10**5000), "Stage 's', Step 'x'", Limits)
    assert refused.value.code == "STAGE_STATE_INVALID"
    assert "cannot be encoded as JSON ($.limit is int: " in refused.value.message, \
        refused.value.message


class _Stamped(msgspec.Struct):
    n: int = 0
    log: list[str] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        self.log.append("built")  # at every construction: a decode too


class _Trimmed(msgspec.Struct):
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name.strip()  # the same again on what it already trimmed


class _Holds(msgspec.Struct):
    inner: _Stamped = msgspec.field(default_factory=_Stamped)


def test_a_state_whose_post_init_changes_it_at_every_read_is_refused_when_saved() -> None:
    """Each Step got a State one "built" longer than the one the Step before it left, and
    the restart then held the Run as if its code had changed. Refused where it is saved,
    naming the Step; a __post_init__ that gives a read State back as it was saves."""
    for state in (_Stamped(n=1), _Holds()):
        with pytest.raises(IntloomError) as info:
            encode_state(state, "Stage 's', Step 'put'", type(state))
        assert info.value.code == "STAGE_STATE_INVALID", info.value
        message = info.value.message
        assert message.startswith("Stage 's', Step 'put': the Stage State it left does not "
                                  "read back as itself: saved as "), message
        assert '"built","built"' in message and "__post_init__" in message, message
    assert encode_state(_Trimmed(name="  a "), "Step", _Trimmed) == b'{"name":"a"}'
    # Set after it was built (``ctx.state.name = " a "``): normalised by one read, it reads
    # back as itself then, so it is saved normalised, as the next Step gets it.
    later = _Trimmed()
    later.name = " a "
    assert encode_state(later, "Step", _Trimmed) == b'{"name":"a"}'
