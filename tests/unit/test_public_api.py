"""What a user reads of the public API: ``dir()`` and ``help()`` of ``intloom`` and
``intloom.client``, and a docstring for every public name."""

from __future__ import annotations

import pydoc
import re

import intloom
import intloom.client


def test_dir_and_help_of_the_client_package_show_its_public_classes() -> None:
    assert dir(intloom.client) == ["Client", "ServiceStarting"]
    # TextDoc's bold is a character, a backspace, then the character again.
    text = re.sub(".\b", "", pydoc.render_doc(intloom.client, renderer=pydoc.TextDoc()))
    assert "class Client(builtins.object)" in text
    assert "class ServiceStarting(intloom.errors.IntloomError)" in text
    assert "__getattr__" not in text


def test_dir_of_intloom_is_its_public_names() -> None:
    assert dir(intloom) == sorted(intloom.__all__)
    assert all(not name.startswith("_") or name == "__version__" for name in intloom.__all__)
