"""Large buffers in their own mappings, so a host gives memory back after a busy spell.

glibc's malloc serves a buffer of 128 KiB or more with its own ``mmap`` and unmaps it when
freed -- until one such buffer is freed: then it raises that threshold to the buffer's size
(up to 32 MiB), and later large buffers come from the heap, where the small objects a host
keeps for long (Runs, views, connections) pin the heap's pages once the buffers are freed.
A host makes such buffers all the time: a log segment (up to 16 MiB) read for a restore or a
follower's history, a page of ``runs`` views, a snapshot, a batch of 64 Runs' records.

Measured with ``scripts/soak`` (200 concurrent Runs, 20 followers, 13 restarts): each host
instance peaked at 44-49 MiB with the threshold fixed against 51-76 MiB without, and the
last one, idle, sat at 47 against 70-75 MiB (the soak's limit is ~60). Fixing the threshold
at glibc's own default turns the ratchet off; nothing else changes.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Final

__all__ = ["keep_large_buffers_mapped"]

_M_MMAP_THRESHOLD: Final = -3  # glibc's malloc.h
_THRESHOLD: Final = 128 * 1024  # glibc's default, kept fixed instead of raised


def keep_large_buffers_mapped() -> bool:
    """Fix glibc's mmap threshold at its default; True when this libc took it. Elsewhere
    (another libc, another OS) nothing changes: their allocators do not ratchet this way."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _THRESHOLD))
