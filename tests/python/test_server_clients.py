"""gepard-server with the stock Cartesia clients from PyPI, changed only in their base URL:
the cartesia SDK, Pipecat's CartesiaTTSService and CartesiaHttpTTSService, and LiveKit's
livekit-plugins-cartesia. Each test checks the audio the client hands back (length, sample
rate, channels), not only that a call returned. Versions are pinned in tests/requirements.txt.

The model is an untrained test model whose sentences all run to the frame limit, so a text of
n sentences gives n * MAX_FRAMES frames of audio."""

import asyncio
import time

import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)

KEY = "client-test-key"
MAX_FRAMES = 20
TWO_SENTENCES = "Hello world. How are you today?"
# a turn that is interrupted, cancelled or cut: 60 sentences took 1.0 s to speak on 2 idle cores, so
# an interruption 0.7 s in came after its end now and then on a loaded machine; 300 take about 5 s
LONG_SENTENCES = 300
LONG_TEXT = " ".join(f"Sentence number {i} is here." for i in range(LONG_SENTENCES))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = gsp.make_test_model(tmp_path_factory.mktemp("model"))
    s = gsp.GepardServer(model, tmp_path_factory.mktemp("server"), max_frames=MAX_FRAMES,
                         api_key=KEY)
    yield s
    s.stop()


def assert_samples(n_samples, n_sentences, rate, slack=8):
    expected = gsp.expected_samples(n_sentences, MAX_FRAMES, rate)
    assert abs(n_samples - expected) <= slack, (n_samples, expected)


# ---- cartesia (the official Python SDK) ----

def cartesia_client(server):
    cartesia = pytest.importorskip("cartesia")
    return cartesia.Cartesia(api_key=KEY, base_url=server.base_url,
                             websocket_base_url=server.ws_url)


