"""gepard-server's graceful shutdown: on SIGTERM (or SIGINT) it drains. New requests, contexts and
sockets get 503 in Cartesia's shape and /health answers 503 "draining"; what is under way finishes
until --shutdown-timeout, then every context still open gets an error and its socket closes with
1001; the process exits 0. A second signal exits at once."""

import asyncio
import base64
import json
import signal
import socket
import threading
import time

import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)

websockets = pytest.importorskip("websockets")

NEW = {"Cartesia-Version": "2026-03-01"}
RAW_S16 = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
MAX_FRAMES = 20


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return gsp.make_test_model(tmp_path_factory.mktemp("model"))


def tts(transcript, **extra):
    return {"model_id": "sonic-3", "transcript": transcript, "voice": "default",
            "output_format": RAW_S16, **extra}


def ws_message(context_id, transcript, cont, **extra):
    return json.dumps({"context_id": context_id, "model_id": "sonic-3", "transcript": transcript,
                       "voice": {"mode": "id", "id": "default"}, "output_format": RAW_S16,
                       "continue": cont, **extra})


def long_text(n=400):
    return " ".join(f"Sentence number {i} is here." for i in range(n))


def ws_connect(server):
    return websockets.connect(server.ws_url + "/tts/websocket", max_size=None)


async def next_message(ws, timeout=20):
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


ENDS = {}  # id(socket) → {context id: its last message}, every end a socket has seen


async def until_end(ws, *context_ids, timeout=30):
    """Messages until each of `context_ids` has had its done or error; the last message of
    each."""
    ends = ENDS.setdefault(id(ws), {})
    while not set(context_ids) <= set(ends):
        m = await next_message(ws, timeout)
        if m["done"]:
            assert m["context_id"] not in ends, "two ends for one context"
            ends[m["context_id"]] = m
    return {c: ends[c] for c in context_ids}


async def close_code(ws, timeout=15):
    """The code the server closed the socket with, skipping what it sent before."""
    try:
        while True:
            await asyncio.wait_for(ws.recv(), timeout)
    except websockets.exceptions.ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None


def wait_exit(server, timeout):
    start = time.monotonic()
    code = server.process.wait(timeout=timeout)
    return code, time.monotonic() - start


def output(server):
    """What the exited server printed: its stdout after the start, and its log."""
    return server.process.stdout.read() + server.log_path.read_text()


def check_503(status, headers, body):
    assert status == 503, body
    error = json.loads(body)
    assert error["error_code"] == "service_unavailable"
    assert "shutting down" in error["message"]


def test_sigterm_lets_open_contexts_finish(model, tmp_path):
    """A context that is still open when SIGTERM comes is served to its end; everything new is
    refused meanwhile; the process exits 0 right after."""
    server = gsp.GepardServer(model, tmp_path, max_frames=MAX_FRAMES,
                              args=["--shutdown-timeout", "60"])
    try:
        async def run():
            async with ws_connect(server) as ws, ws_connect(server) as idle:
                await ws.send(ws_message("a", "The first sentence. ", True))
                await ws.send(ws_message("b", "Another context speaks.", False))
                first = await next_message(ws)
                assert first["type"] == "chunk"
                server.process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)

                # out of rotation, and nothing new is taken
                status, _, body = await asyncio.to_thread(server.request, "GET", "/health")
                assert status == 503 and json.loads(body)["status"] == "draining"
                check_503(*await asyncio.to_thread(server.request, "POST", "/tts/bytes",
                                                   tts("Hi."), NEW))
                with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
                    async with ws_connect(server):
                        pass
                assert refused.value.response.status_code == 503
                # a socket with nothing under way is told to go elsewhere
                assert await close_code(idle) == 1001

                await ws.send(ws_message("new", "A new context.", False))
                m = (await until_end(ws, "new"))["new"]
                assert m["type"] == "error" and m["status_code"] == 503

                # the open context goes on: more text, then its end
                await ws.send(ws_message("a", "The second sentence.", False))
                ends = await until_end(ws, "a", "b")
                assert {c: m["type"] for c, m in ends.items()} == {"a": "done", "b": "done"}
                assert await close_code(ws) == 1001

        t0 = time.monotonic()
        asyncio.run(run())
        code, waited = wait_exit(server, 20)
        assert code == 0
        assert time.monotonic() - t0 < 30
        log = output(server)
        assert "every generation has ended" in log and "cut short" not in log
    finally:
        server.stop()


