"""Batched GEPARD generation for the PyTorch peer server.

The LM weights and the overlay (frame embedding, codebook and stop heads) come from the project's
reference implementation (tests/python/gepard_reference.py); the backbone layers are transformers'
own ``Qwen3_5TextModel`` modules, driven here with a static KV cache per stream slot so that every
active stream advances in one batched forward per step (gepard-model.md §3.3–§3.5). NanoCodec
decoding reuses the weights of tests/python/codec_reference.py with a causal streaming state per
stream, batched across the streams that produced a frame in the same step.

Schedule of one engine step:
1. admit waiting requests (one prefill forward each; frame 0 is sampled from the SOS position);
2. decode every stream's newest frame with the streaming codec (one batched codec call) and hand
   the audio out;
3. finish the streams that reached their frame limit, then run one batched single-token decode
   step over the others: stop check (unless ignored) and sampling of the next frame.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

_HERE = os.path.dirname(os.path.abspath(__file__))
_REFERENCE_DIR = os.path.normpath(os.path.join(_HERE, "..", "..", "tests", "python"))
if _REFERENCE_DIR not in sys.path:
    sys.path.insert(0, _REFERENCE_DIR)

import codec_reference  # noqa: E402
import gepard_reference  # noqa: E402
from transformers.models.qwen3_5.modeling_qwen3_5 import (  # noqa: E402
    apply_rotary_pos_emb,
    eager_attention_forward,
)

DEFAULT_MAX_FRAMES = 2000  # §3.4


@dataclass
class Request:
    """One utterance to generate. on_audio(samples fp32 numpy, frame codes, step ms) per frame;
    on_done(reason) once;
    on_error(message) instead of on_done if generation fails."""

    ids: list[int]
    max_frames: int
    ignore_stop: bool
    temperature: float
    top_k: int
    seed: int
    on_audio: Callable[[np.ndarray, list[int], float], None]
    on_done: Callable[[str], None]
    on_error: Callable[[str], None]
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Stream:
    request: Request
    slot: int
    position: int  # next cache position (= number of tokens in the cache)
    n_frames: int  # frames sampled so far
    pending: torch.Tensor  # [32] long, the newest frame: not yet decoded to audio nor fed back
    generator: torch.Generator | None


def find_codec(model_dir: str) -> str:
    for name in ("codec.nemo", "codec.safetensors"):
        path = os.path.join(model_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"no codec.nemo or codec.safetensors in {model_dir}; pass --codec")


def _move(obj, device: torch.device):
    """Tensors (nested in lists/tuples) moved to device."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, list):
        return [_move(o, device) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_move(o, device) for o in obj)
    return obj


class StreamingCodec:
    """NanoCodec decoder (§6.1 of nanocodec.md) with one causal state per stream slot, batched over
    the slots given to one ``decode`` call: every conv's input history and every transposed conv's
    carry is a [slots, C, n] tensor, read and written for the active rows with one gather and one
    scatter per layer."""

    def __init__(self, path: str, device: torch.device, slots: int) -> None:
        codec = codec_reference.load_codec(path, dtype=torch.float32)
        self.sample_rate = codec.sample_rate
        self.samples_per_frame = codec.samples_per_frame
        dec = codec.decoder
        for name in ("pre_conv", "stage_alpha", "up_conv", "res", "post_alpha", "post_conv"):
            setattr(dec, name, _move(getattr(dec, name), device))
        self.dec = dec
        self.half = codec.quantizer.half.to(device)
        self.device = device
        self.slots = slots
        self.state: dict = {}

    def reset(self, slot: int) -> None:
        """Zero history for a new stream in slot (NeMo's zero left padding)."""
        for t in self.state.values():
            t[slot].zero_()

    def _history(self, key, rows: torch.Tensor, channels: int, length: int, like: torch.Tensor) -> torch.Tensor:
        t = self.state.get(key)
        if t is None:
            t = like.new_zeros(self.slots, channels, length)
            self.state[key] = t
        return t.index_select(0, rows)

    def _conv(self, rows: torch.Tensor, key, x: torch.Tensor, conv, dilation: int = 1) -> torch.Tensor:
        weight, bias = conv
        pad = (weight.shape[-1] - 1) * dilation
        if pad:
            x = torch.cat([self._history(key, rows, x.shape[1], pad, x), x], dim=-1)
            self.state[key].index_copy_(0, rows, x[..., x.shape[-1] - pad:])
        return F.conv1d(x, weight, bias, dilation=dilation)

    def _conv_transpose(self, rows: torch.Tensor, key, x: torch.Tensor, conv, stride: int) -> torch.Tensor:
        weight, bias = conv
        n = x.shape[-1]
        carry = self._history(key, rows, bias.shape[0], stride, x)
        raw = F.conv_transpose1d(x, weight, None, stride=stride, groups=bias.shape[0])
        head = carry + raw[..., :stride]  # the older frame's overlap first, then the new frame's
        out = torch.cat([head, raw[..., stride: n * stride]], dim=-1) + bias.reshape(1, -1, 1)
        self.state[key].index_copy_(0, rows, raw[..., n * stride:])
        return out

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """codes [B, 32] long, one frame for each stream slot in rows [B] → samples [B, 1024] fp32."""
        dec = self.dec
        latent = (codes - self.half).to(torch.float32) / self.half.to(torch.float32)
        x = self._conv(rows, "pre", latent[:, :, None], dec.pre_conv)
        for i, rate in enumerate(dec.rates):
            x = codec_reference.half_snake(x, dec.stage_alpha[i])
            x = self._conv_transpose(rows, ("up", i), x, dec.up_conv[i], rate)
            outs = []
            for j, blocks in enumerate(dec.res[i]):
                h = x
                for m, (a_in, conv_in, a_skip, conv_skip) in enumerate(blocks):
                    t = self._conv(rows, ("in", i, j, m), codec_reference.half_snake(h, a_in), conv_in,
                                   dec.dilations[m])
                    t = self._conv(rows, ("skip", i, j, m), codec_reference.half_snake(t, a_skip),
                                   conv_skip, 1)
                    h = h + t
                outs.append(h)
            total = outs[0]
            for o in outs[1:]:
                total = total + o
            x = total / len(outs)
        x = codec_reference.half_snake(x, dec.post_alpha)
        x = self._conv(rows, "post", x, dec.post_conv)
        return torch.clamp(x, -1.0, 1.0)[:, 0]


