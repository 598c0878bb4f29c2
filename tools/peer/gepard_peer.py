#!/usr/bin/env python3
"""PyTorch peer of gepard-server for side-by-side benchmarks.

Speaks the part of Cartesia's WebSocket protocol (/work/shared/specs/cartesia-protocol.md §3) that a
benchmark client uses, on ``/tts/websocket``:

* requests ``{model_id, transcript, voice: {mode: "id", id}, output_format: {container: "raw",
  encoding: "pcm_f32le" | "pcm_s16le", sample_rate: 22050}, context_id, continue}``; transcripts of
  one context are concatenated and generated as one utterance once ``continue`` is false;
* ``{"context_id": …, "cancel": true}``;
* Gepard's extension ``"gepard": {"max_frames": N, "ignore_stop": true}`` (as gepard-server), plus
  ``temperature``, ``top_k`` and ``seed`` to override the server's sampling settings, and
  ``return_codes: true`` to get each frame's 32 codes in its chunk (``"codes"``);
* answers: ``chunk`` messages (base64 audio, one per codec frame, sent as soon as it is decoded),
  one ``done`` per context, and ``error`` messages carrying both the legacy ``error`` string and the
  structured ``title``/``message``/``error_code``/``request_id`` fields.

``GET /stats`` returns the engine's counters as JSON (decode steps per batch size, prefills).

Usage: python tools/peer/gepard_peer.py --model DIR --port N [--device cuda|cpu] [--max-batch B]
       [--dtype bf16|f32]
The first line on stdout is ``listening on http://HOST:PORT/``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import sys
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from websockets.asyncio.server import ServerConnection, serve  # noqa: E402
from websockets.datastructures import Headers  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.http11 import Request as HttpRequest  # noqa: E402
from websockets.http11 import Response as HttpResponse  # noqa: E402

import peer_engine  # noqa: E402

ENCODINGS = ("pcm_f32le", "pcm_s16le")
MAX_FRAMES_LIMIT = 100000  # as gepard-server's extension bound


class BadRequest(Exception):
    """A request the server refuses with a 400 error message."""


@dataclass
class Settings:
    temperature: float
    top_k: int
    seed: int


@dataclass
class Context:
    """One context of one connection, from its first message to its done."""

    context_id: str
    encoding: str
    parts: list[str] = field(default_factory=list)
    max_frames: int | None = None
    ignore_stop: bool = False
    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0
    return_codes: bool = False
    request: peer_engine.Request | None = None


def error_message(status: int, title: str, message: str, context_id: str | None) -> dict[str, Any]:
    """Cartesia's error event, legacy and structured fields together (cartesia-protocol.md §3.3)."""
    msg: dict[str, Any] = {
        "type": "error",
        "done": True,
        "status_code": status,
        "error": f"{title}: {message}",
        "title": title,
        "message": message,
        "error_code": None,
        "request_id": str(uuid.uuid4()),
    }
    if context_id is not None:
        msg["context_id"] = context_id
    return msg


def encode_audio(samples: np.ndarray, encoding: str) -> str:
    if encoding == "pcm_f32le":
        data = samples.astype("<f4").tobytes()
    else:
        data = np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    return base64.b64encode(data).decode("ascii")


def _require(obj: dict, key: str, kind: type, what: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"{key} must be {what}")
    return value


