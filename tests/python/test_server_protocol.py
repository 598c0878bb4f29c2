"""gepard-server against the Cartesia wire protocol (specs/cartesia-protocol.md): every route,
every error path, and that an abandoned generation frees its pipeline and engine slot.

A real server process runs on 127.0.0.1 with an untrained test model whose sentences all run to
the frame limit, so audio lengths are known exactly."""

import asyncio
import base64
import io
import json
import socket
import ssl
import struct
import subprocess
import time
import urllib.error
import urllib.request
import wave

import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)

websockets = pytest.importorskip("websockets")

KEY = "test-key-0123456789"
MAX_FRAMES = 20
NEW = {"Cartesia-Version": "2026-03-01"}
OLD = {"Cartesia-Version": "2025-04-16"}
RAW_S16 = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return gsp.make_test_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    s = gsp.GepardServer(model, tmp_path_factory.mktemp("server"), max_frames=MAX_FRAMES,
                         api_key=KEY,
                         args=["--max-body-bytes", "16384", "--max-transcript-chars", "8000",
                               "--max-contexts-per-socket", "2",
                               "--cors-origins", "https://app.example"])
    yield s
    s.stop()


def tts(transcript="Hello there. How are you?", fmt=RAW_S16, voice="default", **extra):
    return {"model_id": "sonic-3", "transcript": transcript, "voice": {"mode": "id", "id": voice},
            "output_format": fmt, **extra}


def check_error(status, headers, body, expected_status, expected_code):
    assert status == expected_status, body
    assert headers["Content-Type"].startswith("application/json")
    error = json.loads(body)
    assert error["error_code"] == expected_code
    assert error["title"] and error["message"] and error["request_id"]
    return error


# ---- /tts/bytes ----

@pytest.mark.parametrize("encoding,width", [("pcm_s16le", 2), ("pcm_f32le", 4),
                                            ("pcm_mulaw", 1), ("pcm_alaw", 1)])
