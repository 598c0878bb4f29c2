"""A client that does not read must not make gepard-server buffer without end.

- A WebSocket client that stops reading mid-stream: its generation is held (the engine stops
  stepping for it) while the output waiting for it is over a quarter of --max-send-buffer-bytes,
  the server's memory stays flat, and once the client reads again everything arrives, in full.
- A client that keeps sending and never reads: past --max-send-buffer-bytes the socket is closed
  (1008) and its memory is given back.
- Messages that wait while a context's voice is fetched are bounded too: with the voice database
  stopped (SIGSTOP), a flood of messages closes the socket with an error instead of queuing."""

import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)

websockets = pytest.importorskip("websockets")

MAX_FRAMES = 20
SEND_BUFFER = 256 * 1024
F32_48K = {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 48000}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return gsp.make_test_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    s = gsp.GepardServer(model, tmp_path_factory.mktemp("server"), max_frames=MAX_FRAMES,
                         args=["--max-send-buffer-bytes", str(SEND_BUFFER),
                               "--max-body-bytes", "4096"])
    yield s
    s.stop()


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def message(context_id, transcript, fmt=F32_48K, voice="default", cont=False):
    return json.dumps({"context_id": context_id, "model_id": "sonic-3", "transcript": transcript,
                       "voice": {"mode": "id", "id": voice}, "output_format": fmt,
                       "continue": cont})


def long_text(n):
    return " ".join(f"Sentence number {i} is here." for i in range(n))


