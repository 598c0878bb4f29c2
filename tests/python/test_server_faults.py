"""gepard-server when something fails under it.

- The engine fails a step for one stream (GEPARD_FAULT_FAIL_STREAM_TEXT, the engine's fault
  injection): that context gets an error event (WebSocket, SSE) or a 500 in Cartesia's shape
  (/tts/bytes); the contexts running beside it finish normally and in full.
- Capacity: past --max-contexts, new generations are refused with 429 and a sentence saying what
  to do, and the ones running are not disturbed.
- PostgreSQL killed with SIGKILL mid-run: voices already read keep working, /health stays up, and
  the store recovers by itself once the database is back."""

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
import wave
from pathlib import Path

import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)

websockets = pytest.importorskip("websockets")

NEW = {"Cartesia-Version": "2026-03-01"}
RAW_S16 = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
MAX_FRAMES = 20
MARKER = "Kaboom"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return gsp.make_test_model(tmp_path_factory.mktemp("model"))


def tts(transcript, voice="default", **extra):
    return {"model_id": "sonic-3", "transcript": transcript, "voice": voice,
            "output_format": RAW_S16, **extra}


def ws_message(context_id, transcript, cont=False, voice="default"):
    return json.dumps({"context_id": context_id, "model_id": "sonic-3", "transcript": transcript,
                       "voice": {"mode": "id", "id": voice}, "output_format": RAW_S16,
                       "continue": cont})


async def receive_until_done(ws, contexts, timeout=30):
    """{context: (its last message, its audio)} once each of `contexts` has ended."""
    audio, ends = {}, {}
    while not set(contexts) <= set(ends):
        m = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if m["type"] == "chunk":
            audio[m["context_id"]] = audio.get(m["context_id"], b"") + base64.b64decode(m["data"])
        if m["done"]:
            assert m["context_id"] not in ends
            ends[m["context_id"]] = m
    return {c: (ends[c], audio.get(c, b"")) for c in contexts}


def samples(audio):
    return len(audio) // 2


@pytest.fixture(scope="module")
def faulty(model, tmp_path_factory):
    s = gsp.GepardServer(model, tmp_path_factory.mktemp("faulty"), max_frames=MAX_FRAMES,
                         env={"GEPARD_FAULT_FAIL_STREAM_TEXT": MARKER})
    yield s
    s.stop()


def test_engine_fault_fails_one_websocket_context_only(faulty):
    texts = {"good1": "One fine sentence. Another fine one.", "good2": "A third context speaks."}

    async def run():
        async with websockets.connect(faulty.ws_url + "/tts/websocket", max_size=None) as ws:
            await ws.send(ws_message("good1", texts["good1"]))
            await ws.send(ws_message("bad", f"This is fine. Then {MARKER} happens. Never said."))
            await ws.send(ws_message("good2", texts["good2"]))
            return await receive_until_done(ws, ["good1", "bad", "good2"])

    ends = asyncio.run(run())
    bad, bad_audio = ends["bad"]
    assert bad["type"] == "error" and bad["status_code"] == 500
    assert bad["error_code"] == "internal_error" and "Injected fault" in bad["message"]
    # the sentence before the fault was spoken (less the resampler's tail: no end of stream)
    assert 0 < gsp.expected_samples(1, MAX_FRAMES, 24000) - samples(bad_audio) < 64
    # generation is deterministic: the contexts beside the failing one are what they are alone
    for context in ("good1", "good2"):
        m, audio = ends[context]
        assert m["type"] == "done", m
        assert audio == faulty.request("POST", "/tts/bytes", tts(texts[context]), NEW)[2]
    m = faulty.wait_idle()
    assert m['gepard_contexts_ended_total{outcome="error"}'] >= 1
    assert faulty.request("GET", "/health")[0] == 200


def test_engine_fault_over_http(faulty):
    status, headers, body = faulty.request("POST", "/tts/bytes", tts(f"{MARKER} at once."), NEW)
    assert status == 500 and headers["Content-Type"].startswith("application/json")
    error = json.loads(body)
    assert error["error_code"] == "internal_error" and "Injected fault" in error["message"]
    assert error["request_id"]

    status, _, body = faulty.request("POST", "/tts/sse",
                                     tts(f"First is fine. {MARKER} second."), NEW)
    assert status == 200  # audio went out before the fault: the error is an event
    events = [json.loads(line[6:]) for line in body.decode().splitlines()
              if line.startswith("data: ")]
    assert events[0]["type"] == "chunk"
    assert events[-1]["type"] == "error" and events[-1]["status_code"] == 500

    status, _, audio = faulty.request("POST", "/tts/bytes", tts("Nothing wrong here."), NEW)
    assert status == 200
    assert abs(samples(audio) - gsp.expected_samples(1, MAX_FRAMES, 24000)) <= 8
    faulty.wait_idle()


