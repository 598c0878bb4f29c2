"""Access control and path handling of gepard-server.

- With an API key configured, every route but /health refuses a request without the key or with
  a wrong one (401, Cartesia's error shape; WebSocket upgrades fail the handshake). The routes
  come from the server's own route table (`gepard-server --list-routes`), the table the server
  dispatches with, so a new route cannot be left out of this test.
- Nothing a client names reaches the file system: voice ids shaped like paths, in URLs and in
  requests, are unknown voices (404), and a model given as a repo id cannot climb out of the
  Hugging Face cache."""

import asyncio
import json
import socket
import subprocess

import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)

websockets = pytest.importorskip("websockets")
from websockets.exceptions import InvalidStatus  # noqa: E402

KEY = "security-key-5f0c1a"
NEW = {"Cartesia-Version": "2026-03-01"}
RAW_S16 = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
TRAVERSALS = ["../../etc/passwd", "/etc/passwd", "..", ".", "default/../default",
              "..%2F..%2Fetc%2Fpasswd", "voices/../../x", "C:\\windows\\win.ini", "%00", "a\nb"]


def route_table():
    result = subprocess.run([str(gsp.SERVER), "--list-routes"], capture_output=True, text=True,
                            timeout=30, check=True)
    routes = []
    for line in result.stdout.splitlines():
        methods, path, access = line.split()
        for method in methods.split(","):
            routes.append((method, path, access))
    return routes


ROUTES = route_table()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = gsp.make_test_model(tmp_path_factory.mktemp("model"))
    s = gsp.GepardServer(model, tmp_path_factory.mktemp("server"), max_frames=5, api_key=KEY)
    yield s
    s.stop()


# Routes that answer without the key: health probes, and the playground's static page files (no
# generation, no voices). A new one has to be added here on purpose.
OPEN_ROUTES = {"/health", "/playground/{file}"}


def test_the_route_table_is_complete():
    """The table names every route the README documents, and opens only what is meant to be."""
    paths = {path for _, path, _ in ROUTES}
    assert {"/tts/bytes", "/tts/sse", "/tts/websocket", "/voices", "/voices/clone",
            "/voices/{id}", "/health", "/metrics"} <= paths
    assert {path for _, path, access in ROUTES if access == "open"} <= OPEN_ROUTES


def concrete(path):
    return path.replace("{id}", "default").replace("{file}", "index.html")


def send(server, method, path, headers):
    saved, server.api_key = server.api_key, None
    try:
        body = json.dumps({"transcript": "Hi.", "voice": "default",
                           "output_format": RAW_S16}).encode() if method == "POST" else None
        return server.request(method, concrete(path), body, {**NEW, **headers})
    finally:
        server.api_key = saved


@pytest.mark.parametrize("method,path,access", ROUTES)
@pytest.mark.parametrize("credentials", [{}, {"X-API-Key": "wrong"},
                                         {"Authorization": "Bearer wrong"},
                                         {"X-API-Key": KEY[:-1]}])
def test_every_route_refuses_a_missing_or_wrong_key(server, method, path, access, credentials):
    if path == "/tts/websocket":
        async def upgrade():
            with pytest.raises(InvalidStatus) as refused:
                async with websockets.connect(server.ws_url + path,
                                              additional_headers=credentials):
                    pass
            return refused.value.response.status_code

        assert asyncio.run(upgrade()) == 401
        return
    status, headers, body = send(server, method, path, credentials)
    if access == "open":
        assert path in OPEN_ROUTES and status != 401
        return
    assert status == 401, (method, path, status, body)
    error = json.loads(body)
    assert error["error_code"] == "unauthorized" and error["request_id"]


@pytest.mark.parametrize("method,path,access", ROUTES)
def test_every_route_takes_the_right_key(server, method, path, access):
    if path == "/tts/websocket":
        async def upgrade():
            async with websockets.connect(server.ws_url + path,
                                          additional_headers={"X-API-Key": KEY}):
                return True

        assert asyncio.run(upgrade())
        return
    status, _, body = send(server, method, path, {"X-API-Key": KEY})
    assert status != 401, (method, path, body)


def test_unknown_routes_need_the_key_too(server):
    """No answer tells a client without the key which routes exist."""
    for path in ("/nowhere", "/voices/../metrics", "/tts", "/admin"):
        status, _, _ = send(server, "GET", path, {})
        assert status == 401, path


def raw_get(server, target):
    """A request line sent as is: no client-side normalization of the path."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\n"
                  f"Cartesia-Version: 2026-03-01\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while piece := s.recv(65536):
            data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize("voice", [v for v in TRAVERSALS if "\n" not in v])
def test_voice_ids_in_urls_are_never_paths(server, voice):
    # as sent: dot segments are resolved by the HTTP layer (RFC 3986) into another route
    status, body = raw_get(server, "/voices/" + voice)
    assert status < 500 and b"root:" not in body, (voice, status, body)
    # escaped, the id is refused by libsoup (an escaped slash beside dots: 400) or reaches the
    # voice routes, which know no such voice
    escaped = voice.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C")
    if voice not in (".", ".."):
        status, body = raw_get(server, "/voices/" + escaped)
        assert status in (400, 404) and b"root:" not in body, (voice, status, body)
        if status == 404:
            assert json.loads(body)["error_code"] == "voice_not_found"


@pytest.mark.parametrize("voice", TRAVERSALS)
def test_voice_ids_in_requests_are_never_paths(server, voice):
    status, _, body = server.request("POST", "/tts/bytes",
                                     {"transcript": "Hi.", "voice": voice,
                                      "output_format": RAW_S16}, NEW)
    assert status == 404 and json.loads(body)["error_code"] == "voice_not_found"

    async def over_ws():
        async with websockets.connect(server.ws_url + "/tts/websocket",
                                      additional_headers={"X-API-Key": KEY}) as ws:
            await ws.send(json.dumps({"context_id": "t", "transcript": "Hi.",
                                      "voice": {"mode": "id", "id": voice},
                                      "output_format": RAW_S16}))
            return json.loads(await asyncio.wait_for(ws.recv(), 10))

    m = asyncio.run(over_ws())
    assert m["type"] == "error" and m["status_code"] == 404


@pytest.mark.parametrize("model", ["owner/..", "../owner/name", "owner/name@../../../../etc",
                                   "owner/na..me", "owner/name@.."])
def test_a_model_repo_id_cannot_leave_the_cache(tmp_path, model):
    """A model that is no directory is a repo id in the Hugging Face cache: one shaped to climb
    out of it is refused, and nothing outside is loaded."""
    cache = tmp_path / "cache"
    cache.mkdir()
    # a loadable model just outside the cache, where a climbing revision or name would land
    gsp.make_test_model(tmp_path)
    result = subprocess.run(
        [str(gsp.SERVER.resolve()), "--model", model, "--port", "0", "--device", "cpu"],
        capture_output=True, text=True, timeout=60, cwd=str(cache),
        env={"GST_PLUGIN_PATH_1_0": str(gsp.PLUGIN_DIR.resolve()), "HF_HUB_CACHE": str(cache),
             "HF_HUB_OFFLINE": "1", "GST_REGISTRY_1_0": str(tmp_path / "registry.bin"),
             "TTS_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "could not load the model" in result.stderr
    assert "ready:" not in result.stdout
