"""The host keeps large buffers in their own mappings (host/allocator.py), so memory a busy
spell took goes back to the system once it is freed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_PATTERN = textwrap.dedent("""
    import sys, psutil
    from intloom.host.allocator import keep_large_buffers_mapped
    if sys.argv[1] == "fixed":
        assert keep_large_buffers_mapped()
    # One large buffer freed: glibc raises its mmap threshold past what follows.
    big = bytearray(8 << 20)
    big[::4096] = b"z" * len(big[::4096])
    del big
    rss = lambda: psutil.Process().memory_info().rss >> 20
    base = rss()
    kept, buffers = [], []
    for _ in range(64):  # 1 MiB buffers (segment reads, pages of views), each followed by
        buffers.append(b"x" * (1 << 20))  # a smaller one that outlives it (100 KB: from the
        kept.append(b"y" * 100_000)       # heap's top, below any mmap threshold): 6 MiB
    del buffers
    print(rss() - base)
""")


def _kept_mib(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", _PATTERN, mode], capture_output=True,
                          text=True, timeout=60, check=True)
    return int(done.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_freed_large_buffers_go_back_to_the_system() -> None:
    plain = _kept_mib("plain")
    if plain < 48:
        pytest.skip(f"this libc does not keep freed large buffers ({plain} MiB kept)")
    assert _kept_mib("fixed") < 16  # 64 MiB were freed (6 MiB kept); glibc alone keeps them