class BatchedLM:
    """The GEPARD LM with a static KV cache of ``slots`` streams × ``max_len`` positions."""

    def __init__(self, model_dir: str, device: torch.device, dtype: torch.dtype, slots: int,
                 max_len: int) -> None:
        ref = gepard_reference.GepardReference(model_dir, device=str(device))
        if dtype == torch.float32:
            # the checkpoint is read through the bf16 runner's cast; f32 runs those values in fp32
            ref.model.to(torch.float32)
            ref.set_inv_freq("f32")
            ref.audio_embeddings = [t.float() for t in ref.audio_embeddings]
            ref.embed_proj = tuple(t.float() for t in ref.embed_proj)
            ref.audio_embed_scale = ref.audio_embed_scale.float()
            ref.heads = [(w.float(), b.float()) for w, b in ref.heads]
            ref.stop_head = tuple(t.float() for t in ref.stop_head)
        self.ref = ref
        self.cfg = ref.cfg
        self.device = device
        self.dtype = dtype
        self.model = ref.model
        c = ref.backbone_config
        self.n_layers = c.num_hidden_layers
        self.n_kv = c.num_key_value_heads
        self.head_dim = c.head_dim
        self.max_len = max_len
        self.slots = slots
        shape = (slots, self.n_kv, max_len, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.n_layers)]
        self.v_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.n_layers)]
        levels = self.cfg.head_levels
        self.levels = torch.tensor(levels, device=device)
        self.max_level = max(levels)
        # gather map: logits [B, sum L] → [B, n_heads, max_level], padding slots at column sum(L)
        total = sum(levels)
        index = torch.full((len(levels), self.max_level), total, dtype=torch.long)
        start = 0
        for i, level in enumerate(levels):
            index[i, :level] = torch.arange(start, start + level)
            start += level
        self.head_index = index.to(device)
        self.head_weight = torch.cat([w for w, _ in ref.heads], 0)
        self.head_bias = torch.cat([b for _, b in ref.heads], 0)

    # -- backbone ------------------------------------------------------------------------------------
    def _forward(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 kv_len: int, prefill: bool) -> torch.Tensor:
        """x [B, N, H]; positions [B, N]; slots [B]. Writes K/V of the N new tokens at their positions
        and attends over cache positions [0, kv_len). → final-norm hidden [B, N, H]."""
        model = self.model
        bsz, n, _ = x.shape
        cos, sin = model.rotary_emb(x, positions[None].expand(3, bsz, n))
        keys = torch.arange(kv_len, device=self.device)
        allowed = keys[None, None, :] <= positions[:, :, None]  # [B, N, kv_len], causal per row
        mask = torch.zeros(bsz, 1, n, kv_len, dtype=x.dtype, device=self.device)
        mask.masked_fill_(~allowed[:, None], torch.finfo(x.dtype).min)
        slot_list = slots.tolist()
        prefill_slot = slot_list[0]
        contiguous = slot_list == list(range(bsz))
        for li, layer in enumerate(model.layers):
            attn = layer.self_attn
            residual = x
            h = layer.input_layernorm(x)
            q, gate = torch.chunk(attn.q_proj(h).view(bsz, n, -1, self.head_dim * 2), 2, dim=-1)
            gate = gate.reshape(bsz, n, -1)
            q = attn.q_norm(q.reshape(bsz, n, -1, self.head_dim)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(h).view(bsz, n, -1, self.head_dim)).transpose(1, 2)
            v = attn.v_proj(h).view(bsz, n, -1, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            kc, vc = self.k_cache[li], self.v_cache[li]
            if prefill:  # one stream, positions 0 … n−1: attend over the new keys themselves
                kc[prefill_slot, :, :n] = k[0]
                vc[prefill_slot, :, :n] = v[0]
                keys_b, values_b = k, v
            else:  # one token per row
                kc[slots, :, positions[:, 0]] = k[:, :, 0]
                vc[slots, :, positions[:, 0]] = v[:, :, 0]
                if contiguous:
                    keys_b, values_b = kc[:bsz, :, :kv_len], vc[:bsz, :, :kv_len]
                else:
                    keys_b, values_b = kc[slots, :, :kv_len], vc[slots, :, :kv_len]
            o, _ = eager_attention_forward(attn, q, keys_b, values_b, mask, scaling=attn.scaling)
            o = o.reshape(bsz, n, -1) * torch.sigmoid(gate)
            x = residual + attn.o_proj(o)
            residual = x
            x = residual + layer.mlp(layer.post_attention_layernorm(x))
        return model.norm(x)

    @torch.no_grad()
    def prefill(self, ids: list[int], slot: int) -> torch.Tensor:
        """Prefill one stream into its slot (no prefix, §3.2). → hidden of the last position [H]."""
        embeds = self.ref.embed_text(ids).to(self.dtype)[None]
        n = embeds.shape[1]
        positions = torch.arange(n, device=self.device)[None]
        slots = torch.tensor([slot], device=self.device)
        return self._forward(embeds, positions, slots, n, prefill=True)[0, -1]

    @torch.no_grad()
    def decode(self, frames: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Feed one frame per stream back (§3.5). frames [B, 32]; positions [B]. → hidden [B, H]."""
        embeds = self.frame_embed(frames)[:, None]
        kv_len = int(positions.max()) + 1
        return self._forward(embeds, positions[:, None], slots, kv_len, prefill=False)[:, 0]

    # -- overlay -------------------------------------------------------------------------------------
    def frame_embed(self, frames: torch.Tensor) -> torch.Tensor:
        ref = self.ref
        x = torch.cat([ref.audio_embeddings[i][frames[:, i]] for i in range(self.cfg.n_heads)], dim=-1)
        w0, b0, w2, b2 = ref.embed_proj
        b = F.linear(F.gelu(F.linear(x, w0, b0)), w2, b2)
        return F.layer_norm(b, (b.shape[-1],), eps=1e-5) * ref.audio_embed_scale

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, H] → fp32 logits [B, n_heads, max_level], −inf beyond each head's level."""
        flat = F.linear(hidden, self.head_weight, self.head_bias).float()
        flat = torch.cat([flat, flat.new_full((flat.shape[0], 1), float("-inf"))], dim=1)
        return flat[:, self.head_index]

    def stop(self, hidden: torch.Tensor) -> torch.Tensor:
        """§3.4: sigmoid of the stop logit in the model dtype, > 0.5. → bool [B]."""
        w, b = self.ref.stop_head
        return torch.sigmoid(F.linear(hidden, w, b))[:, 0] > gepard_reference.STOP_THRESHOLD


def sample_frames(logits: torch.Tensor, streams: list[_Stream]) -> torch.Tensor:
    """§3.4 per head: argmax for temperature 0, else temperature, top-k and a seeded draw.
    logits [B, n_heads, max_level] → frames [B, n_heads] long."""
    frames = torch.argmax(logits, dim=-1)
    for b, stream in enumerate(streams):
        req = stream.request
        if req.temperature <= 0:
            continue
        row = logits[b] / req.temperature
        if req.top_k > 0:
            k = min(req.top_k, row.shape[-1])
            kth = torch.topk(row, k, dim=-1).values[:, -1:]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        frames[b] = torch.multinomial(probs, 1, generator=stream.generator)[:, 0]
    return frames


class Engine:
    """Runs every stream of every connection on one device thread, one batched step at a time."""

    def __init__(self, model_dir: str, codec_path: str | None, device: str, dtype: str,
                 max_batch: int, max_len: int) -> None:
        self.device = torch.device(device)
        torch_dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
        self.lm = BatchedLM(model_dir, self.device, torch_dtype, max_batch, max_len)
        self.codec = StreamingCodec(codec_path or find_codec(model_dir), self.device, max_batch)
        self.max_batch = max_batch
        self.max_len = max_len
        self.tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        self.steps_by_batch: dict[int, int] = {}
        self.prefills = 0
        self._incoming: queue.Queue[Request | None] = queue.Queue()
        self._streams: list[_Stream] = []
        self._free_slots = list(range(max_batch))
        self._thread = threading.Thread(target=self._run, name="gepard-engine", daemon=True)
        self._stopping = False
        self._last_step = 0.0  # perf_counter at the start of the previous step

    # -- text ----------------------------------------------------------------------------------------
    def layout(self, text: str) -> list[int]:
        """§3.1 ids: tokenizer.json (no special tokens added), repetition rule, special ids."""
        cfg = self.lm.cfg
        tokens = self.tokenizer.encode(text, add_special_tokens=False).ids
        return gepard_reference.text_layout(tokens, cfg.sot, cfg.eot, cfg.sos, cfg.repetition)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._incoming.put(None)
        self._thread.join(timeout=10)

    def submit(self, request: Request) -> None:
        self._incoming.put(request)

    def stats(self) -> dict:
        return {"steps_by_batch": {str(k): v for k, v in sorted(self.steps_by_batch.items())},
                "max_batch_seen": max(self.steps_by_batch, default=0),
                "prefills": self.prefills, "active": len(self._streams)}

    # -- the loop ------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            try:
                self._admit()
                if self._streams:
                    self._step()
            except Exception as exc:  # a failed step ends every stream in it, the server goes on
                for stream in self._streams:
                    stream.request.on_error(f"generation failed: {exc}")
                    self._free_slots.append(stream.slot)
                self._streams = []

    def _admit(self) -> None:
        block = not self._streams
        while len(self._streams) < self.max_batch:
            try:
                req = self._incoming.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                if block and not self._stopping:
                    continue
                return
            if req is None:
                return
            block = False
            if req.cancelled.is_set():
                continue
            if len(req.ids) + 1 >= self.max_len:
                req.on_error(f"the text needs {len(req.ids)} positions, the cache holds {self.max_len}")
                continue
            slot = self._free_slots.pop(0)
            generator = None
            if req.temperature > 0:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(req.seed)
            stream = _Stream(req, slot, len(req.ids), 1, torch.empty(0), generator)
            try:
                hidden = self.lm.prefill(req.ids, slot)
                self.codec.reset(slot)
                stream.pending = sample_frames(self.lm.head_logits(hidden[None]), [stream])[0]
            except Exception as exc:
                self._free_slots.append(slot)
                req.on_error(f"prefill failed: {exc}")
                continue
            self.prefills += 1
            # never more frames than the cache can hold: frame j is fed back at position P + j
            req.max_frames = max(1, min(req.max_frames, self.max_len - len(req.ids) + 1))
            self._streams.append(stream)

    def _finish(self, stream: _Stream, reason: str) -> None:
        self._free_slots.append(stream.slot)
        if not stream.request.cancelled.is_set():
            stream.request.on_done(reason)

    def _step(self) -> None:
        # drop cancelled streams
        live = []
        for s in self._streams:
            if s.request.cancelled.is_set():
                self._free_slots.append(s.slot)
            else:
                live.append(s)
        self._streams = live
        if not live:
            return
        # audio of every stream's newest frame, one batched codec call
        started = time.perf_counter()
        codes = torch.stack([s.pending for s in live])
        rows = torch.tensor([s.slot for s in live], device=self.device)
        audio = self.codec.decode(codes, rows).cpu().numpy()
        step_ms = (time.perf_counter() - self._last_step) * 1000.0 if self._last_step else 0.0
        self._last_step = started
        for s, samples, frame in zip(live, audio, codes.cpu().tolist()):
            s.request.on_audio(samples, frame, step_ms)
        # frame limit reached: done
        going = []
        for s in live:
            if s.n_frames >= s.request.max_frames:
                self._finish(s, "max_frames")
            else:
                going.append(s)
        self._streams = going
        if not going:
            return
        bsz = len(going)
        self.steps_by_batch[bsz] = self.steps_by_batch.get(bsz, 0) + 1
        # keep rows in slot order so that a full, ordered batch reads the cache without a gather
        going.sort(key=lambda s: s.slot)
        positions = torch.tensor([s.position for s in going], device=self.device)
        slots = torch.tensor([s.slot for s in going], device=self.device)
        hidden = self.lm.decode(codes_of(going), positions, slots)
        stops = self.lm.stop(hidden).cpu().tolist()
        frames = sample_frames(self.lm.head_logits(hidden), going)
        still = []
        for b, s in enumerate(going):
            s.position += 1
            if stops[b] and not s.request.ignore_stop:
                self._finish(s, "stop")
                continue
            s.pending = frames[b]
            s.n_frames += 1
            still.append(s)
        self._streams = still


def codes_of(streams: list[_Stream]) -> torch.Tensor:
    return torch.stack([s.pending for s in streams])

