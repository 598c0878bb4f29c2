"""gepard-bench server against a real gepard-server with the tiny test model on the CPU, and the
"gepard" request extension that forces sentence lengths for it."""

import asyncio
import base64
import json
import re
import subprocess
import urllib.request

import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)

websockets = pytest.importorskip("websockets")

BENCH = gsp.BUILD_DIR / "tools" / "gepard-bench"
KEY = "bench-key-0123456789"
# the server's own limit, above what the benchmark forces: the request's max_frames decides
SERVER_MAX_FRAMES = 40
FRAMES = 6
SENTENCES = 2
RATE = 16000
ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)\s+([\d.]+)\s+"
                 r"([\d.]+)\s+([\d.]+)x\s+([\d.]+)s\s+(\d+)\s*$")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return gsp.make_test_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    s = gsp.GepardServer(model, tmp_path_factory.mktemp("server"), max_frames=SERVER_MAX_FRAMES,
                         api_key=KEY)
    yield s
    s.stop()


def bench(server, *args, timeout=120):
    if not BENCH.exists():
        pytest.skip(f"{BENCH} is not built")
    return subprocess.run([str(BENCH), "server", server.base_url, *args],
                          capture_output=True, text=True, timeout=timeout)


def parse(stdout):
    rows = [m.groups() for m in map(ROW.match, stdout.splitlines()) if m]
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return rows, lines


@pytest.mark.parametrize("encoding,width", [("pcm_f32le", 4), ("pcm_s16le", 2)])
def test_bench_server_levels(server, encoding, width):
    r = bench(server, "--concurrency", "1,4", "--frames", str(FRAMES), "--sentences",
              str(SENTENCES), "--api-key", KEY, "--sample-rate", str(RATE), "--encoding",
              encoding)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "TTFA p50" in r.stdout and "aggregate" in r.stdout
    rows, lines = parse(r.stdout)
    assert [int(row[0]) for row in rows] == [1, 4]
    assert [line["concurrency"] for line in lines] == [1, 4]
    expected = SENTENCES * FRAMES * gsp.FRAME_SECONDS
    for row, line in zip(rows, lines):
        assert int(row[-1]) == 0
        assert line["mode"] == "server"
        assert line["completed"] == line["concurrency"] and line["errors"] == 0
        assert line["frames"] == FRAMES and line["sentences"] == SENTENCES
        assert line["encoding"] == encoding and line["sample_rate"] == RATE
        # every stream got exactly the forced frames, within a frame
        for seconds in (line["audio_s"]["min"], line["audio_s"]["max"]):
            assert abs(seconds - expected) <= gsp.FRAME_SECONDS, line
        assert abs(line["audio_s"]["total"] - line["concurrency"] * expected) \
            <= line["concurrency"] * gsp.FRAME_SECONDS
        assert line["bytes"] == round(line["audio_s"]["total"] * RATE * width)
        for name in ("p50", "p90", "p99"):
            assert line["ttfa_ms"][name] > 0 and line["rtf"][name] > 0
        assert line["ttfa_ms"]["p50"] <= line["ttfa_ms"]["p90"] <= line["ttfa_ms"]["p99"]
        assert line["aggregate"] > 0 and line["wall_s"] > 0
        assert float(row[1]) == pytest.approx(line["ttfa_ms"]["p50"], abs=0.1)
        assert float(row[7]) == pytest.approx(line["aggregate"], abs=0.1)


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_bench_server_bad_key_is_reported(server, key):
    args = ["--concurrency", "1,4", "--frames", str(FRAMES)]
    if key is not None:
        args += ["--api-key", key]
    r = bench(server, *args)
    assert r.returncode != 0
    assert "401" in r.stderr
    rows, lines = parse(r.stdout)
    assert [int(row[-1]) for row in rows] == [1, 4]
    assert [(line["completed"], line["errors"]) for line in lines] == [(0, 1), (0, 4)]


