"""What a user reads of the public API: ``dir()`` and ``help()`` of ``intloom`` and
``intloom.client``, and a docstring for every public name."""

from __future__ import annotations

import functools
import pydoc
import re
import typing

import intloom
import intloom.client


def test_dir_and_help_of_the_client_package_show_its_public_classes() -> None:
    assert dir(intloom.client) == ["Client", "Cursor", "ErrorView", "HelloFailed",
                                   "PendingAction", "PendingAgentCall", "RunEvent", "RunView",
                                   "ServiceStarting", "ServiceUnlistened", "ServiceView",
                                   "Stopping", "WorkflowInfo"]
    # TextDoc's bold is a character, a backspace, then the character again.
    text = re.sub(".\b", "", pydoc.render_doc(intloom.client, renderer=pydoc.TextDoc()))
    assert "class Client(builtins.object)" in text
    assert "class ServiceStarting(intloom.errors.IntloomError)" in text
    assert "class ServiceUnlistened(intloom.errors.IntloomError)" in text
    assert "class HelloFailed(intloom.errors.IntloomError)" in text
    assert "__getattr__" not in text


def test_the_client_package_names_the_views_its_methods_return() -> None:
    # An Agent annotates with them (``def handle(run: RunView)``) without importing the
    # modules that define them; the same classes, so isinstance holds on what it gets.
    from intloom.client.client import Client
    from intloom.errors import ErrorView
    from intloom.protocol.messages import RunEvent, ServiceView, Stopping, WorkflowInfo
    from intloom.runtime.model import Cursor, PendingAction, PendingAgentCall, RunView

    homes = {"Client": Client, "Cursor": Cursor, "ErrorView": ErrorView,
             "PendingAction": PendingAction, "PendingAgentCall": PendingAgentCall,
             "RunEvent": RunEvent, "RunView": RunView, "ServiceView": ServiceView,
             "Stopping": Stopping, "WorkflowInfo": WorkflowInfo}
    for name, cls in homes.items():
        assert getattr(intloom.client, name) is cls, name
    hints = typing.get_type_hints(Client.get_run)
    assert hints["return"] is intloom.client.RunView
    assert typing.get_type_hints(Client.status)["return"] is intloom.client.ServiceView


def test_dir_of_intloom_is_its_public_names() -> None:
    assert dir(intloom) == sorted(intloom.__all__)
    assert all(not name.startswith("_") or name == "__version__" for name in intloom.__all__)


def _own_doc(value: object) -> str:
    """The docstring written for ``value`` itself: a msgspec Struct without one shows
    msgspec.Struct's ("A base class for defining efficient serializable objects")."""
    if isinstance(value, type):
        return value.__dict__.get("__doc__") or ""
    if isinstance(value, property):
        value = value.fget
    elif isinstance(value, functools.cached_property):
        value = value.func
    elif isinstance(value, (classmethod, staticmethod)):
        value = value.__func__
    return getattr(value, "__doc__", None) or ""


def test_every_public_name_and_member_has_a_docstring_of_its_own() -> None:
    public: dict[str, object] = {name: getattr(intloom, name) for name in intloom.__all__
                                 if isinstance(getattr(intloom, name), type)}
    public |= {f"intloom.client.{name}": getattr(intloom.client, name)
               for name in intloom.client.__all__}
    missing = []
    for name, cls in public.items():
        if not _own_doc(cls).strip():
            missing.append(name)
        assert isinstance(cls, type)
        for member, value in vars(cls).items():
            if member.startswith("_") or not (
                    callable(value) or isinstance(value, (property, functools.cached_property,
                                                          classmethod, staticmethod))):
                continue
            if not _own_doc(value).strip():
                missing.append(f"{name}.{member}")
    assert missing == []
