"""gepard-server fetching its model from a Hugging Face hub on first start.

A hub runs in the test: a real HTTP server with the hub's URL layout and headers
(GET /api/models/{repo}/revision/{rev}; HEAD and GET /{repo}/resolve/{rev}/{file} with
X-Repo-Commit, ETag, and for LFS files a 302 to a second server, the "CDN", with X-Linked-Etag
and X-Linked-Size; X-Error-Code on errors). Its repos hold untrained test models from
gepard-make-test-model. The server downloads into a fresh HF_HUB_CACHE, then speaks."""

import hashlib
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)

TOKEN = "hf_test_token_0123456789"
MODEL = "gepard-test/tiny"                # single model.safetensors, codec.nemo beside it
SHARDED = "gepard-test/tiny-sharded"      # an index and two shards, no codec
NO_CODEC = "gepard-test/tiny-nocodec"     # model.safetensors, no codec
CODEC = "gepard-test/codec"               # a codec repo: codec.nemo
PUBLISHED_CODEC = "nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps"
MAX_FRAMES = 5


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(name):
    return name.endswith((".safetensors", ".nemo"))


class Repo:
    def __init__(self, repo_id, files):
        self.repo_id = repo_id
        self.files = files  # name → bytes
        self.commit = hashlib.sha1(repo_id.encode() + b"".join(
            hashlib.sha256(files[n]).digest() for n in sorted(files))).hexdigest()


