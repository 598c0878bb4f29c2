"""Voice cloning through gepard-server: POST /voices/clone, the PostgreSQL voice store, GET and
DELETE /voices/{id}, and synthesis with a cloned voice.

The server runs its own private PostgreSQL cluster in a temporary directory (DATABASE_URL is
cleared). The test model is untrained, so its prefixes and audio are noise: the tests check
statuses, shapes and that a cloned voice reaches the model, never the sound."""

import asyncio
import base64
import json
import shutil
import tempfile
import time
import uuid
import wave
from pathlib import Path

import numpy as np
import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)
if not any(Path("/usr/lib/postgresql").glob("*/bin/initdb")) and shutil.which("initdb") is None:
    pytest.skip("PostgreSQL (initdb, pg_ctl) is not installed", allow_module_level=True)

NEW = {"Cartesia-Version": "2026-03-01"}
RAW_S16 = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
MAX_FRAMES = 10


def tts(voice, transcript="Hello there."):
    return {"model_id": "sonic-3", "transcript": transcript, "voice": {"mode": "id", "id": voice},
            "output_format": RAW_S16}


def write_wav(path, seconds, kind="sine", rate=22050):
    n = int(rate * seconds)
    t = np.arange(n) / rate
    if kind == "sine":
        x = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * np.random.default_rng(1).standard_normal(n)
    else:
        x = np.zeros(n)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def multipart(fields, clip_name, clip):
    boundary = uuid.uuid4().hex
    out = b""
    for name, value in fields.items():
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n"
                f"{value}\r\n").encode()
    out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"clip\"; "
            f"filename=\"{clip_name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
    out += clip + f"\r\n--{boundary}--\r\n".encode()
    return out, {"Content-Type": f"multipart/form-data; boundary={boundary}", **NEW}


def clone(server, clip, name="Narrator", clip_name="clip.wav"):
    body, headers = multipart({"name": name, "language": "en", "description": "A test voice"},
                              clip_name, clip)
    status, _, answer = server.request("POST", "/voices/clone", body, headers)
    return status, json.loads(answer)


def check_error(status, body, expected_status, expected_code):
    assert status == expected_status, body
    assert body["error_code"] == expected_code
    assert body["title"] and body["message"] and body["request_id"]
    return body


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return gsp.make_test_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def data_dir():
    # As root the cluster runs as the postgres user, which cannot enter pytest's private
    # temporary directories: a directory of its own, open to enter.
    d = Path(tempfile.mkdtemp(prefix="gepard-voices-"))
    d.chmod(0o711)
    yield d / "postgres"
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    return {
        "good": write_wav(d / "good.wav", 5).read_bytes(),
        "short": write_wav(d / "short.wav", 1).read_bytes(),
        "long": write_wav(d / "long.wav", 20, rate=8000).read_bytes(),
        "silent": write_wav(d / "silent.wav", 5, kind="silent").read_bytes(),
    }


MAX_CLIP_BYTES = 400_000


def start(model, tmp_path_factory, data_dir):
    return gsp.GepardServer(model, tmp_path_factory.mktemp("server"), max_frames=MAX_FRAMES,
                            args=["--data-dir", str(data_dir),
                                  "--max-clip-bytes", str(MAX_CLIP_BYTES)],
                            env={"DATABASE_URL": "", "TTS_DATABASE_URL": ""})


@pytest.fixture(scope="module")
def server(model, tmp_path_factory, data_dir):
    s = start(model, tmp_path_factory, data_dir)
    yield s
    s.stop()


def ws_audio(server, voice):
    """The audio of one WebSocket context spoken with `voice`, or the error event."""
    websockets = pytest.importorskip("websockets")

    async def run():
        async with websockets.connect(server.ws_url + "/tts/websocket", max_size=None) as ws:
            # the second message waits behind the first while its voice is fetched
            for text, cont in (("Hello", True), (" there.", False)):
                await ws.send(json.dumps({
                    "context_id": "c", "model_id": "sonic-3", "transcript": text,
                    "voice": {"mode": "id", "id": voice}, "output_format": RAW_S16,
                    "continue": cont}))
            audio = b""
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 30))
                assert m["context_id"] == "c"
                if m["type"] == "chunk":
                    audio += base64.b64decode(m["data"])
                elif m["type"] == "error" or m.get("done"):
                    return audio, m

    return asyncio.run(run())


def list_ids(server):
    ids, after = [], ""
    while True:  # page by page, as the SDKs do, until an empty page
        status, _, body = server.request("GET", f"/voices?limit=2{after}", None, NEW)
        assert status == 200, body
        page = json.loads(body)["data"]
        if not page:
            return ids
        ids += [v["id"] for v in page]
        after = f"&starting_after={page[-1]['id']}"


