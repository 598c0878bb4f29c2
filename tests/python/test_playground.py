"""The playground page gepard-server serves at /, driven in headless Chromium (Selenium and
chromedriver) against a real server with the untrained test model.

- The page and its files come with the right Content-Type and a self-only Content-Security-Policy,
  without the API key; the page loads with no error in the browser's console.
- The voice list loads from GET /voices (the default voice first).
- Speaking streams over /tts/websocket: the page collects the samples (the test reads
  window.gepardPlayground.lastResult: the count the frame limit predicts, time to first audio,
  real-time factor) with no audio device to play them on, and draws the waveform; Stop cancels
  the context and keeps what had arrived.
- The WAV download is a valid RIFF file of 44 + 2 × samples bytes, as saved by the browser.
- Cloning from a file (chosen through the file input) and from the (fake) microphone adds the new
  voice and selects it, and the page speaks with it; an API error shows the server's message.
- With an API key, the page asks for it, the API refuses calls without it, a wrong key is told
  apart, and everything works once the right key is entered.
- With --no-playground (or TTS_PLAYGROUND=0) the page and its files are gone (404), while API
  clients still get Cartesia's status object at /. These need no browser.

A screenshot of the page after a synthesis is saved as $GEPARD_BUILD_DIR/playground.png."""

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import wave
from pathlib import Path

import numpy as np
import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)

MAX_FRAMES = 12
KEY = "playground-key-3b9e"
HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))
                 if p), None)
