"""Deliberate faults in the flush path, for unit tests and for crash tests in child processes.

``INTLOOM_FAULT`` (read by ``Store.open``) is a comma list of ``name=N`` items; flushes (and
segment creations) are counted from 1 per process. See docs/format.md, "Testing hooks".
"""

from __future__ import annotations

import os
from typing import Final

import msgspec

from intloom.errors import IntloomError

__all__ = ["ENV", "FaultPlan"]

ENV: Final = "INTLOOM_FAULT"


class FaultPlan(msgspec.Struct, frozen=True):
    """Which flush numbers misbehave, and how.

    - ``fail_sync``: the write succeeds, then the flush fails with EIO instead of fdatasync.
    - ``enospc_sync``: half of the batch is written, then the write fails with ENOSPC.
    - ``crash_before_sync``: the whole batch is written, then the process SIGKILLs itself.
    - ``crash_after_sync``: the process SIGKILLs itself right after the batch's fdatasync.
    - ``torn_write``: half of the batch is written, then the process SIGKILLs itself.
    - ``stop_after_sync``: right after the batch's fdatasync the process sends itself SIGTERM:
      a host's graceful stop begins at that boundary (conformance sweeps).
    - ``fail_segment``: creating the N-th segment of this process fails with ENOSPC
      (the first is the one ``Store.begin`` creates).
    - ``keep_failed``: when flush N fails, cutting the failed bytes off the segment is
      refused (EROFS, as on a file system the kernel remounted read-only): they stay on
      disk, and only the void notice says they never happened.
    - ``no_preallocate``: from the N-th segment this process creates on, preallocating it
      is refused (EOPNOTSUPP, as on a file system without ``fallocate``): those segments
      grow with each batch, as format 1's did. The full-disk tests count bytes so.
    """

    fail_sync: frozenset[int] = msgspec.field(default_factory=frozenset)
    enospc_sync: frozenset[int] = msgspec.field(default_factory=frozenset)
    crash_before_sync: frozenset[int] = msgspec.field(default_factory=frozenset)
    crash_after_sync: frozenset[int] = msgspec.field(default_factory=frozenset)
    torn_write: frozenset[int] = msgspec.field(default_factory=frozenset)
    stop_after_sync: frozenset[int] = msgspec.field(default_factory=frozenset)
    fail_segment: frozenset[int] = msgspec.field(default_factory=frozenset)
    keep_failed: frozenset[int] = msgspec.field(default_factory=frozenset)
    no_preallocate: frozenset[int] = msgspec.field(default_factory=frozenset)

    def armed(self) -> bool:
        """Whether any fault is planned at all (the writer skips every check otherwise)."""
        return any(getattr(self, name) for name in self.__struct_fields__)

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """Parse ``fail_sync=2,torn_write=5``; an unknown name or a bad number is an error."""
        names = set(cls.__struct_fields__)
        found: dict[str, set[int]] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, value = item.partition("=")
            name = name.strip()
            if name not in names or not value.strip().isdigit() or int(value) < 1:
                raise IntloomError(
                    "INVALID_REQUEST",
                    f"{ENV} item {item!r} is not understood; use a comma list of NAME=N "
                    f"(N >= 1) with NAME one of {', '.join(sorted(names))}",
                )
            found.setdefault(name, set()).add(int(value))
        return cls(**{k: frozenset(v) for k, v in found.items()})

    @classmethod
    def from_env(cls) -> FaultPlan:
        return cls.parse(os.environ.get(ENV, ""))

    def merged(self, other: FaultPlan | None) -> FaultPlan:
        if other is None:
            return self
        return FaultPlan(**{name: getattr(self, name) | getattr(other, name)
                            for name in self.__struct_fields__})

    def __bool__(self) -> bool:
        return any(getattr(self, name) for name in self.__struct_fields__)
