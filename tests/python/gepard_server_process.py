"""Runs a real gepard-server process on 127.0.0.1 with an untrained test model.

Used by the server's protocol tests and client tests. The model comes from
gepard-make-test-model, so its audio is noise: tests check lengths, formats and the protocol,
never the sound. A per-sentence frame limit keeps every generation short and its length known.
"""

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE_DIR = Path(os.environ.get("GEPARD_SOURCE_DIR", HERE.parents[1]))
BUILD_DIR = Path(os.environ.get("GEPARD_BUILD_DIR", SOURCE_DIR / "build"))
SERVER = BUILD_DIR / "server" / "gepard-server"
GENERATOR = BUILD_DIR / "tools" / "gepard-make-test-model"
PLUGIN_DIR = BUILD_DIR / "gst-plugins"

# The codec's frame: 1024 samples at 22050 Hz. Only the tests assume it, to predict lengths.
FRAME_SECONDS = 1024 / 22050


def skip_reason():
    for path in (SERVER, GENERATOR):
        if not path.exists():
            return f"{path} is not built"
    return None


def make_test_model(directory):
    model = Path(directory) / "model"
    if not (model / "config.json").exists():
        subprocess.run([str(GENERATOR), "--preset", "tiny", str(model)], check=True,
                       capture_output=True, timeout=120)
    return model


def expected_samples(n_sentences, max_frames, rate):
    """Samples of n sentences that each run to the frame limit, resampled to `rate`."""
    return round(n_sentences * max_frames * FRAME_SECONDS * rate)


class GepardServer:
    def __init__(self, model, tmp_dir, *, max_frames=20, api_key=None, args=(), env=None):
        """model None: no --model, the server's default model."""
        self.api_key = api_key
        self.max_frames = max_frames
        self.log_path = Path(tmp_dir) / "server.log"
        full_env = dict(os.environ)
        full_env.update({
            "GST_PLUGIN_PATH_1_0": str(PLUGIN_DIR),
            "GST_REGISTRY_1_0": str(Path(tmp_dir) / "registry.bin"),
            "TTS_DEVICE": "cpu",
        })
        full_env.pop("TTS_API_KEY", None)
        if api_key is not None:
            full_env["TTS_API_KEY"] = api_key
        full_env.update(env or {})
        # voices in a private PostgreSQL cluster of this test's own, never in the machine's default
        # place, unless the test chose a database or a data directory itself
        if ("--data-dir" not in args and "DATABASE_URL" not in full_env
                and "TTS_DATABASE_URL" not in full_env and "TTS_DATA_DIR" not in full_env):
            full_env["TTS_DATA_DIR"] = str(Path(tmp_dir) / "data")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [str(SERVER), *(["--model", str(model)] if model is not None else []), "--port", "0", "--host", "127.0.0.1",
             "--max-frames", str(max_frames), *args],
            stdout=subprocess.PIPE, stderr=self.log, env=full_env, text=True)
        self.base_url = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.log.write(line)
            self.log.flush()
            match = re.search(r"listening on (https?)://[^/]*:(\d+)/", line)
            if match:
                self.scheme, self.port = match.group(1), int(match.group(2))
                self.base_url = f"{self.scheme}://127.0.0.1:{self.port}"
            if "ready:" in line:
                break
        if self.base_url is None or self.process.poll() is not None:
            self.stop()
            raise RuntimeError(f"gepard-server did not start: {self.log_path.read_text()}")
        self.ws_url = self.base_url.replace("http", "ws", 1)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def auth_headers(self):
        return {"X-API-Key": self.api_key} if self.api_key else {}

    def request(self, method, path, body=None, headers=None, context=None):
        """(status, headers, body bytes); errors are returned, not raised."""
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        all_headers = {**self.auth_headers(), **(headers or {})}
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers=all_headers)
        try:
            with urllib.request.urlopen(req, timeout=60, context=context) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers, error.read()

    def metrics(self):
        status, _, body = self.request("GET", "/metrics")
        assert status == 200
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_idle(self, timeout=10):
        """Waits until no generation is active and every pipeline is finalized; returns the
        metrics then."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if m["gepard_active_contexts"] == 0 and m["gepard_pipelines"] == 0:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"resources not freed: {m}")
            time.sleep(0.05)

    def engine_quiet(self, seconds=0.5):
        """True when the engine runs no step for `seconds`: nothing is generating."""
        before = self.metrics()["gepard_engine_steps_total"]
        time.sleep(seconds)
        return self.metrics()["gepard_engine_steps_total"] == before
