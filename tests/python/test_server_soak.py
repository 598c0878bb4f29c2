"""Load and soak test of gepard-server on loopback with the tiny test model on the CPU.

Many WebSocket clients at once, for GEPARD_SOAK_SECONDS (default 150), each opening sockets and
running contexts on them with random behaviour: one-shot transcripts, continuations with flushes,
cancels mid-stream, sockets dropped without a close (transport aborted), and a few HTTP requests.
Checked:

- every context that was neither cancelled nor dropped ends with exactly one done or error;
- GET /health answers 200 throughout (polled);
- after the load, the server's RSS, open file descriptors and threads come back to within a small
  margin of a baseline taken after a first warm-up round (pools and caches are warm by then).

The figures are printed (pytest -s) and recorded as junit properties."""

import asyncio
import base64
import json
import os
import random
import time
import urllib.request
from pathlib import Path

import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)

websockets = pytest.importorskip("websockets")

SOAK_SECONDS = float(os.environ.get("GEPARD_SOAK_SECONDS", "150"))
WARMUP_SECONDS = min(15.0, max(3.0, SOAK_SECONDS / 10))
CLIENTS = 12
MAX_FRAMES = 6
FORMATS = [{"container": "raw", "encoding": e, "sample_rate": r}
           for e, r in (("pcm_s16le", 24000), ("pcm_f32le", 16000), ("pcm_mulaw", 8000),
                        ("pcm_alaw", 8000), ("pcm_s16le", 44100))]
WORDS = "the quick brown fox jumps over a lazy dog while seven bright stars sing".split()