def test_clone_synthesize_restart_delete(model, tmp_path_factory, data_dir, server, clips):
    status, voice = clone(server, clips["good"])
    assert status == 200, voice
    assert uuid.UUID(voice["id"])
    assert voice["name"] == "Narrator" and voice["language"] == "en"
    assert voice["description"] == "A test voice" and voice["is_owner"] is True
    assert voice["created_at"]
    vid = voice["id"]

    ids = list_ids(server)
    assert ids[0] == "default" and vid in ids

    status, _, body = server.request("GET", f"/voices/{vid}", None, NEW)
    assert status == 200 and json.loads(body)["id"] == vid

    status, _, default_audio = server.request("POST", "/tts/bytes", tts("default"))
    assert status == 200
    status, _, cloned_audio = server.request("POST", "/tts/bytes", tts(vid))
    assert status == 200
    expected = gsp.expected_samples(1, MAX_FRAMES, 24000)
    assert abs(len(cloned_audio) // 2 - expected) <= 8
    # the same seed and text: only the prefix differs
    status, _, default_again = server.request("POST", "/tts/bytes", tts("default"))
    assert default_again == default_audio, "synthesis is not deterministic with a seed"
    assert cloned_audio != default_audio

    # a new process reads the voice from the database, not from a cache
    server.stop()
    restarted = start(model, tmp_path_factory, data_dir)
    try:
        # first use on this process through a WebSocket: fetched from the database
        audio, last = ws_audio(restarted, vid)
        assert last["type"] == "done", last
        assert abs(len(audio) // 2 - expected) <= 8
        assert vid in list_ids(restarted)
        status, _, again = restarted.request("POST", "/tts/bytes", tts(vid))
        assert status == 200 and again != default_audio
        assert abs(len(again) // 2 - expected) <= 8

        status, _, body = restarted.request("DELETE", f"/voices/{vid}", None, NEW)
        assert status in (200, 204), body
        status, _, body = restarted.request("GET", f"/voices/{vid}", None, NEW)
        check_error(status, json.loads(body), 404, "voice_not_found")
        status, _, body = restarted.request("POST", "/tts/bytes", tts(vid), NEW)
        check_error(status, json.loads(body), 404, "voice_not_found")
        status, _, body = restarted.request("DELETE", f"/voices/{vid}", None, NEW)
        check_error(status, json.loads(body), 404, "voice_not_found")
        assert vid not in list_ids(restarted)
        _, last = ws_audio(restarted, vid)
        assert last["type"] == "error" and last["error_code"] == "voice_not_found", last
    finally:
        restarted.stop()


@pytest.fixture(scope="module")
def second_server(model, tmp_path_factory, data_dir):
    s = start(model, tmp_path_factory, data_dir)
    yield s
    s.stop()


@pytest.mark.parametrize("kind,clip_name,words", [
    ("short", "short.wav", "too short"),
    ("long", "long.wav", "too long"),
    ("silent", "silent.wav", "silent"),
    ("text", "notes.txt", "decode"),
    ("corrupt", "broken.wav", ""),
])
def test_bad_clips(second_server, clips, kind, clip_name, words):
    clip = {"text": b"These are notes, not audio.\n" * 40,
            "corrupt": clips["good"][:44] + bytes(range(256)) * 8}.get(kind) or clips[kind]
    status, body = clone(second_server, clip, clip_name=clip_name)
    error = check_error(status, body, 400, "invalid_request")
    assert words in error["message"]


def test_clip_over_the_size_limit(second_server):
    status, body = clone(second_server, b"RIFF" + bytes(MAX_CLIP_BYTES))
    check_error(status, body, 413, "payload_too_large")


def test_clone_form_errors(second_server, clips):
    body, headers = multipart({"language": "en"}, "clip.wav", clips["good"])
    status, _, answer = second_server.request("POST", "/voices/clone", body, headers)
    check_error(status, json.loads(answer), 400, "invalid_request")
    status, _, answer = second_server.request("POST", "/voices/clone", b"{}",
                                              {"Content-Type": "application/json", **NEW})
    check_error(status, json.loads(answer), 400, "invalid_request")


def test_unknown_voices(second_server):
    for vid in (str(uuid.uuid4()), "no-such-voice"):
        status, _, body = second_server.request("GET", f"/voices/{vid}", None, NEW)
        check_error(status, json.loads(body), 404, "voice_not_found")
        status, _, body = second_server.request("POST", "/tts/bytes", tts(vid), NEW)
        check_error(status, json.loads(body), 404, "voice_not_found")
    status, _, body = second_server.request("DELETE", "/voices/default", None, NEW)
    assert status == 403, body


def pg_ctl(data_dir, *args):
    """pg_ctl on the servers' private cluster, as the user that owns it."""
    import os
    import subprocess
    binary = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), None)
    binary = str(binary) if binary else shutil.which("pg_ctl")
    command = [binary, *args, "-D", str(Path(data_dir) / "data")]
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, check=True, capture_output=True, timeout=60)


def test_two_servers_and_a_database_outage(model, tmp_path_factory, data_dir, clips):
    """Two server processes on one database see each other's voices. With the database stopped,
    a voice a process has read keeps working, an unread one answers 503, and both recover by
    themselves once the database is back."""
    a = start(model, tmp_path_factory, data_dir)
    b = start(model, tmp_path_factory, data_dir)
    try:
        status, first = clone(a, clips["good"], name="Shared")
        assert status == 200, first
        status, second = clone(a, clips["good"], name="Unread")
        assert status == 200, second
        assert first["id"] in list_ids(b) and second["id"] in list_ids(b)
        status, _, audio = b.request("POST", "/tts/bytes", tts(first["id"]))
        assert status == 200 and len(audio) > 0

        pg_ctl(data_dir, "stop", "-w", "-m", "fast")
        status, _, audio = b.request("POST", "/tts/bytes", tts(first["id"]))
        assert status == 200 and len(audio) > 0, "a voice read before the outage stopped working"
        status, _, body = b.request("POST", "/tts/bytes", tts(second["id"]), NEW)
        check_error(status, json.loads(body), 503, json.loads(body)["error_code"])

        log = Path(tempfile.gettempdir()) / f"gepard-test-pg-{uuid.uuid4().hex}.log"
        pg_ctl(data_dir, "start", "-w", "-l", str(log))
        deadline = time.monotonic() + 30
        while True:
            status, _, audio = b.request("POST", "/tts/bytes", tts(second["id"]))
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status == 200 and len(audio) > 0, "no recovery after the database came back"

        status, _, body = b.request("DELETE", f"/voices/{second['id']}", None, NEW)
        assert status in (200, 204), body
        assert second["id"] not in list_ids(a)
    finally:
        a.stop()
        b.stop()
