"""Every code of the error catalogue is listed in docs/cli.md's "Error codes" table, with
its default ``retryable``, and the table lists no code the catalogue does not have. Before,
no page listed them: PROJECT_RESPONSE_INVALID, which the Python client raises, was named
nowhere, nor were the four catalogue codes intloom never produces said to be such."""

from __future__ import annotations

import re

import pytest

from intloom.errors import CATALOGUE
from tests.helpers import REPO

pytestmark = pytest.mark.timeout(30)


def _table() -> dict[str, str]:
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "\n## Error codes\n" in text, "docs/cli.md has no Error codes section"
    section = text.split("\n## Error codes\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        for code in re.findall(r"`([A-Z_]+)`", cells[0]):
            assert code not in rows, f"{code} is listed twice"
            rows[code] = cells[1]
    return rows


def test_every_catalogue_code_is_documented_with_its_retryable() -> None:
    rows = _table()
    assert sorted(set(CATALOGUE) - set(rows)) == [], "codes missing from docs/cli.md"
    assert sorted(set(rows) - set(CATALOGUE)) == [], "docs/cli.md lists unknown codes"
    wrong = {code: (rows[code], retryable) for code, (_, retryable) in CATALOGUE.items()
             if rows[code] != ("true" if retryable else "false")}
    assert wrong == {}, wrong