def proc_figures(pid):
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    return {"rss_kib": int(fields["VmRSS"].split()[0]),
            "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def sentence(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))).capitalize() + ". "


class Tally:
    def __init__(self):
        self.sockets = 0
        self.contexts = 0
        self.outcomes = {}
        self.problems = []
        self.http = 0

    def count(self, outcome):
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


async def run_socket(server, rng, tally, deadline):
    """One socket: a few contexts at once, each with a random plan; maybe dropped mid-way."""
    tally.sockets += 1
    ws = await websockets.connect(server.ws_url + "/tts/websocket", max_size=None)
    plans = {}
    for i in range(rng.randint(1, 6)):
        cid = f"{rng.getrandbits(48):x}-{i}"
        plans[cid] = rng.choices(["oneshot", "continue", "cancel"], weights=[5, 3, 2])[0]
    drop_socket = rng.random() < 0.15
    fmt = rng.choice(FORMATS)
    ended, cancelled, chunks = set(), set(), {}
    try:
        for cid, plan in plans.items():
            tally.contexts += 1
            text = "".join(sentence(rng) for _ in range(rng.randint(1, 3)))
            await ws.send(json.dumps({"context_id": cid, "transcript": text, "voice": "default",
                                      "output_format": fmt, "continue": plan == "continue",
                                      "add_timestamps": rng.random() < 0.3}))
            if plan == "continue":
                await ws.send(json.dumps({"context_id": cid, "transcript": sentence(rng),
                                          "continue": True, "flush": True, "voice": "default",
                                          "output_format": fmt}))
        pending_close = {cid for cid, p in plans.items() if p == "continue"}
        while set(plans) - ended - cancelled:
            m = json.loads(await asyncio.wait_for(ws.recv(), 60))
            cid = m.get("context_id")
            if cid not in plans:
                tally.problems.append(f"a message for an unknown context: {m}")
                continue
            if cid in ended:
                tally.problems.append(f"a message after the end of {cid}: {m['type']}")
                continue
            if m["type"] == "chunk":
                base64.b64decode(m["data"])
                chunks[cid] = chunks.get(cid, 0) + 1
                if plans[cid] == "cancel" and cid not in cancelled:
                    cancelled.add(cid)
                    tally.count("cancelled")
                    await ws.send(json.dumps({"context_id": cid, "cancel": True}))
                if drop_socket and sum(chunks.values()) >= 3:
                    ws.transport.abort()  # gone, without a close handshake
                    for c in set(plans) - ended - cancelled:
                        tally.count("dropped")
                    return
            if m["type"] == "flush_done" and cid in pending_close:
                pending_close.discard(cid)
                await ws.send(json.dumps({"context_id": cid, "transcript": "", "voice": "default",
                                          "output_format": fmt, "continue": False}))
            if m["done"]:
                ended.add(cid)
                if cid not in cancelled:
                    tally.count(m["type"] if m["type"] == "done"
                                else f"error {m.get('status_code')}")
    finally:
        if not drop_socket:
            await ws.close()
        else:
            ws.transport.abort()


async def run_http(server, rng, tally):
    tally.http += 1
    body = json.dumps({"transcript": sentence(rng), "voice": "default",
                       "output_format": rng.choice(FORMATS)}).encode()
    status, _, _ = await asyncio.to_thread(server.request, "POST", "/tts/bytes", body)
    tally.count(f"http {status}")


async def client(server, seed, tally, deadline):
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        try:
            if rng.random() < 0.1:
                await run_http(server, rng, tally)
            else:
                await run_socket(server, rng, tally, deadline)
        except Exception as error:  # noqa: BLE001: every failure is a finding
            tally.problems.append(f"client {seed}: {type(error).__name__}: {error}")


async def poll_health(server, stop, results):
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            with await asyncio.to_thread(urllib.request.urlopen, server.base_url + "/health",
                                         None, 10) as r:
                results.append((r.status, time.monotonic() - t0))
        except Exception as error:  # noqa: BLE001
            results.append((str(error), time.monotonic() - t0))
        await asyncio.sleep(0.5)


async def load(server, seconds, tally, seed0):
    deadline = time.monotonic() + seconds
    stop = asyncio.Event()
    health = []
    poller = asyncio.create_task(poll_health(server, stop, health))
    await asyncio.gather(*(client(server, seed0 + i, tally, deadline) for i in range(CLIENTS)))
    stop.set()
    await poller
    return health


def settle(server, baseline, timeout=30):
    """The figures once they are back near the baseline (idle thread pools wind down over a few
    seconds), or the last ones read."""
    server.wait_idle(timeout=30)
    deadline = time.monotonic() + timeout
    while True:
        now = proc_figures(server.process.pid)
        if within_margin(baseline, now) or time.monotonic() > deadline:
            return now
        time.sleep(1)


def within_margin(before, after):
    return (after["fds"] <= before["fds"] + 4
            and after["threads"] <= before["threads"] + 4
            and after["rss_kib"] <= before["rss_kib"] * 1.15 + 24 * 1024)


def test_soak(tmp_path, record_property):
    model = gsp.make_test_model(tmp_path / "model")
    server = gsp.GepardServer(model, tmp_path, max_frames=MAX_FRAMES,
                              args=["--max-contexts", "96", "--max-contexts-per-socket", "8"])
    try:
        warm = Tally()
        asyncio.run(load(server, WARMUP_SECONDS, warm, 1000))
        server.wait_idle(timeout=30)
        time.sleep(2)
        baseline = proc_figures(server.process.pid)

        tally = Tally()
        t0 = time.monotonic()
        health = asyncio.run(load(server, SOAK_SECONDS, tally, 0))
        duration = time.monotonic() - t0
        after = settle(server, baseline)

        bad_health = [h for h in health if h[0] != 200]
        slowest_health = max((h[1] for h in health), default=0)
        figures = {
            "soak_seconds": round(duration, 1), "sockets": tally.sockets,
            "contexts": tally.contexts, "http_requests": tally.http,
            "outcomes": json.dumps(tally.outcomes, sort_keys=True),
            "health_polls": len(health), "health_failures": len(bad_health),
            "health_slowest_s": round(slowest_health, 2),
            "rss_kib_before": baseline["rss_kib"], "rss_kib_after": after["rss_kib"],
            "fds_before": baseline["fds"], "fds_after": after["fds"],
            "threads_before": baseline["threads"], "threads_after": after["threads"],
        }
        for name, value in figures.items():
            record_property(name, value)
        print("\nsoak: " + ", ".join(f"{k}={v}" for k, v in figures.items()))

        assert not tally.problems, tally.problems[:10]
        assert tally.contexts >= 100 and tally.sockets >= 20
        assert tally.outcomes.get("done", 0) > 0
        # every context ended in done or an error, unless the client cancelled or dropped it
        unexpected = {k: v for k, v in tally.outcomes.items()
                      if k not in ("done", "cancelled", "dropped", "http 200")
                      and not k.startswith("error 4") and not k.startswith("http 4")}
        assert not unexpected, unexpected
        assert health and not bad_health, bad_health[:5]
        assert within_margin(baseline, after), (baseline, after)
    finally:
        server.stop()
