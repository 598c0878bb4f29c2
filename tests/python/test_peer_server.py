"""The PyTorch peer server (tools/peer/gepard_peer.py) on the tiny random-weight model, on the CPU.

* a two-message turn (continue true, then false) with the gepard extension forcing 12 frames gives
  12 × 1024 samples and one done;
* greedy output of one stream equals the reference: frames from gepard_reference.py's modules
  (prefill, then one cached decode step per frame, argmax per head), audio from codec_reference.py's
  float64 one-shot decoder of the same frames;
* without ignore_stop, the stop head ends the stream where the reference's generate_greedy stops;
* seeded sampling (temperature, top-k) repeats itself for the same seed and gives valid codes;
* two contexts on two sockets at once both complete with their own lengths, a decode step ran with
  batch 2 (the server's /stats), and each equals the same request run alone;
* a cancelled context gets nothing more, and the socket goes on serving;
* malformed requests get Cartesia-shaped errors and the socket stays usable.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

torch = pytest.importorskip("torch")
websockets = pytest.importorskip("websockets")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("yaml")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import codec_reference  # noqa: E402
import gepard_reference  # noqa: E402

SOURCE_DIR = os.environ.get("GEPARD_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD_DIR = os.environ.get("GEPARD_BUILD_DIR") or os.path.join(SOURCE_DIR, "build")
MAKE_MODEL = os.path.join(BUILD_DIR, "tools", "gepard-make-test-model")
PEER = os.path.join(SOURCE_DIR, "tools", "peer", "gepard_peer.py")
SAMPLES_PER_FRAME = 1024
TEXT_A = ("Hello ", "world, this is the peer.")
TEXT_B = ("Another sentence", " to speak at the same time.")
# fp32 streaming codec vs the float64 one-shot reference: ~1e-6 expected (codec parity tests)
AUDIO_TOL = 1e-4


STOP_TEXT = "A sentence that stops."
STOP_FRAMES = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny model, with the stop head's bias moved so that greedy generation of STOP_TEXT stops
    part-way (random weights alone rarely stop within a few frames)."""
    if not os.path.exists(MAKE_MODEL):
        pytest.skip(f"{MAKE_MODEL} not built")
    from safetensors.torch import load_file, save_file

    base = tmp_path_factory.mktemp("peer")
    raw, out = base / "raw", base / "tiny"
    subprocess.run([MAKE_MODEL, "--preset", "tiny", "--seed", "7", str(raw)], check=True,
                   capture_output=True)
    frames, _ = _reference(str(raw), STOP_TEXT, STOP_FRAMES, audio=False)
    ids = gepard_reference.layout_ids(str(raw), STOP_TEXT)
    logits = gepard_reference.run_lm(str(raw), ids, frames=frames[:-1])["stop_logits"][1:]
    # logits[j] is the check made after frame j + 1. Pick the check from the 4th frame on that
    # exceeds every earlier one by the most, and put the threshold half-way across that gap.
    gaps = [(float(logits[j] - logits[:j].max()), j) for j in range(3, len(logits) - 1)]
    gap, j = max(gaps)
    assert gap > 0.1, f"no clear stop point in {logits}"
    shift = 2.0 ** -7 - float(logits[j]) + gap / 2
    tensors = load_file(str(raw / "model.safetensors"))
    tensors["stop_head.bias"] = (tensors["stop_head.bias"].float() + shift).to(tensors["stop_head.bias"].dtype)
    shutil.copytree(raw, out)
    save_file(tensors, str(out / "model.safetensors"))
    return str(out)