class PeerServer:
    def __init__(self, engine: peer_engine.Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings

    # -- HTTP ----------------------------------------------------------------------------------------
    def process_request(self, connection: ServerConnection, request: HttpRequest) -> HttpResponse | None:
        path = request.path.split("?", 1)[0]
        if path == "/stats":
            body = json.dumps(self.engine.stats()).encode()
            headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return HttpResponse(200, "OK", headers, body)
        if path != "/tts/websocket":
            return connection.respond(HTTPStatus.NOT_FOUND, "Not Found\n")
        return None

    # -- WebSocket -----------------------------------------------------------------------------------
    async def handle(self, connection: ServerConnection) -> None:
        loop = asyncio.get_running_loop()
        # (request or None, message, final): engine messages carry their request so that nothing of
        # a cancelled context goes out, and a final one (done, error) forgets its context
        outgoing: asyncio.Queue[tuple[peer_engine.Request | None, dict, bool] | None] = asyncio.Queue()
        contexts: dict[str, Context] = {}

        def post(request: peer_engine.Request, msg: dict, final: bool) -> None:  # engine thread
            loop.call_soon_threadsafe(outgoing.put_nowait, (request, msg, final))

        async def sender() -> None:
            while True:
                item = await outgoing.get()
                if item is None:
                    return
                request, msg, final = item
                if request is not None:
                    if request.cancelled.is_set():
                        continue
                    ctx = contexts.get(msg["context_id"])
                    if final and ctx is not None and ctx.request is request:
                        del contexts[msg["context_id"]]
                try:
                    await connection.send(json.dumps(msg))
                except ConnectionClosed:
                    return

        send_task = asyncio.create_task(sender())
        try:
            async for raw in connection:
                self.on_message(raw, contexts, post, outgoing)
        except ConnectionClosed:
            pass
        finally:
            for ctx in contexts.values():  # a closed socket abandons its contexts
                if ctx.request is not None:
                    ctx.request.cancelled.set()
            outgoing.put_nowait(None)
            await send_task

    def on_message(self, raw: str | bytes, contexts: dict[str, Context], post, outgoing: asyncio.Queue) -> None:
        def reply(msg: dict) -> None:
            outgoing.put_nowait((None, msg, False))

        try:
            msg = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            reply(error_message(400, "Invalid request", "the message is not valid JSON", None))
            return
        if not isinstance(msg, dict):
            reply(error_message(400, "Invalid request", "the message must be a JSON object", None))
            return
        context_id = msg.get("context_id")
        if context_id is not None and not isinstance(context_id, str):
            reply(error_message(400, "Invalid request", "context_id must be a string", None))
            return
        if msg.get("cancel") is True:
            ctx = contexts.pop(context_id, None) if context_id else None
            if ctx is not None and ctx.request is not None:
                ctx.request.cancelled.set()
            return
        if context_id is None:
            context_id = str(uuid.uuid4())
        try:
            self.on_request(msg, context_id, contexts, post)
        except BadRequest as exc:
            ctx = contexts.get(context_id)
            if ctx is not None and ctx.request is None:
                del contexts[context_id]
            reply(error_message(400, "Invalid request", str(exc), context_id))

    def on_request(self, msg: dict, context_id: str, contexts: dict[str, Context], post) -> None:
        _require(msg, "model_id", str, "a string")
        transcript = _require(msg, "transcript", str, "a string")
        voice = _require(msg, "voice", dict, "an object")
        if voice.get("mode", "id") != "id" or not isinstance(voice.get("id"), str):
            raise BadRequest('voice must be {"mode": "id", "id": "<voice id>"}')
        fmt = _require(msg, "output_format", dict, "an object")
        if fmt.get("container") != "raw":
            raise BadRequest('output_format.container must be "raw"')
        encoding = fmt.get("encoding")
        if encoding not in ENCODINGS:
            raise BadRequest(f"output_format.encoding must be one of {', '.join(ENCODINGS)}")
        rate = fmt.get("sample_rate")
        if rate != self.engine.codec.sample_rate:
            raise BadRequest(f"output_format.sample_rate {rate} is not supported "
                             f"(only {self.engine.codec.sample_rate})")
        more = msg.get("continue", False)
        if not isinstance(more, bool):
            raise BadRequest("continue must be true or false")

        ctx = contexts.get(context_id)
        if ctx is not None and ctx.request is not None:
            raise BadRequest("Context has closed")
        if ctx is None:
            s = self.settings
            ctx = Context(context_id, encoding, temperature=s.temperature, top_k=s.top_k, seed=s.seed)
        elif encoding != ctx.encoding:
            raise BadRequest("output_format must stay the same within a context")
        self.read_extension(msg, ctx)
        contexts[context_id] = ctx
        ctx.parts.append(transcript)
        if more:
            return
        text = "".join(ctx.parts)
        if not text.strip():
            raise BadRequest("the transcript is empty")
        self.submit(ctx, text, contexts, post)

    @staticmethod
    def read_extension(msg: dict, ctx: Context) -> None:
        ext = msg.get("gepard")
        if ext is None:
            return
        if not isinstance(ext, dict):
            raise BadRequest("gepard must be an object")
        if ext.get("max_frames") is not None:
            n = ext["max_frames"]
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_FRAMES_LIMIT:
                raise BadRequest(f"gepard.max_frames must be an integer from 1 to {MAX_FRAMES_LIMIT}")
            ctx.max_frames = n
        if "ignore_stop" in ext:
            if not isinstance(ext["ignore_stop"], bool):
                raise BadRequest("gepard.ignore_stop must be true or false")
            ctx.ignore_stop = ext["ignore_stop"]
        if ctx.ignore_stop and ctx.max_frames is None:
            raise BadRequest("gepard.ignore_stop needs gepard.max_frames")
        if "return_codes" in ext:
            if not isinstance(ext["return_codes"], bool):
                raise BadRequest("gepard.return_codes must be true or false")
            ctx.return_codes = ext["return_codes"]
        if "temperature" in ext:
            t = ext["temperature"]
            if not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0:
                raise BadRequest("gepard.temperature must be a number >= 0")
            ctx.temperature = float(t)
        if "top_k" in ext:
            k = ext["top_k"]
            if not isinstance(k, int) or isinstance(k, bool) or k < 0:
                raise BadRequest("gepard.top_k must be an integer >= 0")
            ctx.top_k = k
        if "seed" in ext:
            seed = ext["seed"]
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise BadRequest("gepard.seed must be an integer")
            ctx.seed = seed

    def submit(self, ctx: Context, text: str, contexts: dict[str, Context], post) -> None:
        cid, encoding, return_codes = ctx.context_id, ctx.encoding, ctx.return_codes
        request: peer_engine.Request | None = None

        def on_audio(samples: np.ndarray, codes: list[int], step_ms: float) -> None:
            msg = {"type": "chunk", "context_id": cid, "data": encode_audio(samples, encoding),
                   "done": False, "status_code": 206, "step_time": round(step_ms, 3)}
            if return_codes:
                msg["codes"] = codes
            post(request, msg, False)

        def on_done(reason: str) -> None:
            post(request, {"type": "done", "context_id": cid, "done": True, "status_code": 200}, True)

        def on_error(message: str) -> None:
            post(request, error_message(500, "Internal error", message, cid), True)

        request = ctx.request = peer_engine.Request(
            ids=self.engine.layout(text),
            max_frames=ctx.max_frames or peer_engine.DEFAULT_MAX_FRAMES,
            ignore_stop=ctx.ignore_stop, temperature=ctx.temperature, top_k=ctx.top_k, seed=ctx.seed,
            on_audio=on_audio, on_done=on_done, on_error=on_error)
        self.engine.submit(ctx.request)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="GEPARD checkpoint directory (published layout)")
    p.add_argument("--codec", help="NanoCodec .nemo or .safetensors (default: codec.* in --model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--max-batch", type=int, default=16, help="streams generated together at most")
    p.add_argument("--max-len", type=int, default=4096, help="KV cache positions per stream")
    p.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    p.add_argument("--temperature", type=float, default=0.4, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


async def main_async(args: argparse.Namespace) -> None:
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    engine = peer_engine.Engine(args.model, args.codec, device, args.dtype, args.max_batch, args.max_len)
    engine.start()
    peer = PeerServer(engine, Settings(args.temperature, args.top_k, args.seed))
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    async with serve(peer.handle, args.host, args.port, process_request=peer.process_request,
                     max_size=1 << 22) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"listening on http://{args.host}:{port}/", flush=True)
        print(f"device {device}, dtype {args.dtype}, max batch {args.max_batch}", file=sys.stderr, flush=True)
        await stop
    engine.stop()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    main()