CHROMEDRIVER = shutil.which("chromedriver")
HAS_POSTGRES = (any(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
                or shutil.which("initdb") is not None)


def browser_skip_reason():
    if CHROMIUM is None or CHROMEDRIVER is None:
        return ("chromium and chromedriver are not installed (Debian: apt-get install chromium "
                "chromium-driver; scripts/lib.sh installs them)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (tests/requirements.txt)"
    return None


needs_browser = pytest.mark.skipif(browser_skip_reason() is not None,
                                   reason=browser_skip_reason() or "")


# ---- helpers ----

def write_voiced_wav(path, seconds=5.0, rate=22050):
    """A voiced signal: a 120 Hz harmonic series with a slow vibrato and a little breath noise."""
    n = int(rate * seconds)
    t = np.arange(n) / rate
    f0 = 120 + 8 * np.sin(2 * np.pi * 0.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 12)) * 0.2
    x = x + 0.02 * np.random.default_rng(7).standard_normal(n)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def start_browser(download_dir):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1200,1300", "--autoplay-policy=no-user-gesture-required",
                     # a fake microphone (a beep) that needs no permission prompt
                     "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                     "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.add_experimental_option("prefs", {
        "download.default_directory": str(download_dir),
        "download.prompt_for_download": False,
        "safebrowsing.enabled": False,
    })
    # the driver is given: Selenium Manager would go looking for one on the network
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


class Page:
    """The playground open in one browser tab."""

    def __init__(self, driver, server):
        self.driver = driver
        self.server = server

    def open(self):
        self.driver.get(self.server.base_url + "/")
        self.wait(lambda: self.state("keyRequired") is not None and (
            self.state("ready") or self.state("keyRequired")))

    def state(self, name):
        return self.driver.execute_script(f"return window.gepardPlayground?.{name} ?? null")

    def el(self, element_id):
        from selenium.webdriver.common.by import By
        return self.driver.find_element(By.ID, element_id)

    def wait(self, condition, timeout=60, message="the page did not get there"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"{message}; page error: {self.state('lastError')}; "
                             f"log: {self.driver.get_log('browser')}")

    def severe_log(self, allowed=()):
        return [entry for entry in self.driver.get_log("browser")
                if entry["level"] == "SEVERE"
                and not any(text in entry["message"] for text in allowed)]

    def speak(self, text, rate="24000"):
        from selenium.webdriver.support.ui import Select

        before = self.state("lastResult")
        self.driver.execute_script("document.getElementById('transcript').value = arguments[0]",
                                   text)
        Select(self.el("rate")).select_by_value(rate)
        self.el("speak").click()
        return self.wait(lambda: (r := self.state("lastResult")) is not None and r != before
                         and not self.state("busy") and r, message="no result")

    def error_text(self):
        element = self.el("error")
        return element.text if element.is_displayed() else ""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return gsp.make_test_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    # As root the voice store's cluster runs as the postgres user, which cannot enter pytest's
    # private temporary directories: a directory of its own, open to enter.
    data = Path(tempfile.mkdtemp(prefix="gepard-playground-"))
    data.chmod(0o711)
    s = gsp.GepardServer(model, tmp_path_factory.mktemp("server"), max_frames=MAX_FRAMES,
                         args=["--data-dir", str(data / "postgres")],
                         env={"DATABASE_URL": "", "TTS_DATABASE_URL": ""})
    yield s
    s.stop()
    shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def driver(downloads):
    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    d = start_browser(downloads)
    yield d
    d.quit()


@pytest.fixture(scope="module")
def page(driver, server):
    p = Page(driver, server)
    p.open()
    return p


# ---- what the server sends, without a browser ----

def test_the_page_and_its_files_are_served_without_a_key(server):
    for path, headers, content_type in [("/", HTML, "text/html"),
                                        ("/playground/playground.js", {}, "text/javascript"),
                                        ("/playground/playground.css", {}, "text/css"),
                                        ("/playground/icon.svg", {}, "image/svg+xml")]:
        status, answer, body = server.request("GET", path, None, headers)
        assert status == 200, (path, body)
        assert answer["Content-Type"].startswith(content_type), path
        assert answer["X-Content-Type-Options"] == "nosniff"
        csp = answer["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp, csp
        assert f"connect-src 'self' ws://127.0.0.1:{server.port}" in csp, csp
        assert "unsafe" not in csp and "*" not in csp, csp
        assert len(body) > 0
    # an API client still gets Cartesia's status object at /
    status, _, body = server.request("GET", "/")
    assert status == 200 and json.loads(body)["ok"] is True
    status, _, _ = server.request("GET", "/playground/nothing-here.js")
    assert status == 404


def test_the_server_own_origin_may_open_a_socket_and_no_other(server):
    websockets = pytest.importorskip("websockets")
    from websockets.exceptions import InvalidStatus

    async def upgrade(origin):
        try:
            async with websockets.connect(server.ws_url + "/tts/websocket", origin=origin):
                return 101
        except InvalidStatus as refused:
            return refused.response.status_code

    assert asyncio.run(upgrade(server.base_url)) == 101
    assert asyncio.run(upgrade(f"http://localhost:{server.port}")) == 403  # another host name
    assert asyncio.run(upgrade("http://evil.example")) == 403


@pytest.mark.parametrize("switch", [{"args": ["--no-playground"]},
                                    {"env": {"TTS_PLAYGROUND": "0"}}])
def test_the_playground_can_be_turned_off(model, tmp_path, switch):
    s = gsp.GepardServer(model, tmp_path, max_frames=MAX_FRAMES, args=switch.get("args", ()),
                         env=switch.get("env"))
    try:
        for path, headers in [("/", HTML), ("/playground/playground.js", {}),
                              ("/playground/settings.json", {})]:
            status, answer, body = s.request("GET", path, None, {**headers,
                                                                 "Cartesia-Version": "2026-03-01"})
            assert status == 404, (path, body)
            assert "Content-Security-Policy" not in answer
            error = json.loads(body)
            assert error["error_code"] == "not_found" and error["message"], error
        status, _, body = s.request("GET", "/")
        assert status == 200 and json.loads(body)["ok"] is True
    finally:
        s.stop()
    routes = subprocess.run([str(gsp.SERVER), "--list-routes", *switch.get("args", ())],
                            capture_output=True, text=True, check=True, timeout=30,
                            env={**os.environ, **switch.get("env", {})}).stdout
    assert "/playground/" not in routes and "GET /health open" in routes


# ---- the page in a browser ----

@needs_browser
def test_the_page_loads_without_console_errors(page):
    assert page.state("ready") is True
    assert page.state("keyRequired") is False
    assert page.driver.title == "Gepard playground"
    assert page.el("key-section").is_displayed() is False
    assert page.severe_log() == []


@needs_browser
def test_the_voice_list_loads(page):
    voices = page.state("voices")
    assert voices and voices[0]["id"] == "default", voices
    from selenium.webdriver.support.ui import Select
    assert Select(page.el("voice")).first_selected_option.get_attribute("value") == "default"


@needs_browser
def test_speaking_streams_samples_into_the_page(page):
    result = page.speak("Hello from the playground.")
    assert not result["stopped"]
    expected = gsp.expected_samples(1, MAX_FRAMES, 24000)
    assert abs(result["samples"] - expected) <= 8, (result, expected)
    assert result["sample_rate"] == 24000
    assert result["peak"] > 0, "only silence arrived"
    assert 0 < result["ttfa_ms"] <= result["elapsed_ms"]
    assert result["rtf"] > 0
    assert abs(result["duration_s"] - result["samples"] / 24000) < 1e-6
    # shown to the user too
    assert page.el("ttfa").text.endswith(" ms") and page.el("rtf").text not in ("", "–", "…")
    # the waveform has been drawn: some pixels are not blank
    painted = page.driver.execute_script("""
        const c = document.getElementById('waveform');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
        return n;""")
    assert painted > page.driver.execute_script(
        "return document.getElementById('waveform').width"), painted
    screenshot = (gsp.BUILD_DIR / "playground.png").resolve()
    page.driver.save_screenshot(str(screenshot))
    print(f"\nplayground screenshot: {screenshot}")
    assert page.severe_log() == []


@needs_browser
def test_stop_cancels_the_generation(page):
    text = " ".join(f"Sentence number {i} of a long text." for i in range(80))
    page.driver.execute_script("document.getElementById('transcript').value = arguments[0]", text)
    before = page.state("lastResult")
    page.el("speak").click()
    page.wait(lambda: page.state("busy") and page.el("duration").text not in ("0.00 s", "–"),
              message="no audio arrived")
    page.el("stop").click()
    result = page.wait(lambda: (r := page.state("lastResult")) != before and r,
                       message="stopping gave no result")
    assert result["stopped"] and page.state("busy") is False
    assert 0 < result["samples"] < gsp.expected_samples(80, MAX_FRAMES, 24000)
    assert page.severe_log() == []


@needs_browser
def test_the_wav_download_is_complete(page, downloads):
    result = page.state("lastResult") or page.speak("Something to download.")
    for old in downloads.glob("*"):
        old.unlink()
    page.el("download").click()
    files = page.wait(lambda: [p for p in downloads.glob("*.wav")], timeout=30,
                      message="nothing was downloaded")
    data = page.wait(lambda: (d := files[0].read_bytes()) and len(d) >= 44 + 2 * result["samples"]
                     and d, timeout=10, message="the download did not complete")
    n = result["samples"]
    assert len(data) == 44 + 2 * n == result["wav_bytes"]
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt "
    assert int.from_bytes(data[4:8], "little") == len(data) - 8
    assert data[36:40] == b"data" and int.from_bytes(data[40:44], "little") == 2 * n
    with wave.open(str(files[0])) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (
            1, 2, result["sample_rate"], n)
    # the page's Blob, as the download read it
    head = page.driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const blob = window.gepardPlayground.lastWav;
        blob.slice(0, 12).arrayBuffer().then(b => done([blob.size, blob.type,
            new TextDecoder().decode(new Uint8Array(b).slice(8, 12))]));""")
    assert head == [44 + 2 * n, "audio/wav", "WAVE"]


@needs_browser
@pytest.mark.skipif(not HAS_POSTGRES, reason="PostgreSQL (initdb, pg_ctl) is not installed")
def test_a_voice_cloned_from_a_file_is_selected_and_speaks(page, tmp_path):
    from selenium.webdriver.support.ui import Select

    clip = write_voiced_wav(tmp_path / "reference.wav")
    page.el("clone-name").clear()
    page.el("clone-name").send_keys("Playground narrator")
    page.el("clone-file").send_keys(str(clip))
    page.wait(lambda: (page.state("clip") or {}).get("name") == "reference.wav")
    page.el("clone").click()
    voice = page.wait(lambda: page.state("lastClone"), message="the clone did not finish")
    assert voice["name"] == "Playground narrator" and voice["id"] != "default"
    assert Select(page.el("voice")).first_selected_option.get_attribute("value") == voice["id"]
    assert voice["id"] in [v["id"] for v in page.state("voices")]
    status, _, body = page.server.request("GET", "/voices/" + voice["id"])
    assert status == 200 and json.loads(body)["name"] == "Playground narrator"
    result = page.speak("Now in the new voice.")
    assert result["voice"] == voice["id"] and result["samples"] > 0
    assert page.severe_log() == []


@needs_browser
@pytest.mark.skipif(not HAS_POSTGRES, reason="PostgreSQL (initdb, pg_ctl) is not installed")
def test_a_voice_cloned_from_the_microphone(page):
    before = page.state("lastClone")
    page.el("record").click()
    time.sleep(4.0)
    page.el("record").click()
    clip = page.wait(lambda: (c := page.state("clip")) and c["name"] == "recording.wav" and c,
                     message="the recording was not encoded")
    assert 3.5 <= clip["duration_s"] <= 15
    page.el("clone-name").clear()
    page.el("clone-name").send_keys("Microphone voice")
    page.el("clone").click()
    voice = page.wait(lambda: (v := page.state("lastClone")) and v != before and v,
                      message="the clone did not finish")
    assert voice["name"] == "Microphone voice"
    assert page.severe_log() == []


@needs_browser
def test_api_errors_show_the_server_message(page, tmp_path):
    # an unknown voice: the WebSocket's error message
    page.driver.execute_script("""
        const o = document.createElement('option');
        o.value = 'no-such-voice'; o.textContent = 'missing';
        document.getElementById('voice').append(o);
        document.getElementById('voice').value = 'no-such-voice';""")
    page.el("speak").click()
    page.wait(lambda: "no-such-voice" in page.error_text() or "not found" in page.error_text().lower(),
              message="no error shown for an unknown voice")
    assert page.state("busy") is False
    page.driver.execute_script("document.getElementById('voice').value = 'default'")
    if HAS_POSTGRES:
        # a clip too short to clone: the HTTP error body's message
        short = write_voiced_wav(tmp_path / "short.wav", seconds=1.0)
        page.el("clone-file").send_keys(str(short))
        page.wait(lambda: (page.state("clip") or {}).get("name") == "short.wav")
        page.el("clone").click()
        error = page.wait(lambda: (e := page.state("lastError")) and e["status"] == 400 and e,
                          message="no error shown for a short clip")
        assert "HTTP 400" in page.error_text() and "short" in page.error_text().lower(), error
    # the failed clone is a failed request the browser reports; nothing else is
    assert page.severe_log(allowed=("/voices/clone",)) == []


# ---- with an API key ----

@pytest.fixture(scope="module")
def keyed_server(model, tmp_path_factory):
    s = gsp.GepardServer(model, tmp_path_factory.mktemp("keyed"), max_frames=MAX_FRAMES,
                         api_key=KEY)
    yield s
    s.stop()


@needs_browser
def test_with_a_key_the_page_asks_for_it_and_then_works(driver, keyed_server):
    websockets = pytest.importorskip("websockets")
    from websockets.exceptions import InvalidStatus

    # the page itself needs no key; the API refuses calls without it
    saved, keyed_server.api_key = keyed_server.api_key, None
    try:
        assert keyed_server.request("GET", "/", None, HTML)[0] == 200
        assert keyed_server.request("GET", "/playground/playground.js")[0] == 200
        for path in ("/voices", "/"):
            status, _, body = keyed_server.request("GET", path, None,
                                                   {"Cartesia-Version": "2026-03-01"})
            assert status == 401 and json.loads(body)["error_code"] == "unauthorized", path
    finally:
        keyed_server.api_key = saved

    async def upgrade():
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(keyed_server.ws_url + "/tts/websocket",
                                          origin=keyed_server.base_url):
                pass
        return refused.value.response.status_code

    assert asyncio.run(upgrade()) == 401

    page = Page(driver, keyed_server)
    page.open()
    driver.get_log("browser")  # what came before
    assert page.state("keyRequired") is True and page.state("ready") is False
    assert page.el("key-section").is_displayed() and page.el("speak").get_attribute("disabled")
    # a wrong key is refused with the server's message, and the page keeps asking
    page.el("api-key").send_keys("not-the-key")
    page.el("key-submit").click()
    page.wait(lambda: "Invalid or missing API key" in page.error_text(),
              message="a wrong key was not reported")
    assert page.state("ready") is False and page.el("key-section").is_displayed()
    wrong_key_log = page.severe_log(allowed=("401",))
    assert wrong_key_log == [], wrong_key_log
    # the right one
    page.el("api-key").clear()
    page.el("api-key").send_keys(KEY)
    page.el("key-submit").click()
    page.wait(lambda: page.state("ready"), message="the right key was not taken")
    assert not page.el("key-section").is_displayed()
    assert page.state("voices")[0]["id"] == "default"
    result = page.speak("The key works.")
    assert abs(result["samples"] - gsp.expected_samples(1, MAX_FRAMES, 24000)) <= 8
    assert page.severe_log() == []
    # kept for the tab: a reload needs no key again
    page.open()
    page.wait(lambda: page.state("ready"), message="the key was not kept")
    assert page.severe_log() == []
