"""A slow reader: while a client reads a 30 MB stream a little at a
time, memproxy holds back the upstream instead of buffering the stream, so its memory stays
flat and the provider's writes wait."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.fake_upstream import SSEReply, chunk
from tests.test_crash import start_server

pytestmark = pytest.mark.faults
EVENT_TEXT = "x" * 1000
EVENTS = 30_000  # about 30 MB: more than any socket buffers on the way could take in
READ_FOR_S = 3.0


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_slow_reader_holds_back_the_upstream_and_memory_stays_flat(fake, tmp_path):
    events = [chunk({"content": EVENT_TEXT})] * EVENTS
    fake.queue(SSEReply(events))
    process, url = start_server(tmp_path / "slow.db", fake.url)
    try:
        port = int(url.rsplit(":", 1)[1])
        before = rss_mb(process.pid)
        body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "long"}]}).encode()
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n" % len(body) + body)
            received, peak = 0, before
            deadline = time.monotonic() + READ_FOR_S
            while time.monotonic() < deadline:
                received += len(sock.recv(1024))
                peak = max(peak, rss_mb(process.pid))
                time.sleep(0.005)
            still_writing = fake.connections[-1].busy and fake.connections[-1].closed is None
        assert 0 < received < 2_000_000  # the client really was slow: a fraction of the stream
        assert still_writing  # the provider is held back, not drained into memproxy's memory
        assert peak - before < 16, (before, peak)
        assert fake.wait_closed(10)  # the client left: the upstream stream is closed too
    finally:
        process.kill()
        process.wait(10)
