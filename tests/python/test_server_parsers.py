"""Regression tests for what fuzzing gepard-server's parsers found (tests/fuzz: fuzz-tts-body,
fuzz-ws-message, fuzz-clone-form), through a real server. Each input is also kept in the seed
corpus (tests/fuzz-corpus/<target>/crash-*), so the fuzzers check it on every run."""

import asyncio
import json
from pathlib import Path

import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)

websockets = pytest.importorskip("websockets")

CORPUS = gsp.SOURCE_DIR / "tests" / "fuzz-corpus"
NEW = {"Cartesia-Version": "2026-03-01"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = gsp.make_test_model(tmp_path_factory.mktemp("model"))
    s = gsp.GepardServer(model, tmp_path_factory.mktemp("server"), max_frames=5)
    yield s
    s.stop()


def lone_surrogate_body():
    return (CORPUS / "tts-body" / "crash-lone-surrogate-in-error.json").read_bytes()


def test_error_quoting_a_lone_surrogate_is_utf8_over_http(server):
    """json-glib quotes the bad input in its error, and a lone surrogate escape comes out as bytes
    that are not UTF-8: the error body must still be UTF-8 JSON."""
    status, headers, body = server.request("POST", "/tts/bytes", lone_surrogate_body(), NEW)
    assert status == 400
    error = json.loads(body.decode("utf-8"))  # strict: raises on anything but UTF-8
    assert error["error_code"] == "invalid_request" and "Invalid JSON" in error["message"]


def test_error_quoting_a_lone_surrogate_is_utf8_over_the_websocket(server):
    """A text frame that is not UTF-8 makes clients close the socket (1007): the error event must
    arrive, and the socket stay usable."""
    async def run():
        async with websockets.connect(server.ws_url + "/tts/websocket") as ws:
            await ws.send(lone_surrogate_body().decode("utf-8"))
            m = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert m["type"] == "error" and m["status_code"] == 400
            await ws.send(json.dumps({"context_id": "ok", "transcript": "Hi.", "voice": "default",
                                      "output_format": {"container": "raw",
                                                        "encoding": "pcm_s16le",
                                                        "sample_rate": 24000}}))
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 20))
                if m["done"]:
                    assert m["type"] == "done"
                    break

    asyncio.run(run())


@pytest.mark.parametrize("name", sorted(p.name for p in (CORPUS / "clone-form").glob("crash-*")))
def test_clone_forms_that_broke_the_parser(server, name):
    """Malformed forms (an empty last part that libsoup cuts to a negative length, a body the
    boundary search reads past) get a 400, and the server lives on."""
    data = (CORPUS / "clone-form" / name).read_bytes()
    content_type, _, body = data.partition(b"\n")
    headers = {**NEW}
    if b"\r" not in content_type:
        headers["Content-Type"] = content_type.decode("latin-1")
    status, _, answer = server.request("POST", "/voices/clone", body, headers)
    assert status in (400, 503), answer  # 503: this server may have no voice database
    if status == 400:
        assert json.loads(answer)["error_code"] == "invalid_request"
    assert server.request("GET", "/health")[0] == 200