def test_cartesia_sdk_bytes(server):
    client = cartesia_client(server)
    response = client.tts.generate(
        model_id="sonic-3", transcript=TWO_SENTENCES, voice="default",
        output_format={"container": "raw", "encoding": "pcm_f32le", "sample_rate": 44100})
    audio = response.read()
    assert len(audio) % 4 == 0
    assert_samples(len(audio) // 4, 2, 44100)

    response = client.tts.generate(
        model_id="sonic-3", transcript="Hello.", voice={"mode": "id", "id": "default"},
        output_format={"container": "wav", "encoding": "pcm_s16le", "sample_rate": 8000})
    wav = response.read()
    assert wav[:4] == b"RIFF"
    assert_samples((len(wav) - 44) // 2, 1, 8000)


def test_cartesia_sdk_sse(server):
    client = cartesia_client(server)
    events = list(client.tts.generate_sse(
        model_id="sonic-3", transcript=TWO_SENTENCES, voice="default", add_timestamps=True,
        output_format={"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}))
    assert events[-1].type == "done"
    audio = b"".join(e.audio for e in events if e.type == "chunk")
    assert_samples(len(audio) // 2, 2, 24000)
    words = [w for e in events if e.type == "timestamps" for w in e.word_timestamps.words]
    assert words == TWO_SENTENCES.split()


def test_cartesia_sdk_websocket(server):
    client = cartesia_client(server)
    fmt = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000}
    with client.tts.websocket_connect() as ws:
        first = ws.context(model_id="sonic-3", voice="default", output_format=fmt,
                           add_timestamps=True)
        second = ws.context(model_id="sonic-3", voice="default", output_format=fmt)
        first.push("Hello world. ")
        second.push("A second context on the same socket.")
        first.push("How are you today?")
        second.no_more_inputs()
        first.no_more_inputs()
        first_events = list(first.receive())
        second_events = list(second.receive())

        cancelled = ws.context(model_id="sonic-3", voice="default", output_format=fmt)
        cancelled.push(LONG_TEXT)
        cancelled.cancel()
        after = ws.context("after-cancel", model_id="sonic-3", voice="default",
                           output_format=fmt)
        after.push("After the cancel.")
        after.no_more_inputs()
        after_events = list(after.receive())

    for events, sentences in ((first_events, 2), (second_events, 1), (after_events, 1)):
        assert events[-1].type == "done"
        audio = b"".join(e.audio for e in events if e.type == "chunk")
        assert_samples(len(audio) // 2, sentences, 16000)
    words = [w for e in first_events if e.type == "timestamps" for w in e.word_timestamps.words]
    assert words == TWO_SENTENCES.split()
    # nothing of the cancelled context reached the next one
    assert all(e.context_id == "after-cancel" for e in after_events)
    server.wait_idle()


def test_cartesia_sdk_voices(server):
    client = cartesia_client(server)
    assert [v.id for v in client.voices.list()] == ["default"]  # pagination terminates


# ---- Pipecat ----

def pipecat_modules():
    pytest.importorskip("pipecat")
    from pipecat.frames import frames
    from pipecat.services.cartesia import tts
    from pipecat.tests import utils
    return frames, tts, utils


def test_pipecat_websocket_service(server):
    frames, tts, utils = pipecat_modules()
    service = tts.CartesiaTTSService(api_key=KEY, url=server.ws_url + "/tts/websocket",
                                     settings=tts.CartesiaTTSService.Settings(voice="default"))
    down, up = asyncio.run(utils.run_test(
        service, frames_to_send=[frames.TTSSpeakFrame(TWO_SENTENCES), utils.SleepFrame(2.0)]))
    audio = [f for f in down if isinstance(f, frames.TTSAudioRawFrame)]
    assert audio and all(f.sample_rate == 24000 and f.num_channels == 1 for f in audio)
    assert_samples(sum(len(f.audio) for f in audio) // 2, 2, 24000)
    assert any(isinstance(f, frames.TTSStoppedFrame) for f in down)
    # Pipecat rebuilds the spoken text from the word timestamps
    assert [f.text for f in down if type(f) is frames.TTSTextFrame] == TWO_SENTENCES.split()
    assert not [f for f in down + up if isinstance(f, frames.ErrorFrame)]


def test_pipecat_websocket_interruption(server):
    frames, tts, utils = pipecat_modules()
    before = server.metrics().get('gepard_contexts_ended_total{outcome="cancelled"}', 0)
    service = tts.CartesiaTTSService(api_key=KEY, url=server.ws_url + "/tts/websocket",
                                     settings=tts.CartesiaTTSService.Settings(voice="default"))
    down, up = asyncio.run(utils.run_test(service, frames_to_send=[
        frames.TTSSpeakFrame(LONG_TEXT), utils.SleepFrame(0.7), frames.InterruptionFrame(),
        utils.SleepFrame(0.3), frames.TTSSpeakFrame("After the interruption."),
        utils.SleepFrame(2.0)]))
    by_context = {}
    for f in down:
        if isinstance(f, frames.TTSAudioRawFrame):
            assert f.sample_rate == 24000 and f.num_channels == 1
            by_context.setdefault(f.context_id, []).append(len(f.audio))
    assert len(by_context) == 2
    interrupted, after = by_context.values()
    # the first turn stopped early, the second was spoken in full
    assert 0 < sum(interrupted) // 2 < gsp.expected_samples(LONG_SENTENCES, MAX_FRAMES, 24000) // 2
    assert_samples(sum(after) // 2, 1, 24000)
    assert any(isinstance(f, frames.InterruptionFrame) for f in down)
    assert not [f for f in down + up if isinstance(f, frames.ErrorFrame)]
    m = server.wait_idle()
    assert m['gepard_contexts_ended_total{outcome="cancelled"}'] == before + 1
    assert server.engine_quiet()


def test_pipecat_http_service(server):
    frames, tts, utils = pipecat_modules()
    service = tts.CartesiaHttpTTSService(
        api_key=KEY, base_url=server.base_url,
        settings=tts.CartesiaHttpTTSService.Settings(voice="default"))
    down, up = asyncio.run(utils.run_test(
        service, frames_to_send=[frames.TTSSpeakFrame(TWO_SENTENCES), utils.SleepFrame(1.0)]))
    audio = [f for f in down if isinstance(f, frames.TTSAudioRawFrame)]
    assert audio and all(f.sample_rate == 24000 and f.num_channels == 1 for f in audio)
    assert_samples(sum(len(f.audio) for f in audio) // 2, 2, 24000)
    assert not [f for f in down + up if isinstance(f, frames.ErrorFrame)]


def test_pipecat_http_error_reaches_the_pipeline(server):
    frames, tts, utils = pipecat_modules()
    service = tts.CartesiaHttpTTSService(
        api_key=KEY, base_url=server.base_url,
        settings=tts.CartesiaHttpTTSService.Settings(voice="no-such-voice"))
    down, up = asyncio.run(utils.run_test(
        service, frames_to_send=[frames.TTSSpeakFrame("Hello."), utils.SleepFrame(0.5)]))
    # the first error carries the status and the Cartesia error body (Pipecat adds one of its
    # own later, for a context that ended without audio)
    errors = [f for f in down + up if isinstance(f, frames.ErrorFrame)]
    assert errors and "status 404" in errors[0].error and "voice_not_found" in errors[0].error
    assert not [f for f in down if isinstance(f, frames.TTSAudioRawFrame)]


# ---- LiveKit Agents ----

def livekit_tts(server, session, **options):
    pytest.importorskip("livekit.agents")
    from livekit.plugins import cartesia
    return cartesia.TTS(api_key=KEY, base_url=server.base_url, http_session=session,
                        voice="default", **options)


def test_livekit_synthesize(server):
    aiohttp = pytest.importorskip("aiohttp")

    async def run():
        async with aiohttp.ClientSession() as session:
            tts = livekit_tts(server, session, sample_rate=16000)
            frames = [ev.frame async for ev in tts.synthesize(TWO_SENTENCES)]
            await tts.aclose()
            return frames

    frames = asyncio.run(run())
    assert all(f.sample_rate == 16000 and f.num_channels == 1 for f in frames)
    # LiveKit cuts the bytes into 10 ms frames and pads the last one
    assert_samples(sum(f.samples_per_channel for f in frames), 2, 16000, slack=160)


def test_livekit_stream_two_turns_on_one_socket(server):
    aiohttp = pytest.importorskip("aiohttp")

    async def run():
        async with aiohttp.ClientSession() as session:
            tts = livekit_tts(server, session)
            turns = []
            for _ in range(2):
                stream = tts.stream()
                stream.push_text(TWO_SENTENCES)
                stream.end_input()
                turns.append([ev async for ev in stream])
                await stream.aclose()
            await tts.aclose()
            return turns

    for events in asyncio.run(run()):
        frames = [ev.frame for ev in events]
        assert all(f.sample_rate == 24000 and f.num_channels == 1 for f in frames)
        assert_samples(sum(f.samples_per_channel for f in frames), 2, 24000, slack=240)
        assert len({ev.segment_id for ev in events}) == 1
    server.wait_idle()


def test_livekit_stream_interrupted_by_closing(server):
    aiohttp = pytest.importorskip("aiohttp")
    before = server.metrics().get('gepard_contexts_ended_total{outcome="disconnected"}', 0)

    async def run():
        async with aiohttp.ClientSession() as session:
            tts = livekit_tts(server, session)
            stream = tts.stream()
            stream.push_text(LONG_TEXT)
            stream.end_input()
            received = 0
            async for ev in stream:
                received += ev.frame.samples_per_channel
                if received > 24000:
                    break
            await stream.aclose()  # barge-in: LiveKit drops the socket
            # the next turn opens a new socket and is spoken in full
            stream = tts.stream()
            stream.push_text("After the interruption.")
            stream.end_input()
            after = [ev async for ev in stream]
            await stream.aclose()
            await tts.aclose()
            return after

    after = asyncio.run(run())
    assert_samples(sum(ev.frame.samples_per_channel for ev in after), 1, 24000, slack=240)
    deadline = time.monotonic() + 10
    while server.metrics().get('gepard_contexts_ended_total{outcome="disconnected"}', 0) == before:
        assert time.monotonic() < deadline, "the closed socket's context was not stopped"
        time.sleep(0.05)
    server.wait_idle()
    assert server.engine_quiet()
