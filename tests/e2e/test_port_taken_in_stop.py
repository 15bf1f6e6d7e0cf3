"""A host closes its port as its stop begins and removes service.json only at its end, alive
all the while: another local user who bound the freed port in that gap was sent the hello of
any client connecting then, and with it the project's token, which every later start reuses.
A client sends its hello only when the end of the connection it reached is the host's user's.
Real host, a real listener run as another user (root only, with setpriv)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from intloom.client.client import Client
from intloom.client.peer import owners
from intloom.errors import IntloomError
from tests.helpers import Project, eventually, pid_alive

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HOOK = "INTLOOM_TEST_HOLD_UNLISTENED"
# Binds the port as soon as it is free, then prints what each connection sends.
LISTENER = '''
import socket, sys
if sys.argv[2] == "v6":  # dual-stack: [::] takes connections to 127.0.0.1 too
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    where = "::"
else:
    s = socket.socket()
    where = "127.0.0.1"
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((where, int(sys.argv[1])))
s.listen(16)
print("BOUND", flush=True)
s.settimeout(20)
while True:
    c, _ = s.accept()
    c.settimeout(2)
    try:
        print("GOT", c.recv(4096).hex(), flush=True)
    except OSError:
        print("GOT nothing", flush=True)
'''


_HEAD = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
         "timeout inode\n")


def test_the_owners_of_a_loopback_connection_are_read_from_the_kernels_tables() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname(), timeout=5)
    try:
        me = os.geteuid()
        seen = owners(client)
        assert seen is not None and seen.listeners == {me}, seen
        assert seen.end in (me, 0), seen  # 0 before the accept, on kernels before 6.17
        port, ours = server.getsockname()[1], client.getsockname()[1]
        mapped = "0000000000000000FFFF0000"
        tcp6 = _HEAD + (
            f"   0: {'0' * 32}:{port:04X} {'0' * 32}:0000 0A 00000000:00000000 00:00000000 "
            "00000000 65534 0 0 1\n"
            f"   1: {mapped}0100007F:{port:04X} {mapped}0100007F:{ours:04X} 01 "
            "00000000:00000000 00:00000000 00000000 65534 0 0 1\n")
        # A dual-stack listener of another user's ([::]) reaches 127.0.0.1 too: its socket
        # and the connection's end are in tcp6 alone, where the first check never looked.
        seen = owners(client, {"/proc/net/tcp": _HEAD, "/proc/net/tcp6": tcp6})
        assert seen == (frozenset({65534}), 65534), seen
        assert owners(client, {}) is None  # no tables: not known
        assert owners(client, {"/proc/net/tcp": _HEAD}) == (frozenset(), None)
    finally:
        client.close()
        server.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None
                    or not Path("/usr/bin/python3").exists(),
                    reason="needs root, setpriv and /usr/bin/python3 to listen as another user")
@pytest.mark.parametrize("family", ["v4", "v6"])
def test_a_client_sends_no_token_to_another_users_listener_in_a_stops_gap(
    project: Project, tmp_path: Path, family: str,
) -> None:
    gate = tmp_path / "go"
    assert project.cli("start", env={HOOK: str(gate)}).code == 0
    pid = project.host_pid()
    token = project.state.joinpath("connection.json").read_text()
    port = int(project.cli("--json", "status").json["service"]["port"])
    listener: subprocess.Popen[str] | None = None
    try:
        os.kill(pid, signal.SIGTERM)
        eventually(lambda: Path(f"{gate}.held").exists(), timeout=60,
                   what="the stop to close its listener")
        listener = subprocess.Popen(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "/usr/bin/python3", "-c", LISTENER, str(port), family],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert listener.stdout is not None
        said = listener.stdout.readline().strip()
        assert said == "BOUND", (said, listener.poll())
        with pytest.raises(IntloomError) as refused:
            Client.connect(project.root, timeout=5)
        assert refused.value.code == "CLI_SERVICE_UNAVAILABLE", refused.value
        assert (f"Whatever listens on 127.0.0.1:{port} runs as another user (uid 65534) "
                "than the project's (uid 0)" in refused.value.message), refused.value
        assert "Nothing was sent, the token included" in refused.value.message
    finally:
        gate.touch()
        if listener is not None:
            listener.kill()
            out, _ = listener.communicate(timeout=30)
            # It was connected to, and closed before anything was sent.
            assert all(line in ("BOUND", "GOT ", "GOT nothing") for line in out.split("\n")
                       if line), out
            secret = __import__("json").loads(token)["token"]
            assert secret.encode().hex() not in out
    eventually(lambda: not pid_alive(pid), timeout=60, what="the host to exit")


@pytest.mark.parametrize("family", ["v4", "v6"])
def test_sock_diag_names_the_owners_the_kernels_tables_name(
        family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``owners`` asks ``sock_diag`` (reading ``/proc/net/tcp`` and ``tcp6`` took ~10 ms of
    every command); its answer must be the tables', before and after the accept, for an
    IPv4 listener and a dual-stack one. When it cannot be asked, the tables are read."""
    from intloom.client import sockdiag

    asked: list[int] = []
    listener_uids = sockdiag.listener_uids

    def counted(port: int) -> list[tuple[int, bytes, int]]:
        asked.append(port)
        return listener_uids(port)

    monkeypatch.setattr(sockdiag, "listener_uids", counted)
    server = (socket.socket() if family == "v4"
              else socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
    server.bind(("127.0.0.1", 0) if family == "v4" else ("::", 0))
    server.listen(1)
    client = socket.create_connection(("127.0.0.1", server.getsockname()[1]), timeout=5)
    accepted: socket.socket | None = None
    try:
        for _ in range(2):
            seen = owners(client)
            tables = {path: Path(path).read_text() for path in ("/proc/net/tcp",
                                                                 "/proc/net/tcp6")}
            assert seen == owners(client, tables), (seen, tables)
            assert seen is not None and seen.listeners == {os.geteuid()}, seen
            if accepted is None:
                accepted, _ = server.accept()
        assert asked == [server.getsockname()[1]] * 2  # sock_diag answered both times
        assert seen is not None and seen.end == os.geteuid(), seen  # accepted: on any kernel

        def unavailable(*args: object) -> None:
            raise sockdiag.Unavailable

        monkeypatch.setattr(sockdiag, "_ask", unavailable)
        assert owners(client) == seen  # read from the tables instead
    finally:
        client.close()
        server.close()
        if accepted is not None:
            accepted.close()