def small_receive_buffer_socket(port):
    """A connected socket whose receive buffer is small, so that the server's output backs up
    after little data rather than after megabytes of kernel buffers."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    s.connect(("127.0.0.1", port))
    return s


def test_slow_reader_is_held_then_served_in_full(server):
    n_sentences = 100
    sock = small_receive_buffer_socket(server.port)

    async def run():
        # max_queue: the client library itself stops reading the socket after a few messages
        async with websockets.connect(server.ws_url + "/tts/websocket", sock=sock,
                                      max_size=None, max_queue=4) as ws:
            await ws.send(message("slow", long_text(n_sentences)))
            first = json.loads(await asyncio.wait_for(ws.recv(), 20))
            assert first["type"] == "chunk"
            baseline = rss_kib(server.process.pid)
            # the client stops reading: the server's output backs up, then its generation waits
            held_at = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                if await asyncio.to_thread(server.engine_quiet, 1.0):
                    held_at = time.monotonic()
                    break
            assert held_at is not None, "the engine kept generating for a client that reads nothing"
            m = server.metrics()
            assert m["gepard_active_contexts"] == 1
            # and stays held: nothing grows while the client sleeps
            await asyncio.sleep(2)
            assert await asyncio.to_thread(server.engine_quiet, 1.0)
            grown = rss_kib(server.process.pid) - baseline
            # the whole turn is ~25 MB of JSON; what waits is bounded by the send buffer
            assert grown < 16 * 1024, f"RSS grew by {grown} KiB while the client was not reading"

            # the client reads again: everything arrives, to its done
            audio = base64.b64decode(first["data"])
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if m["type"] == "chunk":
                    audio += base64.b64decode(m["data"])
                if m["done"]:
                    assert m["type"] == "done", m
                    break
            return audio, grown

    audio, grown = asyncio.run(run())
    # generation is deterministic: the held turn is the very audio of the same turn unheld
    status, _, unheld = server.request("POST", "/tts/bytes", {
        "model_id": "sonic-3", "transcript": long_text(n_sentences), "voice": "default",
        "output_format": F32_48K})
    assert status == 200
    assert len(audio) == len(unheld) and audio == unheld
    print(f"\nslow reader: held after backing up; RSS grew {grown} KiB while held; "
          f"{len(audio)} bytes delivered in full afterwards")
    server.wait_idle()


def read_chunked(sock, data):
    """The body of a chunked HTTP response whose first bytes (after the headers) are `data`."""
    body = b""
    while True:
        while b"\r\n" not in data:
            data += sock.recv(65536)
        size_line, data = data.split(b"\r\n", 1)
        size = int(size_line, 16)
        while len(data) < size + 2:
            piece = sock.recv(65536)
            assert piece, "the response ended early"
            data += piece
        body += data[:size]
        data = data[size + 2:]
        if size == 0:
            return body


def test_slow_http_reader_is_held_then_served_in_full(server):
    n_sentences = 60
    request = {"model_id": "sonic-3", "transcript": long_text(n_sentences), "voice": "default",
               "output_format": F32_48K}
    payload = json.dumps(request).encode()
    with small_receive_buffer_socket(server.port) as sock:
        sock.sendall(b"POST /tts/bytes HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(payload), payload))
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(4096)
        head, data = data.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower()
        baseline = rss_kib(server.process.pid)
        deadline = time.monotonic() + 30
        while not server.engine_quiet(1.0):
            assert time.monotonic() < deadline, "the engine kept generating for a slow reader"
        assert server.metrics()["gepard_active_contexts"] == 1
        time.sleep(1)
        assert server.engine_quiet(1.0)
        grown = rss_kib(server.process.pid) - baseline
        assert grown < 16 * 1024, grown
        body = read_chunked(sock, data)
    status, _, unheld = server.request("POST", "/tts/bytes", request)
    assert status == 200 and body == unheld
    print(f"\nslow HTTP reader: held; RSS grew {grown} KiB; {len(body)} bytes in full afterwards")
    server.wait_idle()


def ws_handshake(sock):
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /tts/websocket HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  f"Sec-WebSocket-Version: 13\r\n\r\n").encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(1)
    assert reply.startswith(b"HTTP/1.1 101"), reply


def ws_frame(text):
    payload = text.encode()
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    assert len(payload) < 126
    return bytes([0x81, 0x80 | len(payload)]) + mask + masked


def test_client_that_never_reads_is_closed(server):
    """Every bad message earns an error event; a client that sends them without reading fills
    the send buffer, and the server closes it rather than queue on."""
    baseline = rss_kib(server.process.pid)
    sock = small_receive_buffer_socket(server.port)
    ws_handshake(sock)
    sock.settimeout(0.5)
    frame = ws_frame("{not json")
    sent, closed = 0, False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not closed:
        try:
            sock.sendall(frame * 100)
            sent += 100
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        except socket.timeout:
            # the server stopped reading too (it has closed, or is closing): look
            m = server.metrics()
            closed = m["gepard_websocket_connections"] == 0
    assert closed, f"the socket is still open after {sent} unread errors"
    sock.close()
    assert "closing a WebSocket whose client does not read" in server.log_path.read_text()
    assert server.request("GET", "/health")[0] == 200
    m = server.wait_idle()
    assert m["gepard_websocket_connections"] == 0
    grown = rss_kib(server.process.pid) - baseline
    assert grown < 16 * 1024, grown
    print(f"\nnever-reading client: closed after {sent} messages; RSS grew {grown} KiB")


def postgres_pids(data_dir):
    pid_file = Path(data_dir) / "postmaster.pid"
    postmaster = int(pid_file.read_text().split()[0])
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                              text=True).stdout.split()
    return [postmaster] + [int(p) for p in children]


@pytest.fixture
def pg_data_dir():
    if not any(Path("/usr/lib/postgresql").glob("*/bin/initdb")) and shutil.which("initdb") is None:
        pytest.skip("PostgreSQL (initdb, pg_ctl) is not installed")
    # as root the cluster runs as the postgres user, which cannot enter pytest's private
    # temporary directories: a directory of its own, open to enter
    d = Path(tempfile.mkdtemp(prefix="gepard-backpressure-"))
    d.chmod(0o711)
    yield d / "postgres"
    shutil.rmtree(d, ignore_errors=True)


def test_messages_waiting_for_a_voice_are_bounded(model, tmp_path, pg_data_dir):
    s = gsp.GepardServer(model, tmp_path, max_frames=5, args=["--data-dir", str(pg_data_dir)],
                         env={"DATABASE_URL": "", "TTS_DATABASE_URL": ""})
    stopped = []
    try:
        pids = postgres_pids(pg_data_dir / "data")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)

        async def run():
            async with websockets.connect(s.ws_url + "/tts/websocket", max_size=None) as ws:
                # an unknown voice is looked for in the database, which does not answer
                await ws.send(message("v", "Hello.", fmt={"container": "raw",
                                                          "encoding": "pcm_s16le",
                                                          "sample_rate": 24000},
                                      voice=str(uuid.uuid4())))
                with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                    for i in range(5000):
                        await ws.send(json.dumps({"context_id": f"c{i}", "cancel": True}))
                    while True:
                        m = json.loads(await asyncio.wait_for(ws.recv(), 10))
                        assert m["type"] == "error"
                        assert "voice is being loaded" in m["message"]
                assert closed.value.rcvd.code == 1008

        asyncio.run(run())
        assert s.request("GET", "/health")[0] == 200
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        s.stop()