def test_bench_server_key_in_query(server):
    if not BENCH.exists():
        pytest.skip(f"{BENCH} is not built")
    r = subprocess.run([str(BENCH), "server", f"{server.base_url}/?api_key={KEY}",
                        "--concurrency", "2", "--frames", "3", "--sentences", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    line = parse(r.stdout)[1][0]
    assert line["completed"] == 2
    assert abs(line["audio_s"]["max"] - 3 * gsp.FRAME_SECONDS) <= gsp.FRAME_SECONDS


def test_bench_server_unreachable(server):
    if not BENCH.exists():
        pytest.skip(f"{BENCH} is not built")
    r = subprocess.run([str(BENCH), "server", "http://127.0.0.1:9", "--concurrency", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert parse(r.stdout)[1][0]["errors"] == 2


def test_bench_server_bad_url():
    if not BENCH.exists():
        pytest.skip(f"{BENCH} is not built")
    r = subprocess.run([str(BENCH), "server", "ftp://example"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2


# ---- the "gepard" extension, as any client sends it ----

def ws_turn(server, extension, transcript="Hello there. How are you?"):
    async def run():
        async with websockets.connect(server.ws_url + "/tts/websocket",
                                      additional_headers={"X-API-Key": KEY},
                                      max_size=None) as ws:
            message = {"context_id": "x", "model_id": "sonic-3", "transcript": transcript,
                       "voice": {"mode": "id", "id": "default"},
                       "output_format": {"container": "raw", "encoding": "pcm_s16le",
                                         "sample_rate": 24000},
                       "continue": False}
            if extension is not None:
                message["gepard"] = extension
            await ws.send(json.dumps(message))
            audio, events = b"", []
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 30))
                events.append(event)
                if event["type"] == "chunk":
                    audio += base64.b64decode(event["data"])
                if event.get("done"):
                    return events, audio

    return asyncio.run(run())


@pytest.mark.parametrize("extension,frames", [
    (None, SERVER_MAX_FRAMES),
    ({"max_frames": 5, "ignore_stop": True}, 5),
    ({"max_frames": 3}, 3),
    # the server's own limit still applies
    ({"max_frames": 1000, "ignore_stop": True}, SERVER_MAX_FRAMES),
])
def test_extension_sets_sentence_length(server, extension, frames):
    events, audio = ws_turn(server, extension)
    assert events[-1]["type"] == "done", events[-1]
    assert abs(len(audio) // 2 - gsp.expected_samples(2, frames, 24000)) <= 8


@pytest.mark.parametrize("extension", [
    "fast", [], {"max_frames": 0}, {"max_frames": -3}, {"max_frames": 1.5},
    {"max_frames": "10"}, {"max_frames": 100001}, {"max_frames": 10, "ignore_stop": "yes"},
    {"ignore_stop": True},
])
def test_extension_refuses_bad_values(server, extension):
    events, audio = ws_turn(server, extension)
    assert events[-1]["type"] == "error" and events[-1]["status_code"] == 400, events[-1]
    assert "gepard" in events[-1]["message"]
    assert audio == b""


@pytest.mark.parametrize("extension,frames", [
    (None, SERVER_MAX_FRAMES),
    ({"max_frames": 4, "ignore_stop": True}, 4),
    ({"max_frames": 1000}, SERVER_MAX_FRAMES),
])
def test_extension_over_http(server, extension, frames):
    """/tts/bytes and /tts/sse take the field as the WebSocket does."""
    body = {"model_id": "sonic-3", "transcript": "Hello there. How are you?",
            "voice": {"mode": "id", "id": "default"},
            "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}}
    if extension is not None:
        body["gepard"] = extension
    request = urllib.request.Request(server.base_url + "/tts/bytes", data=json.dumps(body).encode(),
                                     headers={"X-API-Key": KEY, "Cartesia-Version": "2026-03-01"})
    with urllib.request.urlopen(request, timeout=60) as response:
        audio = response.read()
    assert abs(len(audio) // 2 - gsp.expected_samples(2, frames, 24000)) <= 8

    body["add_timestamps"] = False
    request = urllib.request.Request(server.base_url + "/tts/sse", data=json.dumps(body).encode(),
                                     headers={"X-API-Key": KEY, "Cartesia-Version": "2026-03-01"})
    samples = 0
    with urllib.request.urlopen(request, timeout=60) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                if event.get("type") == "chunk":
                    samples += len(base64.b64decode(event["data"])) // 2
    assert abs(samples - gsp.expected_samples(2, frames, 24000)) <= 8