class Hub:
    """The hub and its CDN, with faults to inject."""

    def __init__(self, repos):
        self.repos = {r.repo_id: r for r in repos}
        self.by_sha256 = {hashlib.sha256(d).hexdigest(): d
                          for r in repos for d in r.files.values()}
        self.token = None          # when set, resolve answers 401 GatedRepo without it
        self.api = True            # False: a plain mirror without /api (404, no X-Error-Code)
        self.corrupt = set()       # file names served with a flipped byte
        self.drop_after = {}       # file name → bytes sent before the connection is cut, once
        self.hold = {}             # file name → Event the CDN waits for half-way through
        self.requests = []         # (server, method, path, headers)
        self.lock = threading.Lock()
        self.hub = self._serve("hub")
        self.cdn = self._serve("cdn")

    def _serve(self, role):
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._handle(self, role, head=True)

            def do_GET(self):
                hub._handle(self, role, head=False)

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    @property
    def url(self):
        return f"http://127.0.0.1:{self.hub.server_address[1]}"

    @property
    def cdn_url(self):
        return f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def stop(self):
        for s in (self.hub, self.cdn):
            s.shutdown()
            s.server_close()

    def log(self, role=None):
        with self.lock:
            return [r for r in self.requests if role is None or r[0] == role]

    # ---- answers ----

    @staticmethod
    def _send(h, status, headers=None, body=b"", head=False):
        h.send_response(status)
        headers = dict(headers or {})
        headers.setdefault("Content-Length", str(len(body)))
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if not head and body:
            h.wfile.write(body)

    def _error(self, h, status, code, message, head):
        body = json.dumps({"error": message}).encode()
        self._send(h, status, {"X-Error-Code": code, "X-Error-Message": message,
                               "Content-Type": "application/json"}, body, head)

    def _handle(self, h, role, head):
        path = urllib.parse.urlsplit(h.path).path
        with self.lock:
            self.requests.append((role, h.command, path, dict(h.headers)))
        if role == "cdn":
            return self._cdn(h, path, head)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        if m:
            return self._api(h, m.group(1), urllib.parse.unquote(m.group(2)), head)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(h, m.group(1), urllib.parse.unquote(m.group(2)),
                                 urllib.parse.unquote(m.group(3)), head)
        self._send(h, 404, body=b"Not Found", head=head)

    def _authorized(self, h):
        return self.token is None or h.headers.get("Authorization") == f"Bearer {self.token}"

    def _repo(self, h, repo_id, revision, head):
        repo = self.repos.get(repo_id)
        if repo is None:
            # the hub answers so for a repo that does not exist and a private one alike
            self._error(h, 401, "RepoNotFound", f"Repository Not Found for url: {h.path}.", head)
            return None
        if revision not in ("main", repo.commit):
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
            return None
        return repo

    def _api(self, h, repo_id, revision, head):
        if not self.api:
            return self._send(h, 404, body=b"Not Found", head=head)
        repo = self._repo(h, repo_id, revision, head)
        if repo is None:
            return
        body = json.dumps({
            "_id": "0" * 24, "id": repo_id, "modelId": repo_id, "sha": repo.commit,
            "private": False, "gated": "manual" if self.token else False,
            "siblings": [{"rfilename": n} for n in sorted(repo.files)],
        }).encode()
        self._send(h, 200, {"Content-Type": "application/json"}, body, head)

    def _resolve(self, h, repo_id, revision, name, head):
        repo = self._repo(h, repo_id, revision, head)
        if repo is None:
            return
        if not self._authorized(h):
            return self._error(
                h, 401, "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.", head)
        data = repo.files.get(name)
        if data is None:
            return self._error(h, 404, "EntryNotFound", f"{name} does not exist on \"main\"",
                               head)
        common = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        if is_lfs(name):
            sha256 = hashlib.sha256(data).hexdigest()
            pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\n"
                       f"size {len(data)}\n").encode()
            location = f"{self.cdn_url}/repos/{sha256}?response-content-disposition=attachment"
            return self._send(h, 302, {**common, "Location": location,
                                       "ETag": f'"{git_blob_sha1(pointer)}"',
                                       "X-Linked-Etag": f'"{sha256}"',
                                       "X-Linked-Size": str(len(data))},
                              b"Found. Redirecting to " + location.encode(), head)
        self._content(h, name, data, {**common, "ETag": f'"{git_blob_sha1(data)}"',
                                      "Content-Type": "application/json"}, head)

    def _cdn(self, h, path, head):
        m = re.fullmatch(r"/repos/([0-9a-f]{64})", path)
        data = self.by_sha256.get(m.group(1)) if m else None
        if data is None:
            return self._send(h, 404, body=b"NoSuchKey", head=head)
        name = next(n for r in self.repos.values() for n, d in r.files.items() if d is data)
        self._content(h, name, data, {"ETag": f'"{m.group(1)}"',
                                      "Content-Type": "application/octet-stream"}, head)

    def _content(self, h, name, data, headers, head):
        """The file, or the range asked for, with the faults injected."""
        if name in self.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        m = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range", ""))
        if m and int(m.group(1)) < len(data):
            start = int(m.group(1))
            headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        elif m:
            return self._send(h, 416, {"Content-Range": f"bytes */{len(data)}"}, head=head)
        body = data[start:]
        h.send_response(206 if m else 200)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            h.send_header(k, v)
        h.end_headers()
        if head:
            return
        with self.lock:
            cut = self.drop_after.pop(name, None)
            hold = self.hold.pop(name, None)
        if cut is not None:
            h.wfile.write(body[:cut])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if hold is not None:
            h.wfile.write(body[:len(body) // 2])
            h.wfile.flush()
            hold.wait(30)
            body = body[len(body) // 2:]
        h.wfile.write(body)


# ---- the models ----

def generate(out, *args):
    subprocess.run([str(gsp.GENERATOR), "--preset", "tiny", *args, str(out)], check=True,
                   capture_output=True, timeout=300)


def read_dir(directory):
    return {p.name: p.read_bytes() for p in Path(directory).iterdir()
            if p.is_file() and p.name != "README.md"}


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    root = tmp_path_factory.mktemp("repos")
    generate(root / "tiny")
    generate(root / "sharded", "--shards", "2", "--codec", "none", "--seed", "2")
    generate(root / "nocodec", "--codec", "none", "--seed", "3")
    generate(root / "codec.nemo", "--codec-only")
    codec = (root / "codec.nemo").read_bytes()
    return [
        Repo(MODEL, read_dir(root / "tiny")),
        Repo(SHARDED, read_dir(root / "sharded")),
        Repo(NO_CODEC, read_dir(root / "nocodec")),
        Repo(CODEC, {"codec.nemo": codec}),
        Repo(PUBLISHED_CODEC, {"nemo-nano-codec-22khz-1.89kbps-21.5fps.nemo": codec}),
    ]


@pytest.fixture
def hub(repos):
    h = Hub(repos)
    yield h
    h.stop()


# ---- the server ----

class Server:
    """gepard-server started without waiting for it to be ready, its stdout read by a thread."""

    def __init__(self, tmp_path, model, env, args=()):
        self.lines = []
        self.listening = threading.Event()
        self.ready = threading.Event()
        self.base_url = None
        self.err_path = tmp_path / f"server-{time.monotonic_ns()}.err"
        full = {k: v for k, v in os.environ.items()
                if not k.startswith(("HF_", "HUGGING", "TTS_"))}
        full.update({
            "GST_PLUGIN_PATH_1_0": str(gsp.PLUGIN_DIR),
            "GST_REGISTRY_1_0": str(tmp_path / "registry.bin"),
            "TTS_DEVICE": "cpu",
            # no PostgreSQL: built-in voices only, so that no cluster is started
            "GEPARD_PG_BINDIR": str(tmp_path / "no-postgresql"),
            "HF_HUB_CACHE": str(tmp_path / "cache"),
        })
        full.update(env)
        self.err = open(self.err_path, "w")
        self.process = subprocess.Popen(
            [str(gsp.SERVER), "--model", model, "--port", "0", "--host", "127.0.0.1",
             "--max-frames", str(MAX_FRAMES), *args],
            stdout=subprocess.PIPE, stderr=self.err, env=full, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)
            m = re.search(r"listening on (http://[^/]*:\d+)/", line)
            if m:
                self.base_url = m.group(1)
                self.listening.set()
            if "ready:" in line:
                self.ready.set()

    @property
    def output(self):
        self.err.flush()
        return "".join(self.lines) + self.err_path.read_text()

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready.wait(0.1):
                return True
            if self.process.poll() is not None:
                return False
        raise AssertionError(f"not ready after {timeout} s:\n{self.output}")

    def wait_exit(self, timeout=120):
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.output}")

    def request(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Cartesia-Version": "2026-03-01"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def health(self):
        status, body = self.request("GET", "/health")
        return status, json.loads(body)

    def synthesize(self):
        status, body = self.request("POST", "/tts/bytes", {
            "model_id": "sonic-3", "transcript": "Hello there.",
            "voice": {"mode": "id", "id": "default"},
            "output_format": {"container": "wav", "encoding": "pcm_s16le", "sample_rate": 16000}})
        assert status == 200, body
        assert body[:4] == b"RIFF" and len(body) > 44
        return body

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.err.close()


@pytest.fixture
def servers():
    started = []
    yield lambda *a, **k: started.append(Server(*a, **k)) or started[-1]
    for s in started:
        s.stop()


def repo_dir(tmp_path, repo_id):
    return tmp_path / "cache" / ("models--" + repo_id.replace("/", "--"))


def snapshot_files(tmp_path, repo_id):
    snapshots = repo_dir(tmp_path, repo_id) / "snapshots"
    return sorted(p for p in snapshots.rglob("*")) if snapshots.exists() else []


def check_cache(tmp_path, repo):
    """The huggingface_hub layout: refs/main, relative links from the snapshot to the blobs
    named by their ETag, no partial file left."""
    d = repo_dir(tmp_path, repo.repo_id)
    assert (d / "refs" / "main").read_text() == repo.commit
    snapshot = d / "snapshots" / repo.commit
    for name, data in repo.files.items():
        link = snapshot / name
        assert link.is_symlink(), name
        target = os.readlink(link)
        etag = hashlib.sha256(data).hexdigest() if is_lfs(name) else git_blob_sha1(data)
        assert target == "../../blobs/" + etag, (name, target)
        assert link.read_bytes() == data
    assert not list((d / "blobs").glob("*.incomplete"))


# ---- tests ----

def test_fresh_download_then_synthesizes(hub, repos, servers, tmp_path):
    """Sharded model (index, then its shards) and the published codec, which the model lacks,
    fetched with the token; /health says "downloading" meanwhile; then the server speaks."""
    hub.token = TOKEN
    release = threading.Event()
    hub.hold["model-00002-of-00002.safetensors"] = release
    server = servers(tmp_path, SHARDED, {"HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN})
    assert server.listening.wait(60), server.output

    deadline = time.monotonic() + 60
    while True:
        status, health = server.health()
        if (health["status"] == "downloading"
                and "model-00002-of-00002.safetensors" in health["reason"]):
            break
        assert time.monotonic() < deadline, (health, server.output)
        time.sleep(0.05)
    assert status == 503
    assert health["reason"].startswith(f"downloading {SHARDED} from the hub: ")
    assert re.search(r"MiB \(\d+%\)$", health["reason"]), health
    release.set()

    assert server.wait_ready(), server.output
    status, health = server.health()
    assert status == 200 and health["status"] == "ok"
    server.synthesize()

    by_id = {r.repo_id: r for r in repos}
    check_cache(tmp_path, by_id[SHARDED])
    check_cache(tmp_path, by_id[PUBLISHED_CODEC])
    assert "downloading gepard-test/tiny-sharded: model-00002-of-00002.safetensors" in server.output
    # the token goes to the hub only, never to the CDN the LFS files come from
    assert all(h.get("Authorization") == f"Bearer {TOKEN}" for _, _, _, h in hub.log("hub"))
    cdn = hub.log("cdn")
    assert cdn and all("Authorization" not in h for _, _, _, h in cdn)


def test_second_start_reuses_the_cache_without_network(hub, repos, servers, tmp_path):
    server = servers(tmp_path, MODEL, {"HF_ENDPOINT": hub.url})
    assert server.wait_ready(), server.output
    server.stop()
    check_cache(tmp_path, next(r for r in repos if r.repo_id == MODEL))
    hub.stop()
    before = len(hub.log())

    # the hub is gone: the cached snapshot is used as it is
    again = servers(tmp_path, MODEL, {"HF_ENDPOINT": hub.url})
    assert again.wait_ready(), again.output
    again.synthesize()
    assert "using the cached snapshot" in again.output
    again.stop()

    offline = servers(tmp_path, MODEL, {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "1"})
    assert offline.wait_ready(), offline.output
    offline.synthesize()
    assert len(hub.log()) == before


def test_resume_after_a_dropped_connection(hub, repos, servers, tmp_path):
    """A partial file left by an earlier run is resumed with a Range request, and a connection
    cut mid-file is resumed where it stopped; both end checked and complete."""
    repo = next(r for r in repos if r.repo_id == MODEL)
    weights = repo.files["model.safetensors"]
    sha256 = hashlib.sha256(weights).hexdigest()
    blobs = repo_dir(tmp_path, MODEL) / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha256}.incomplete").write_bytes(weights[:100000])
    hub.drop_after["codec.nemo"] = 65536

    server = servers(tmp_path, MODEL, {"HF_ENDPOINT": hub.url})
    assert server.wait_ready(), server.output
    server.synthesize()
    check_cache(tmp_path, repo)

    gets = [(p, h.get("Range")) for _, m, p, h in hub.log("cdn") if m == "GET"]
    weights_gets = [r for p, r in gets if p.endswith(sha256)]
    assert weights_gets == ["bytes=100000-"], gets
    codec_sha = hashlib.sha256(repo.files["codec.nemo"]).hexdigest()
    codec_gets = [r for p, r in gets if p.endswith(codec_sha)]
    assert len(codec_gets) == 2 and codec_gets[0] is None, gets
    start = int(re.fullmatch(r"bytes=(\d+)-", codec_gets[1]).group(1))
    assert 0 < start <= 65536
    assert "resuming at" in server.output


def test_stop_during_the_download_then_resume(hub, repos, servers, tmp_path):
    """SIGTERM while a file downloads stops the server at once, keeping the partial file; the
    next start resumes it from there."""
    repo = next(r for r in repos if r.repo_id == MODEL)
    sha256 = hashlib.sha256(repo.files["model.safetensors"]).hexdigest()
    release = threading.Event()
    hub.hold["model.safetensors"] = release
    server = servers(tmp_path, MODEL, {"HF_ENDPOINT": hub.url})
    assert server.listening.wait(60), server.output
    partial = repo_dir(tmp_path, MODEL) / "blobs" / f"{sha256}.incomplete"
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size > 0):
        assert time.monotonic() < deadline, server.output
        time.sleep(0.05)
    time.sleep(0.3)
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(20) == 0, server.output
    release.set()
    size = partial.stat().st_size
    assert 0 < size < len(repo.files["model.safetensors"])
    assert snapshot_files(tmp_path, MODEL) == []

    again = servers(tmp_path, MODEL, {"HF_ENDPOINT": hub.url})
    assert again.wait_ready(), again.output
    again.synthesize()
    check_cache(tmp_path, repo)
    ranges = [h.get("Range") for _, m, p, h in hub.log("cdn") if m == "GET" and p.endswith(sha256)]
    assert ranges == [None, f"bytes={size}-"], ranges


def test_corrupt_download_is_refused(hub, servers, tmp_path):
    hub.corrupt.add("model.safetensors")
    server = servers(tmp_path, MODEL, {"HF_ENDPOINT": hub.url})
    assert server.wait_exit() == 1
    out = server.output
    assert "model.safetensors of gepard-test/tiny is corrupt" in out and "sha256" in out, out
    # nothing is linked into the snapshot, no ref, no partial file
    assert snapshot_files(tmp_path, MODEL) == []
    assert not (repo_dir(tmp_path, MODEL) / "refs" / "main").exists()
    assert not list((repo_dir(tmp_path, MODEL) / "blobs").glob("*.incomplete"))


@pytest.mark.parametrize("token", [None, "hf_wrong"])
def test_gated_repo_without_access(hub, servers, tmp_path, token):
    hub.token = TOKEN
    env = {"HF_ENDPOINT": hub.url, **({"HF_TOKEN": token} if token else {})}
    server = servers(tmp_path, MODEL, env)
    assert server.wait_exit() == 1
    out = server.output
    assert "gepard-test/tiny" in out and "HF_TOKEN" in out and "license" in out, out
    assert "HTTP 401" in out
    assert snapshot_files(tmp_path, MODEL) == []


def test_unknown_repo(hub, servers, tmp_path):
    server = servers(tmp_path, "gepard-test/absent", {"HF_ENDPOINT": hub.url})
    assert server.wait_exit() == 1
    assert "gepard-test/absent was not found" in server.output and "HF_TOKEN" in server.output


def test_offline_with_an_empty_cache(hub, servers, tmp_path):
    server = servers(tmp_path, MODEL, {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "1"})
    assert server.wait_exit() == 1
    out = server.output
    assert str(repo_dir(tmp_path, MODEL)) in out and "HF_HUB_OFFLINE" in out, out
    assert hub.log() == []


def test_codec_repo_id_from_a_mirror_without_api(hub, repos, servers, tmp_path):
    """--codec takes a repo id too; an endpoint without /api is asked for the known files."""
    hub.api = False
    server = servers(tmp_path, NO_CODEC, {"HF_ENDPOINT": hub.url}, args=["--codec", CODEC])
    assert server.wait_ready(), server.output
    server.synthesize()
    by_id = {r.repo_id: r for r in repos}
    check_cache(tmp_path, by_id[NO_CODEC])
    check_cache(tmp_path, by_id[CODEC])
    # the codec given replaces the published one, which is not fetched
    assert not any(PUBLISHED_CODEC in p for _, _, p, _ in hub.log())