@pytest.mark.parametrize("rate", [8000, 24000, 44100])
def test_bytes_raw_every_encoding_and_rate(server, encoding, width, rate):
    fmt = {"container": "raw", "encoding": encoding, "sample_rate": rate}
    status, headers, body = server.request("POST", "/tts/bytes", tts(fmt=fmt), NEW)
    assert status == 200
    assert len(body) % width == 0
    expected = gsp.expected_samples(2, MAX_FRAMES, rate)
    assert abs(len(body) // width - expected) <= 8, (len(body), expected)
    if encoding == "pcm_f32le":
        samples = struct.unpack(f"<{len(body) // 4}f", body)
        assert all(-1.5 < x < 1.5 for x in samples)


def test_bytes_wav(server):
    fmt = {"container": "wav", "encoding": "pcm_s16le", "sample_rate": 16000}
    status, headers, body = server.request("POST", "/tts/bytes", tts("One sentence.", fmt), NEW)
    assert status == 200 and headers["Content-Type"] == "audio/wav"
    with wave.open(io.BytesIO(body)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        frames = w.readframes(10**9)
    assert abs(len(frames) // 2 - gsp.expected_samples(1, MAX_FRAMES, 16000)) <= 8
    assert len(body) == 44 + len(frames)


@pytest.mark.parametrize("encoding,tag", [("pcm_f32le", 3), ("pcm_alaw", 6), ("pcm_mulaw", 7)])
def test_bytes_wav_other_encodings(server, encoding, tag):
    fmt = {"container": "wav", "encoding": encoding, "sample_rate": 8000}
    status, _, body = server.request("POST", "/tts/bytes", tts("One sentence.", fmt), NEW)
    assert status == 200
    assert body[:4] == b"RIFF" and body[8:16] == b"WAVEfmt "
    assert struct.unpack("<HHI", body[20:28]) == (tag, 1, 8000)
    assert body[38:42] == b"data"


def test_bytes_accepts_what_clients_send(server):
    """Bare-string voice (SDK 4.x), language null and extra fields (LiveKit), no Content-Type,
    Accept: audio/wav for raw output."""
    body = tts("Hi.", language=None, max_buffer_delay_ms=0, duration=3)
    body["voice"] = "default"
    status, _, audio = server.request("POST", "/tts/bytes", body,
                                      {"Accept": "audio/wav", **NEW})
    assert status == 200 and len(audio) > 0


# ---- errors ----

def test_bad_json(server):
    status, headers, body = server.request("POST", "/tts/bytes", b"{not json", NEW)
    check_error(status, headers, body, 400, "invalid_request")


GARBAGE = [
    b"[" * 500000,
    b'{"a":' * 100000,
    b'"\\"' + b"[" * 100000,
    b"\x00\xff\xfe",
    b'{"transcript": "\xff\xfe broken utf-8", "voice": "default"}',
    b'{"transcript": "nul \\u0000 inside.", "voice": "default", "output_format": '
    b'{"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}}',
    b'{"transcript": 5, "voice": 7, "output_format": [], "continue": null}',
    b'{"transcript": "Hi.", "voice": {"mode": 1}, "output_format": {}}',
    b'{"transcript": "Hi.", "voice": "default", "output_format": {"container": "raw", '
    b'"encoding": "pcm_s16le", "sample_rate": 1e308}}',
    b'{"transcript": "Hi.", "voice": "default", "output_format": {"container": "raw", '
    b'"encoding": "pcm_s16le", "sample_rate": -24000}}',
    b'{"transcript": "Hi.", "voice": "' + b"v" * 5000 + b'", "output_format": {}}',
    b"",
    b"null",
]


@pytest.mark.parametrize("body", GARBAGE)
def test_garbage_is_a_4xx_never_a_crash(server, body):
    status, _, _ = server.request("POST", "/tts/bytes", body, NEW)
    assert 400 <= status < 500 or status == 200
    assert server.request("GET", "/health")[0] == 200


def test_garbage_on_the_websocket(server):
    async def run():
        async with ws_connect(server) as ws:
            small = [b for b in GARBAGE if len(b) < 16000] + [b"[" * 15000]
            for body in small:
                await ws.send(body.decode("utf-8", "replace"))
            await ws.send(b"binary frames are refused")
            errors = 0
            while True:
                try:
                    m = json.loads(await asyncio.wait_for(ws.recv(), 2))
                except asyncio.TimeoutError:
                    break
                errors += m["type"] == "error"
            assert errors >= len(small) - 1
            await ws.send(ws_message("fine", "Hi.", False))
            await receive_until_done(ws, ["fine"])

    asyncio.run(run())
    server.wait_idle()


def test_oversize_websocket_message_closes_the_socket(server):
    """Compression is declined, so the limit holds for the message as sent (no deflate bomb)."""
    async def run():
        async with ws_connect(server) as ws:
            assert ws.protocol.extensions == []
            with pytest.raises(websockets.exceptions.ConnectionClosed):
                await ws.send("[" * 100000)
                await asyncio.wait_for(ws.recv(), 5)

    asyncio.run(run())
    assert server.request("GET", "/health")[0] == 200


def test_error_shape_of_older_versions_is_text(server):
    status, headers, body = server.request("POST", "/tts/bytes", b"[]", OLD)
    assert status == 400
    assert headers["Content-Type"].startswith("text/plain")
    assert body.decode().startswith("Bad Request: ")


@pytest.mark.parametrize("body,status,code", [
    ({"transcript": "Hi.", "voice": "default", "output_format": RAW_S16, "continue": "yes"},
     400, "invalid_request"),
    (tts(""), 400, "invalid_request"),
    (tts("   "), 400, "invalid_request"),
    ({"transcript": "Hi.", "voice": "default"}, 400, "invalid_request"),
    ({"transcript": "Hi.", "output_format": RAW_S16}, 400, "invalid_request"),
    (tts(voice="no-such-voice"), 404, "voice_not_found"),
    (tts(voice="../../etc/passwd"), 404, "voice_not_found"),
    (tts(fmt={"container": "mp3", "sample_rate": 44100, "bit_rate": 128000}),
     400, "unsupported_output_format"),
    (tts(fmt={"container": "raw", "encoding": "pcm_s24le", "sample_rate": 24000}),
     400, "unsupported_output_format"),
    (tts(fmt={"container": "raw", "encoding": "pcm_s16le", "sample_rate": 1000}),
     400, "unsupported_output_format"),
    (tts(fmt={"container": "raw", "encoding": "pcm_s16le", "sample_rate": "fast"}),
     400, "invalid_request"),
    (tts("x" * 8001), 400, "transcript_too_long"),
])
def test_bad_requests(server, body, status, code):
    check_error(*server.request("POST", "/tts/bytes", body, NEW), status, code)


def test_embedding_voice_refused(server):
    body = tts()
    body["voice"] = {"mode": "embedding", "embedding": [0.1] * 16}
    check_error(*server.request("POST", "/tts/bytes", body, NEW), 400, "invalid_request")


def test_oversize_body(server):
    body = json.dumps(tts("Hi.", padding="x" * 20000)).encode()
    check_error(*server.request("POST", "/tts/bytes", body, NEW), 413, "payload_too_large")


def post_chunked(server, payload):
    """A body without Content-Length or Content-Type, as LiveKit JS sends it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /tts/bytes HTTP/1.1\r\nHost: x\r\nX-API-Key: " + KEY.encode()
                  + b"\r\nCartesia-Version: 2026-03-01\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(payload), 1000):
            piece = payload[i:i + 1000]
            s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        s.sendall(b"0\r\n\r\n")
        return s.recv(65536).decode(errors="replace")


def test_chunked_body(server):
    reply = post_chunked(server, json.dumps(tts("Hi.")).encode())
    assert reply.startswith("HTTP/1.1 200"), reply


def test_oversize_chunked_body(server):
    """A body without Content-Length is counted as it arrives."""
    reply = post_chunked(server, json.dumps(tts("Hi.", padding="x" * 30000)).encode())
    assert reply.startswith("HTTP/1.1 413"), reply


@pytest.mark.parametrize("headers,path", [
    ({}, "/tts/bytes"),
    ({"X-API-Key": "wrong"}, "/tts/bytes"),
    ({"Authorization": "Bearer wrong"}, "/tts/bytes"),
    ({}, "/tts/bytes?api_key=wrong"),
    ({}, "/voices"),
    ({}, "/metrics"),
])
def test_wrong_key(server, headers, path):
    saved, server.api_key = server.api_key, None
    try:
        check_error(*server.request("POST" if "tts" in path else "GET", path,
                                    tts() if "tts" in path else None, {**headers, **NEW}),
                    401, "unauthorized")
    finally:
        server.api_key = saved


@pytest.mark.parametrize("headers,path", [
    ({"X-API-Key": KEY}, "/tts/bytes"),
    ({"Authorization": f"Bearer {KEY}"}, "/tts/bytes"),
    ({}, f"/tts/bytes?api_key={KEY}"),
    ({}, f"/tts/bytes?access_token={KEY}"),
])
def test_every_key_form(server, headers, path):
    saved, server.api_key = server.api_key, None
    try:
        status, _, body = server.request("POST", path, tts("Hi."), headers)
    finally:
        server.api_key = saved
    assert status == 200 and len(body) > 0


def test_method_and_route(server):
    check_error(*server.request("GET", "/tts/bytes", None, NEW), 405, "method_not_allowed")
    check_error(*server.request("GET", "/nowhere", None, NEW), 404, "not_found")


# ---- health, metrics, voices, CORS ----

def test_health_needs_no_key(server):
    saved, server.api_key = server.api_key, None
    try:
        status, _, body = server.request("GET", "/health")
    finally:
        server.api_key = saved
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok"
    assert health["engine"]["test_model"] is True
    assert health["voice_store"]["status"] == "ok"


def test_metrics(server):
    server.request("POST", "/tts/bytes", tts("Hi."), NEW)
    m = server.metrics()
    assert m['gepard_requests_total{route="/tts/bytes",status="200"}'] >= 1
    assert m["gepard_first_audio_seconds_count"] >= 1
    assert "gepard_engine_batch_size" in m


def test_voices(server):
    status, _, body = server.request("GET", "/voices", None, NEW)
    page = json.loads(body)
    assert status == 200 and [v["id"] for v in page["data"]] == ["default"]
    # clients page with starting_after until an empty page
    status, _, body = server.request("GET", "/voices?starting_after=default&limit=5", None, NEW)
    assert status == 200 and json.loads(body)["data"] == []
    status, _, body = server.request("GET", "/voices", None, {"Cartesia-Version": "2024-06-10"})
    assert [v["id"] for v in json.loads(body)] == ["default"]
    status, _, body = server.request("GET", "/voices/default", None, NEW)
    assert status == 200 and json.loads(body)["id"] == "default"
    check_error(*server.request("GET", "/voices/nope", None, NEW), 404, "voice_not_found")
    check_error(*server.request("GET", "/voices?limit=0", None, NEW), 400, "invalid_request")


def test_cors(server):
    status, headers, _ = server.request("GET", "/voices", None, {"Origin": "https://app.example"})
    assert headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "Access-Control-Allow-Credentials" not in headers
    status, headers, _ = server.request("GET", "/voices", None, {"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in headers
    status, headers, _ = server.request(
        "OPTIONS", "/tts/bytes", None,
        {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
    assert status == 204 and "X-API-Key" in headers["Access-Control-Allow-Headers"]
    status, _, _ = server.request(
        "OPTIONS", "/tts/bytes", None,
        {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert status == 403


# ---- /tts/sse ----

def sse_events(body):
    events = []
    for frame in body.decode().split("\n\n"):
        data = [line[6:] for line in frame.splitlines() if line.startswith("data: ")]
        if data:
            events.append(json.loads("".join(data)))
    return events


def test_sse(server):
    status, headers, body = server.request(
        "POST", "/tts/sse", tts(add_timestamps=True, context_id="c1"),
        {"Accept": "text/event-stream", **NEW})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(body)
    assert events[-1]["type"] == "done" and events[-1]["done"] is True
    audio = b"".join(base64.b64decode(e["data"]) for e in events if e["type"] == "chunk")
    assert abs(len(audio) // 2 - gsp.expected_samples(2, MAX_FRAMES, 24000)) <= 8
    words = [w for e in events if e["type"] == "timestamps"
             for w in e["word_timestamps"]["words"]]
    assert words == ["Hello", "there.", "How", "are", "you?"]
    assert all(e["context_id"] == "c1" for e in events)


def test_sse_refuses_wav(server):
    fmt = {"container": "wav", "encoding": "pcm_s16le", "sample_rate": 24000}
    check_error(*server.request("POST", "/tts/sse", tts(fmt=fmt), NEW), 400,
                "unsupported_output_format")


# ---- WebSocket ----

def ws_connect(server, query="", headers=None):
    hdrs = {"X-API-Key": KEY, **(headers or {})}
    return websockets.connect(server.ws_url + "/tts/websocket" + query,
                              additional_headers=hdrs, max_size=None)


def ws_message(context_id, transcript, cont, **extra):
    return json.dumps({"context_id": context_id, "model_id": "sonic-3", "transcript": transcript,
                       "voice": {"mode": "id", "id": "default"}, "output_format": RAW_S16,
                       "continue": cont, **extra})


async def receive_until_done(ws, contexts, timeout=20):
    """Every message until each of `contexts` has ended; (messages, audio bytes by context)."""
    messages, audio, ended = [], {}, set()
    while not set(contexts) <= ended:
        m = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        for field in ("type", "context_id", "done", "status_code"):
            assert field in m, m
        messages.append(m)
        if m["type"] == "chunk":
            assert isinstance(m["step_time"], (int, float))
            audio[m["context_id"]] = audio.get(m["context_id"], b"") + base64.b64decode(m["data"])
        if m["done"]:
            assert m["context_id"] not in ended, "two ends for one context"
            ended.add(m["context_id"])
    return messages, audio


async def assert_silent(ws, seconds=0.5):
    with pytest.raises(asyncio.TimeoutError):
        m = await asyncio.wait_for(ws.recv(), seconds)
        pytest.fail(f"unexpected message {m}")


def test_ws_multiplexed_contexts(server):
    async def run():
        async with ws_connect(server) as ws:
            await ws.send(ws_message("a", "Hello world. ", True, add_timestamps=True))
            await ws.send(ws_message("b", "Other context.", False))
            await ws.send(ws_message("a", "How are you? ", True, add_timestamps=True))
            await ws.send(ws_message("a", "", True, flush=True))
            await ws.send(ws_message("a", " ", False))
            messages, audio = await receive_until_done(ws, ["a", "b"])
            await assert_silent(ws)
        return messages, audio

    messages, audio = asyncio.run(run())
    assert abs(len(audio["a"]) // 2 - gsp.expected_samples(2, MAX_FRAMES, 24000)) <= 8
    assert abs(len(audio["b"]) // 2 - gsp.expected_samples(1, MAX_FRAMES, 24000)) <= 8
    stamps = [m["word_timestamps"] for m in messages
              if m["type"] == "timestamps" and m["context_id"] == "a"]
    assert [w for s in stamps for w in s["words"]] == ["Hello", "world.", "How", "are", "you?"]
    starts = [t for s in stamps for t in s["start"]]
    assert starts == sorted(starts) and starts[0] == 0
    # cumulative across continuations: the second sentence starts where the first ended
    assert stamps[1]["start"][0] == pytest.approx(MAX_FRAMES * gsp.FRAME_SECONDS, abs=1e-3)
    flush = [m for m in messages if m["type"] == "flush_done"]
    assert len(flush) == 1 and flush[0]["flush_id"] == 1 and flush[0]["flush_done"] is True
    assert not any(m["type"] == "timestamps" for m in messages if m["context_id"] == "b")
    assert messages[-1]["done"] and [m["type"] for m in messages if m["done"]] == ["done", "done"]


def test_ws_errors_keep_the_socket_usable(server):
    async def run():
        async with ws_connect(server, "?cartesia_version=2025-04-16") as ws:
            await ws.send("{bad json")
            error = json.loads(await ws.recv())
            assert error["type"] == "error" and error["status_code"] == 400
            assert error["context_id"] is None and error["done"] is True
            assert error["error"].startswith("Bad Request: ")
            assert error["title"] and error["message"] and error["request_id"]

            await ws.send(json.dumps({"context_id": "unknown", "cancel": True}))
            await assert_silent(ws)

            await ws.send(json.dumps({**json.loads(ws_message("v", "Hi.", False)),
                                      "voice": "missing"}))
            error = json.loads(await ws.recv())
            assert (error["type"], error["context_id"], error["status_code"]) == ("error", "v", 404)

            wav = {"container": "wav", "encoding": "pcm_s16le", "sample_rate": 24000}
            await ws.send(ws_message("w", "Hi.", False, output_format=wav))
            error = json.loads(await ws.recv())
            assert (error["context_id"], error["status_code"]) == ("w", 400)

            await ws.send(ws_message("e", "", False))
            error = json.loads(await ws.recv())
            assert (error["context_id"], error["status_code"]) == ("e", 400)

            await ws.send(ws_message("long", "x" * 4100 + " ", True))
            await ws.send(ws_message("long", "y" * 4100, False))
            msgs = []
            while not msgs or not msgs[-1]["done"]:
                msgs.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
            assert msgs[-1]["type"] == "error" and msgs[-1]["status_code"] == 400
            await assert_silent(ws)

            await ws.send(ws_message("ok", "Still works.", False))
            _, audio = await receive_until_done(ws, ["ok"])
            assert len(audio["ok"]) > 0

    asyncio.run(run())
    server.wait_idle()


def test_ws_contexts_per_socket_limit(server):
    async def run():
        async with ws_connect(server) as ws:
            await ws.send(ws_message("1", "One. ", True))
            await ws.send(ws_message("2", "Two. ", True))
            await ws.send(ws_message("3", "Three.", False))
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if m["context_id"] == "3":
                    break
            assert m["type"] == "error" and m["status_code"] == 429
            for c in ("1", "2"):
                await ws.send(ws_message(c, "", False))
            await receive_until_done(ws, ["1", "2"])

    asyncio.run(run())
    server.wait_idle()


def test_ws_wrong_key_fails_the_upgrade(server):
    async def run():
        with pytest.raises(websockets.exceptions.InvalidStatus) as info:
            async with websockets.connect(server.ws_url + "/tts/websocket",
                                          additional_headers={"X-API-Key": "wrong"}):
                pass
        assert info.value.response.status_code == 401
        with pytest.raises(websockets.exceptions.InvalidStatus) as info:
            async with ws_connect(server, headers={"Origin": "https://evil.example"}):
                pass
        assert info.value.response.status_code == 403
        async with websockets.connect(server.ws_url + f"/tts/websocket?api_key={KEY}") as ws:
            await ws.send(ws_message("q", "Hi.", False))
            await receive_until_done(ws, ["q"])

    asyncio.run(run())


def long_text(n=200):
    return " ".join(f"Sentence number {i} is here." for i in range(n))


def test_ws_cancel_stops_at_once(server):
    async def run():
        async with ws_connect(server) as ws:
            await ws.send(ws_message("c", long_text(), False))
            first = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert first["type"] == "chunk"
            await ws.send(json.dumps({"context_id": "c", "cancel": True}))
            # what was already on the wire may still arrive, then nothing at all
            deadline = time.monotonic() + 1.5
            late = 0
            while time.monotonic() < deadline:
                try:
                    m = json.loads(await asyncio.wait_for(ws.recv(), 0.3))
                except asyncio.TimeoutError:
                    break
                assert m["type"] == "chunk" and m["context_id"] == "c"
                late += 1
            await assert_silent(ws, 0.5)
            # a closing message racing the cancel starts nothing
            await ws.send(ws_message("c", "", False))
            await assert_silent(ws, 0.3)
            return late

    late = asyncio.run(run())
    assert late < 50
    m = server.wait_idle()
    assert m['gepard_contexts_ended_total{outcome="cancelled"}'] >= 1
    assert server.engine_quiet()


def test_ws_client_disconnect_mid_stream_frees_everything(server):
    async def run():
        ws = await ws_connect(server)
        await ws.send(ws_message("d1", long_text(), False))
        await ws.send(ws_message("d2", long_text(), True))
        got = 0
        while got < 5:
            m = json.loads(await asyncio.wait_for(ws.recv(), 10))
            got += m["type"] == "chunk"
        assert server.metrics()["gepard_active_contexts"] == 2
        ws.transport.abort()  # no close handshake: the client is simply gone

    asyncio.run(run())
    m = server.wait_idle()
    assert m["gepard_websocket_connections"] == 0
    assert m['gepard_contexts_ended_total{outcome="disconnected"}'] >= 2
    assert server.engine_quiet()


def test_http_client_disconnect_mid_stream_frees_everything(server):
    body = json.dumps(tts(long_text())).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /tts/bytes HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (KEY.encode(), len(body), body))
        received = 0
        while received < 20000:
            received += len(s.recv(65536))
        assert server.metrics()["gepard_active_contexts"] == 1
    m = server.wait_idle()
    assert m['gepard_contexts_ended_total{outcome="disconnected"}'] >= 1
    assert server.engine_quiet()


def test_many_requests_leave_nothing_behind(server):
    for i in range(10):
        status, _, _ = server.request("POST", "/tts/bytes", tts(f"Request {i}."), NEW)
        assert status == 200
    m = server.wait_idle()
    assert m["gepard_active_contexts"] == 0


# ---- TLS ----

def test_tls(model, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    s = gsp.GepardServer(model, tmp_path, max_frames=5,
                         args=["--tls-cert", str(cert), "--tls-key", str(key)])
    try:
        assert s.base_url.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        status, _, body = s.request("POST", "/tts/bytes", tts("Hi."), context=context)
        assert status == 200 and len(body) > 0

        async def over_wss():
            async with websockets.connect(s.ws_url + "/tts/websocket", ssl=context) as ws:
                await ws.send(ws_message("t", "Hi.", False))
                return await receive_until_done(ws, ["t"])

        _, audio = asyncio.run(over_wss())
        assert len(audio["t"]) > 0
    finally:
        s.stop()


def test_bad_configuration_is_refused(model, tmp_path):
    result = subprocess.run([str(gsp.SERVER), "--model", str(model), "--tls-cert", "x.pem"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "tls" in result.stderr.lower()
    if (gsp.SOURCE_DIR / "models" / "voice" / "config.json").is_file():
        return  # no model named: the server speaks with the default voice the tree ships
    result = subprocess.run([str(gsp.SERVER)], capture_output=True, text=True, timeout=30,
                            env={"PATH": "/usr/bin:/bin"})
    assert result.returncode != 0 and "model" in result.stderr


def test_model_that_does_not_load(tmp_path):
    result = subprocess.run([str(gsp.SERVER), "--model", str(tmp_path / "missing"), "--port", "0"],
                            capture_output=True, text=True, timeout=60,
                            env={"GST_PLUGIN_PATH_1_0": str(gsp.PLUGIN_DIR),
                                 "GST_REGISTRY_1_0": str(tmp_path / "registry.bin"),
                                 "TTS_DATA_DIR": str(tmp_path / "data"),
                                 "PATH": "/usr/bin:/bin"})
    assert result.returncode == 1 and "could not load the model" in result.stderr


def test_voices_dir(model, tmp_path):
    voices = tmp_path / "voices"
    voices.mkdir()
    subprocess.run(["gst-launch-1.0", "-q", "audiotestsrc", "num-buffers=30", "wave=pink-noise",
                    "!", "audio/x-raw,rate=22050,channels=1", "!", "audioconvert", "!",
                    "gepardvoiceenc", f"model={model}", "!", "filesink",
                    f"location={voices / 'narrator.bin'}"],
                   check=True, capture_output=True, timeout=60,
                   env={"GST_PLUGIN_PATH_1_0": str(gsp.PLUGIN_DIR),
                        "GST_REGISTRY_1_0": str(tmp_path / "registry.bin"),
                        "TTS_DATA_DIR": str(tmp_path / "data"),
                        "PATH": "/usr/bin:/bin"})
    s = gsp.GepardServer(model, tmp_path, max_frames=5, args=["--voices-dir", str(voices)])
    try:
        ids, after = [], ""
        while True:  # page by page, as the SDKs do, until an empty page
            status, _, body = s.request("GET", f"/voices?limit=1{after}", None, NEW)
            page = json.loads(body)["data"]
            if not page:
                break
            ids += [v["id"] for v in page]
            after = f"&starting_after={page[-1]['id']}"
        assert ids == ["default", "narrator"]
        status, _, audio = s.request("POST", "/tts/bytes", tts("Hi.", voice="narrator"))
        assert status == 200
        assert abs(len(audio) // 2 - gsp.expected_samples(1, 5, 24000)) <= 8
    finally:
        s.stop()

    (voices / "broken.bin").write_bytes(b"\0" * 12)
    result = subprocess.run([str(gsp.SERVER), "--model", str(model), "--port", "0",
                             "--voices-dir", str(voices)],
                            capture_output=True, text=True, timeout=60,
                            env={"GST_PLUGIN_PATH_1_0": str(gsp.PLUGIN_DIR),
                                 "GST_REGISTRY_1_0": str(tmp_path / "registry.bin"),
                                 "TTS_DATA_DIR": str(tmp_path / "data"),
                                 "PATH": "/usr/bin:/bin"})
    assert result.returncode == 1 and "broken.bin" in result.stderr


def test_ws_audio_comes_before_the_turn_is_complete(server):
    """A sentence is spoken as soon as it is complete: its audio arrives while the context is
    still open for more text."""
    async def run():
        async with ws_connect(server) as ws:
            await ws.send(ws_message("s", "The first sentence is complete. The second is", True))
            first = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert first["type"] == "chunk" and first["context_id"] == "s"
            await ws.send(ws_message("s", " not, until now.", False))
            _, audio = await receive_until_done(ws, ["s"])
            assert abs((len(audio["s"]) + len(base64.b64decode(first["data"]))) // 2
                       - gsp.expected_samples(2, MAX_FRAMES, 24000)) <= 8

    asyncio.run(run())


def test_health_while_the_model_loads(tmp_path):
    """The port opens before the model has loaded: /health says why it is not ready, and the
    generation routes answer 503 in Cartesia's shape. A deep test model loads slowly enough to
    be seen loading."""
    model = tmp_path / "deep-model"
    subprocess.run([str(gsp.GENERATOR), "--preset", "tiny", "--layers", "256", "--dtype", "f32",
                    str(model)], check=True, capture_output=True, timeout=120)
    process = subprocess.Popen(
        [str(gsp.SERVER), "--model", str(model), "--port", "0"], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
        env={"GST_PLUGIN_PATH_1_0": str(gsp.PLUGIN_DIR), "PATH": "/usr/bin:/bin",
             "GST_REGISTRY_1_0": str(tmp_path / "registry.bin"),
             "TTS_DATA_DIR": str(tmp_path / "data")})
    try:
        line = process.stdout.readline()
        port = int(line.rsplit(":", 1)[1].strip(" /\n"))
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(base + "/health") as r:
            pytest.fail(f"ready before loading: {r.read()}")
    except urllib.error.HTTPError as error:
        assert error.code == 503
        health = json.loads(error.read())
        assert health["status"] == "loading" and "loading the model" in health["reason"]
        request = urllib.request.Request(base + "/tts/bytes", data=json.dumps(tts()).encode(),
                                         headers=NEW)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request)
        assert info.value.code == 503
        assert json.loads(info.value.read())["error_code"] == "service_unavailable"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/health") as r:
                    assert json.loads(r.read())["status"] == "ok"
                    break
            except urllib.error.HTTPError as loading:
                assert loading.code == 503 and time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_total_contexts_limit(model, tmp_path):
    s = gsp.GepardServer(model, tmp_path, max_frames=MAX_FRAMES, args=["--max-contexts", "1"])

    async def run():
        async with websockets.connect(s.ws_url + "/tts/websocket") as ws:
            await ws.send(ws_message("busy", long_text(), False))
            assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "chunk"
            status, headers, body = s.request("POST", "/tts/bytes", tts("Hi."), NEW)
            check_error(status, headers, body, 429, "concurrency_limit_exceeded")
            await ws.send(ws_message("second", "Hi.", False))
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if m["context_id"] == "second":
                    break
            assert m["type"] == "error" and m["status_code"] == 429
            await ws.send(json.dumps({"context_id": "busy", "cancel": True}))
        s.wait_idle()
        status, _, body = s.request("POST", "/tts/bytes", tts("Hi."), NEW)
        assert status == 200 and len(body) > 0

    try:
        asyncio.run(run())
    finally:
        s.stop()
