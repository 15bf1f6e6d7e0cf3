"""Version skew: what another intloom wrote (its host's metadata files, its hello's refusal,
its manifest), read by this one. Files and frames are written here in that version's shape,
so no other build is needed."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from intloom import __version__
from intloom.errors import IntloomError
from intloom.host.metadata import METADATA_VERSION, read_connection, read_lock, read_service


def test_metadata_of_another_version_is_refused_by_its_version_with_the_way_out(
    tmp_path: Path,
) -> None:
    """service.json, service.lock and connection.json another metadata version wrote: one
    holding a key this version does not know was "not valid metadata (Object contains unknown
    field ...)", damage to fix by hand, while that intloom's host may be running; the
    version, both versions and how to restart the host with this intloom are named."""
    root = tmp_path.resolve()
    newer = METADATA_VERSION + 1
    doc = {"version": newer, "projectRoot": str(root), "pid": 4242, "createTime": 1.0,
           "instanceId": "i", "port": 4000, "startedAt": "2026-12-09T00:00:00.000Z",
           "packageVersion": "9.9.9", "protocolVersion": 2, "logFile": None, "bootId": "b",
           "token": "t" * 43, "added": {"in": "a later version"}}
    for name, read in (("service.json", lambda p: read_service(p, root)),
                       ("service.lock", read_lock),
                       ("connection.json", lambda p: read_connection(p, root))):
        path = tmp_path / name
        path.write_bytes(msgspec.json.encode(doc))
        path.chmod(0o600)
        with pytest.raises(IntloomError) as refused:
            read(path)
        message = refused.value.message
        assert refused.value.code == "CLI_SERVICE_METADATA_INVALID", message
        assert "unknown field" not in message, message
        assert (f"has metadata version {newer}; this intloom ({__version__}) reads version "
                f"{METADATA_VERSION}: a newer intloom (9.9.9) wrote it") in message, message
        if name == "connection.json":
            assert "move the file aside" in message, message
        else:
            assert ("with the intloom that started it (intloom stop), or kill -TERM 4242 (a "
                    "graceful stop), then run intloom start with this one") in message, message
        assert refused.value.here == message
        assert path.read_bytes() == msgspec.json.encode(doc)