@pytest.fixture(scope="module")
def peer(model_dir):
    proc = subprocess.Popen(
        [sys.executable, PEER, "--model", model_dir, "--port", "0", "--device", "cpu",
         "--max-batch", "4", "--temperature", "0"],
        stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on http://"), line
        yield line.split()[-1]  # http://HOST:PORT/
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _request(context_id: str, transcript: str, more: bool, encoding: str = "pcm_f32le", **ext) -> str:
    msg = {"model_id": "gepard", "transcript": transcript, "voice": {"mode": "id", "id": "any"},
           "output_format": {"container": "raw", "encoding": encoding, "sample_rate": 22050},
           "context_id": context_id, "continue": more}
    if ext:
        msg["gepard"] = ext
    return json.dumps(msg)


async def _turn(url: str, context_id: str, parts: tuple[str, ...], **ext) -> dict:
    """One context on its own socket: audio (fp32), codes per chunk, messages."""
    async with websockets.connect(url.replace("http://", "ws://") + "tts/websocket") as ws:
        for i, part in enumerate(parts):
            await ws.send(_request(context_id, part, i < len(parts) - 1, **(ext if i == 0 else {})))
        audio, codes, messages = [], [], []
        while True:
            msg = json.loads(await asyncio.wait_for(ws.recv(), timeout=60))
            messages.append(msg)
            assert msg["context_id"] == context_id
            if msg["type"] != "chunk":
                break
            assert msg["done"] is False and msg["status_code"] == 206
            audio.append(np.frombuffer(base64.b64decode(msg["data"]), dtype="<f4"))
            codes.append(msg["codes"])
    return {"audio": np.concatenate(audio) if audio else np.zeros(0, np.float32),
            "codes": np.asarray(codes), "chunks": len(audio), "last": messages[-1]}


def _stats(url: str) -> dict:
    with urllib.request.urlopen(url + "stats", timeout=10) as r:
        return json.loads(r.read())


@torch.no_grad()
def _reference(model_dir: str, text: str, n_frames: int, audio: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Greedy frames with the stop head ignored (§3.3–§3.5) and their float64 one-shot audio."""
    ref = gepard_reference.load_reference(model_dir)
    ref.set_inv_freq("bf16")
    bounds = np.cumsum([0] + list(ref.cfg.head_levels))

    def pick(h):
        logits = ref.head_logits(h[None])[0]
        return [int(torch.argmax(logits[bounds[i]:bounds[i + 1]])) for i in range(len(bounds) - 1)]

    ids = gepard_reference.layout_ids(model_dir, text)
    hidden, cache = ref.forward(ref.prefill_embeds(ids, None))
    frames = [pick(hidden[-1])]
    while len(frames) < n_frames:
        h, cache = ref.forward(ref.frame_embed([frames[-1]]), cache)
        frames.append(pick(h[0]))
    if not audio:
        return np.asarray(frames), None
    codec = codec_reference.load_codec(os.path.join(model_dir, "codec.nemo"))
    return np.asarray(frames), codec.decode(np.asarray(frames, dtype=np.int32)).numpy()


def test_two_message_turn(peer):
    out = asyncio.run(_turn(peer, "turn-1", TEXT_A, max_frames=12, ignore_stop=True, return_codes=True))
    assert out["chunks"] == 12
    assert out["audio"].shape == (12 * SAMPLES_PER_FRAME,)
    assert out["last"] == {"type": "done", "context_id": "turn-1", "done": True, "status_code": 200}
    assert np.all(np.abs(out["audio"]) <= 1.0)


def test_greedy_matches_reference(peer, model_dir):
    n = 16
    out = asyncio.run(_turn(peer, "parity", TEXT_A, max_frames=n, ignore_stop=True, return_codes=True))
    frames, audio = _reference(model_dir, "".join(TEXT_A), n)
    np.testing.assert_array_equal(out["codes"], frames)
    err = float(np.max(np.abs(out["audio"].astype(np.float64) - audio)))
    print(f"\npeer vs reference: {n} frames equal, audio max |Δ| = {err:.2e}")
    assert err <= AUDIO_TOL


def test_stop_head_matches_reference(peer, model_dir):
    out = asyncio.run(_turn(peer, "stop", (STOP_TEXT,), max_frames=STOP_FRAMES, return_codes=True))
    ids = gepard_reference.layout_ids(model_dir, STOP_TEXT)
    ref = gepard_reference.generate_greedy(model_dir, ids, max_frames=STOP_FRAMES)
    print(f"\nstop head: reference {len(ref['frames'])} frames (stopped: {ref['stopped']}), "
          f"peer {out['chunks']}")
    assert ref["stopped"] and 4 <= len(ref["frames"]) < STOP_FRAMES
    assert out["last"]["type"] == "done"
    np.testing.assert_array_equal(out["codes"], ref["frames"])


def test_seeded_sampling(peer, model_dir):
    ext = {"max_frames": 6, "ignore_stop": True, "return_codes": True, "temperature": 0.8, "top_k": 4}
    a = asyncio.run(_turn(peer, "s1", TEXT_A, seed=11, **ext))
    b = asyncio.run(_turn(peer, "s2", TEXT_A, seed=11, **ext))
    c = asyncio.run(_turn(peer, "s3", TEXT_A, seed=12, **ext))
    levels = np.asarray(gepard_reference.CheckpointConfig(model_dir).head_levels)
    assert a["codes"].shape == (6, len(levels))
    assert np.all((a["codes"] >= 0) & (a["codes"] < levels))
    np.testing.assert_array_equal(a["codes"], b["codes"])
    np.testing.assert_array_equal(a["audio"], b["audio"])
    assert not np.array_equal(a["codes"], c["codes"])


def test_concurrent_contexts_are_batched(peer):
    solo_a = asyncio.run(_turn(peer, "solo-a", TEXT_A, max_frames=32, ignore_stop=True, return_codes=True))
    solo_b = asyncio.run(_turn(peer, "solo-b", TEXT_B, max_frames=20, ignore_stop=True, return_codes=True))
    before = _stats(peer)["steps_by_batch"].get("2", 0)

    async def both():
        return await asyncio.gather(
            _turn(peer, "ctx-a", TEXT_A, max_frames=32, ignore_stop=True, return_codes=True),
            _turn(peer, "ctx-b", TEXT_B, max_frames=20, ignore_stop=True, return_codes=True))

    a, b = asyncio.run(both())
    assert a["audio"].shape == (32 * SAMPLES_PER_FRAME,) and a["last"]["type"] == "done"
    assert b["audio"].shape == (20 * SAMPLES_PER_FRAME,) and b["last"]["type"] == "done"
    stats = _stats(peer)
    batched = stats["steps_by_batch"].get("2", 0) - before
    print(f"\nsteps by batch size: {stats['steps_by_batch']}; batch-2 steps in this run: {batched}")
    assert batched >= 1
    # batching changes nothing: same frames as each request alone, audio within fp32 noise
    np.testing.assert_array_equal(a["codes"], solo_a["codes"])
    np.testing.assert_array_equal(b["codes"], solo_b["codes"])
    assert float(np.max(np.abs(a["audio"] - solo_a["audio"]))) <= AUDIO_TOL
    assert float(np.max(np.abs(b["audio"] - solo_b["audio"]))) <= AUDIO_TOL


def _check_error(msg: dict, context_id: str | None) -> None:
    assert msg["type"] == "error" and msg["done"] is True and msg["status_code"] == 400
    assert isinstance(msg["error"], str) and msg["error"] == f"{msg['title']}: {msg['message']}"
    assert "error_code" in msg and isinstance(msg["request_id"], str)
    if context_id is not None:
        assert msg["context_id"] == context_id
    else:
        assert "context_id" not in msg


def test_bad_messages_get_errors(peer):
    async def go():
        async with websockets.connect(peer.replace("http://", "ws://") + "tts/websocket") as ws:
            await ws.send("{not json")
            _check_error(json.loads(await ws.recv()), None)
            await ws.send(_request("bad-enc", "hi", False, encoding="mp3"))
            msg = json.loads(await ws.recv())
            _check_error(msg, "bad-enc")
            assert "encoding" in msg["message"]
            await ws.send(_request("bad-ext", "hi", False, max_frames=0))
            _check_error(json.loads(await ws.recv()), "bad-ext")
            await ws.send(_request("empty", " ", False))
            _check_error(json.loads(await ws.recv()), "empty")
            bad_rate = json.loads(_request("rate", "hi", False))
            bad_rate["output_format"]["sample_rate"] = 44100
            await ws.send(json.dumps(bad_rate))
            _check_error(json.loads(await ws.recv()), "rate")
            # the socket still serves a good request, in 16-bit PCM
            await ws.send(_request("ok", "hi", False, "pcm_s16le", max_frames=3, ignore_stop=True))
            chunks = 0
            while True:
                msg = json.loads(await ws.recv())
                if msg["type"] != "chunk":
                    break
                assert len(base64.b64decode(msg["data"])) == 2 * SAMPLES_PER_FRAME
                chunks += 1
            assert msg["type"] == "done" and chunks == 3

    asyncio.run(go())


def test_cancel(peer):
    async def go():
        async with websockets.connect(peer.replace("http://", "ws://") + "tts/websocket") as ws:
            await ws.send(_request("long", "a long one", False, max_frames=2000, ignore_stop=True))
            for _ in range(3):
                msg = json.loads(await ws.recv())
                assert msg["type"] == "chunk" and msg["context_id"] == "long"
            await ws.send(json.dumps({"context_id": "long", "cancel": True}))
            await ws.send(_request("next", "next", False, max_frames=2, ignore_stop=True))
            seen = []
            while True:
                msg = json.loads(await asyncio.wait_for(ws.recv(), timeout=30))
                seen.append((msg["context_id"], msg["type"]))
                if msg["context_id"] == "next" and msg["type"] != "chunk":
                    break
            assert ("long", "done") not in seen
            assert [m for m in seen if m[0] == "next"] == [("next", "chunk")] * 2 + [("next", "done")]
            # chunks of "long" already on their way when the cancel arrived may come, nothing after
            assert len([m for m in seen if m[0] == "long"]) < 20

    asyncio.run(go())