def read_sse(server, body, result):
    """POST /tts/sse on a raw socket; the events it got before the connection ended."""
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"POST /tts/sse HTTP/1.1\r\nHost: x\r\nCartesia-Version: 2026-03-01\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(payload), payload))
        data = b""
        while True:
            piece = s.recv(65536)
            if not piece:
                break
            data += piece
    result["status"] = data.split(b"\r\n", 1)[0]
    result["events"] = [json.loads(line[6:]) for line in data.decode(errors="replace").splitlines()
                        if line.startswith("data: {")]


def test_deadline_ends_long_generations_with_an_error(model, tmp_path):
    """With a short deadline, long generations still running get an error (WebSocket and SSE),
    the sockets close with 1001, and the process exits 0 within the deadline and a margin."""
    deadline = 2
    server = gsp.GepardServer(model, tmp_path, max_frames=MAX_FRAMES,
                              args=["--shutdown-timeout", str(deadline)])
    try:
        sse = {}
        reader = threading.Thread(target=read_sse, args=(server, tts(long_text(), context_id="s"),
                                                         sse))
        reader.start()

        async def run():
            async with ws_connect(server) as ws:
                await ws.send(ws_message("long", long_text(), False))
                await ws.send(ws_message("open", "Still talking. ", True, flush=True))
                seen = set()
                while seen != {"long", "open"}:
                    m = await next_message(ws)
                    assert not m["done"], m
                    if m["type"] == "chunk":
                        seen.add(m["context_id"])
                server.process.send_signal(signal.SIGTERM)
                t0 = time.monotonic()
                ends = await until_end(ws, "long", "open")
                assert time.monotonic() - t0 >= deadline - 0.5
                for m in ends.values():
                    assert m["type"] == "error" and m["status_code"] == 503
                    assert "shutting down" in m["message"] and m["error_code"]
                assert await close_code(ws) == 1001
                return t0

        t0 = asyncio.run(run())
        code = server.process.wait(timeout=deadline + 10)
        assert code == 0
        assert time.monotonic() - t0 < deadline + 10
        reader.join(10)
        assert sse["status"].startswith(b"HTTP/1.1 200")
        assert sse["events"][0]["type"] == "chunk"
        last = sse["events"][-1]
        assert last["type"] == "error" and last["status_code"] == 503
        log = output(server)
        assert "shutdown deadline" in log and "stopped (work was cut short)" in log
    finally:
        server.stop()


def test_second_signal_exits_at_once(model, tmp_path):
    server = gsp.GepardServer(model, tmp_path, max_frames=MAX_FRAMES,
                              args=["--shutdown-timeout", "600"])
    try:
        async def run():
            async with ws_connect(server) as ws:
                await ws.send(ws_message("long", long_text(), False))
                await next_message(ws)
                server.process.send_signal(signal.SIGINT)
                await asyncio.sleep(0.5)
                assert server.process.poll() is None  # draining, with work under way
                server.process.send_signal(signal.SIGINT)
                code, waited = await asyncio.to_thread(wait_exit, server, 10)
                assert code == 1 and waited < 5

        asyncio.run(run())
    finally:
        server.stop()


def test_sigterm_when_idle_exits_0_at_once(model, tmp_path):
    server = gsp.GepardServer(model, tmp_path, max_frames=MAX_FRAMES)
    try:
        assert server.request("POST", "/tts/bytes", tts("Hi."), NEW)[0] == 200
        server.process.send_signal(signal.SIGTERM)
        code, waited = wait_exit(server, 15)
        assert code == 0 and waited < 10
        assert "stopped" in output(server)
    finally:
        server.stop()
