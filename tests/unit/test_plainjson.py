"""``json_problem``: what a client or a Tool hands over is plain JSON, or the first part that
is not is named -- including a value that holds itself, which must not hang the host."""

from __future__ import annotations

from typing import Any

import pytest

from intloom.runtime.plainjson import MAX_DEPTH, json_problem


@pytest.mark.parametrize(("value", "said"), [
    ({"a": [1, "x", None, True, 1.5, {"b": []}]}, None),
    ({"a": [1, 2, {"b": b"x"}]}, "$.a[2].b is bytes, not JSON data"),
    ([1.0, float("inf")], "$[1] is inf, which JSON cannot hold"),
    (float("nan"), "$ is nan, which JSON cannot hold"),
    ({"k": {1: 2}}, "$.k has the key 1 (int); JSON keys are strings"),
    ({"tags": {"a"}}, "$.tags is set, not JSON data"),
])
def test_the_first_part_that_is_not_json_is_named(value: Any, said: str | None) -> None:
    assert json_problem(value) == said


def test_a_value_that_holds_itself_is_named_not_walked_for_ever() -> None:
    loop: list[Any] = []
    loop.append(loop)
    cyclic: dict[str, Any] = {}
    cyclic["again"] = cyclic
    for value in (loop, cyclic):
        said = json_problem(value)
        assert said is not None and f"nested more than {MAX_DEPTH} levels" in said


def test_a_long_flat_list_is_cheap_and_fine() -> None:
    assert json_problem(list(range(200_000))) is None