def test_capacity_exhaustion_refuses_new_work_only(model, tmp_path):
    s = gsp.GepardServer(model, tmp_path, max_frames=MAX_FRAMES, args=["--max-contexts", "2"])
    text = " ".join(f"Sentence {i} runs on." for i in range(12))
    try:
        async def run():
            async with websockets.connect(s.ws_url + "/tts/websocket", max_size=None) as ws:
                await ws.send(ws_message("one", text))
                await ws.send(ws_message("two", text))
                await ws.send(ws_message("three", "No room for me."))
                status, _, body = await asyncio.to_thread(s.request, "POST", "/tts/bytes",
                                                          tts("Nor for me."), NEW)
                return await receive_until_done(ws, ["one", "two", "three"]), status, body

        ends, status, body = asyncio.run(run())
        # generation is deterministic: what ran beside the refusals is what runs alone
        s.wait_idle()
        alone = s.request("POST", "/tts/bytes", tts(text), NEW)[2]
        assert status == 429
        error = json.loads(body)
        assert error["error_code"] == "concurrency_limit_exceeded"
        assert "at most 2" in error["message"] and "retry" in error["message"]
        m, _ = ends["three"]
        assert m["type"] == "error" and m["status_code"] == 429 and "retry" in m["message"]
        for context in ("one", "two"):
            m, audio = ends[context]
            assert m["type"] == "done"
            assert audio == alone
        s.wait_idle()
        assert s.request("POST", "/tts/bytes", tts("Room again."), NEW)[0] == 200
    finally:
        s.stop()


# ---- PostgreSQL killed ----

def write_wav(path, seconds, rate=22050):
    import numpy as np
    t = np.arange(int(rate * seconds)) / rate
    x = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * np.random.default_rng(1).standard_normal(t.size)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    return path.read_bytes()


def clone(server, clip):
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nKilled\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"clip\"; "
            f"filename=\"clip.wav\"\r\nContent-Type: audio/wav\r\n\r\n").encode()
    body += clip + f"\r\n--{boundary}--\r\n".encode()
    status, _, answer = server.request(
        "POST", "/voices/clone", body,
        {"Content-Type": f"multipart/form-data; boundary={boundary}", **NEW})
    return status, json.loads(answer)


def pg_ctl(data_dir, *args):
    binary = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), None)
    binary = str(binary) if binary else shutil.which("pg_ctl")
    command = [binary, *args, "-D", str(Path(data_dir) / "data")]
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def pg_data_dir():
    if not any(Path("/usr/lib/postgresql").glob("*/bin/initdb")) and shutil.which("initdb") is None:
        pytest.skip("PostgreSQL (initdb, pg_ctl) is not installed")
    d = Path(tempfile.mkdtemp(prefix="gepard-faults-"))
    d.chmod(0o711)
    yield d / "postgres"
    shutil.rmtree(d, ignore_errors=True)


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_postgres_sigkill_and_restart(model, tmp_path, pg_data_dir):
    s = gsp.GepardServer(model, tmp_path, max_frames=5, args=["--data-dir", str(pg_data_dir)],
                         env={"DATABASE_URL": "", "TTS_DATABASE_URL": ""})
    try:
        status, voice = clone(s, write_wav(tmp_path / "clip.wav", 4))
        assert status == 200, voice
        assert s.request("POST", "/tts/bytes", tts("Before.", voice["id"]))[0] == 200

        postmaster = int((pg_data_dir / "data" / "postmaster.pid").read_text().split()[0])
        backends = [int(p) for p in subprocess.run(["pgrep", "-P", str(postmaster)],
                                                   capture_output=True, text=True).stdout.split()]
        os.kill(postmaster, signal.SIGKILL)
        # the backends notice their postmaster is gone and leave; whatever lingers goes too
        deadline = time.monotonic() + 10
        while any(alive(p) for p in backends) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in backends:
            if alive(p):
                os.kill(p, signal.SIGKILL)

        status, _, audio = s.request("POST", "/tts/bytes", tts("During.", voice["id"]), NEW)
        assert status == 200 and len(audio) > 0, "a voice read before the outage stopped working"
        status, _, body = s.request("GET", "/voices", None, NEW)
        assert status == 503 and json.loads(body)["error_code"] == "service_unavailable"
        health = s.request("GET", "/health")
        assert health[0] == 200

        log = Path(tempfile.gettempdir()) / f"gepard-test-pg-{uuid.uuid4().hex}.log"
        pg_ctl(pg_data_dir, "start", "-w", "-l", str(log))
        deadline = time.monotonic() + 30
        while True:
            status, _, body = s.request("GET", "/voices", None, NEW)
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status == 200, body
        assert voice["id"] in [v["id"] for v in json.loads(body)["data"]]
    finally:
        s.stop()
