#!/usr/bin/env python3
"""Trains, exports and samples Gepard's default voice: a GEPARD model at reduced size.

The model is GEPARD exactly as /work/shared/specs/gepard-model.md describes it (cited as §n), only
smaller: transformers' Qwen3_5TextModel with every layer full attention (§1), the frame embedding
(§3.5), 32 FSQ codebook heads and the stop head (§3.4), the Q-Former reference compressor (§3.6) and
the learned null prefix (§3.7), under the published tensor names (§2.3) and checkpoint files (§2.4).
The C engine loads an export like any GEPARD checkpoint.

Voices. The engine's default voice has no prefix at all (K = 0, §3.2; gepard-core's voice
registry). Training therefore teaches "no prefix" as one fixed speaker, the default speaker (the one
with the most audio unless --default-speaker names another): its utterances go without a prefix half
of the time. Every other example gets the compressor's prefix of a *different* utterance of the same
speaker (a random crop of it, §3.6 input: unfolded codes) or, with probability 0.15, the null prefix
(an unconditional voice, as in GEPARD's training).

Steps (DATA/codes.pt comes from tools/voice/codec.py; RUN is a directory of your choice):

    python3 tools/voice/tokenizer.py CORPUS_DIR --output RUN/tokenizer.json
    python3 tools/voice/lm.py train --data DATA/codes.pt --run RUN --time-limit 23 --resume
        (repeat the same command until it prints "finished": each run stops itself after
         --time-limit minutes with a checkpoint in RUN/checkpoint/; --resume starts afresh when
         there is none yet. The plan is --steps optimizer steps (default 40000) or, with
         --minutes M, M minutes of training time; the learning rate's cosine runs over it)
    python3 tools/voice/lm.py export RUN models/gepard-default
    python3 tools/voice/lm.py slim RUN SLIM_RUN
        (RUN with its checkpoint's weights only: resumable, a third of the size, for carrying a run
         between machines; AdamW's moments start afresh when it resumes)
    python3 tools/voice/lm.py average RUN_AT_STEP_A RUN_AT_STEP_B … --out RUN_MEAN
        (the mean of one training's checkpoints, a slimmed run of the last: export it as any run)
    python3 tools/voice/lm.py sample models/gepard-default --text "Hello there." --output frames.safetensors
    build/tools/gepard-codec-tool decode CODEC frames.safetensors samples.safetensors
    build/tools/gepard-inspect model models/gepard-default
    python3 tools/voice/lm.py walk models/gepard-default --text "Hello there." --codes DATA/codes.pt
        (where the alignment loss's heads look over the text, frame by frame: see cmd_walk)

Training: teacher forcing over [prefix | text layout (§3.1 repetition) | frames], per channel
cross-entropy over its L levels from the hidden state one position earlier (SOS predicts frame 0),
plus the stop head's BCE on the hidden state of each frame (1 on the last frame, §3.4), and with
--align-weight the alignment loss of a few attention heads (see alignment_loss); with --text-gap G
half the examples get their frames' positions moved on by 1…G past the text (see collate); with
--frame-noise P the frames the model reads (not those it predicts) have each code moved to a
neighbouring level with probability P (see noisy_frames); with --own-frames P a share P of the
frames it reads are its own argmax predictions of them from a first pass (see own_frames); with
--frame-blank P a share P of them are hidden (see blanked_frames); with --bpe-dropout P half the
examples' texts are tokenized with BPE-dropout P (see bpe_dropout_variants); with --text-dropout
P a share P of the examples read the empty text, for text-CFG (see training_examples). AdamW (with
--cooldown C the learning rate falls to 0 over the plan's last C minutes or steps), bf16
autocast on CUDA, batches of similar length under a token budget (on CUDA built ahead in a
worker process: see training_batches). RoPE uses bf16-rounded inv_freq in training as the engine
does at inference (§1.5). A loss gone non-finite stops the run at its next log line with an error,
the checkpoint saved before left as it was.

A checkpoint (RUN/checkpoint/) is state.json plus safetensors shards of at most 15 MiB each holding
the weights and both AdamW moments in bf16 (6 bytes a parameter), and each parameter's AdamW step.
"""

import argparse
import json
import math
import os
import pathlib
import random
import re
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

FSQ_LEVELS = (8, 7, 6, 6)  # §2.3: channel i has L_i = FSQ_LEVELS[i % 4]
N_CHANNELS = 32
STOP_THRESHOLD = 0.5  # §3.4
SHARD_BYTES = 15 << 20
CHECKPOINT = "checkpoint"

# Model shapes. "default" is the shipped voice; "tiny" is for tests on one CPU core.
PRESETS = {
    "default": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=64, intermediate_size=768, audio_embed_dim=32, compressor_heads=4,
                    compressor_ffn_multiplier=2),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, intermediate_size=128, audio_embed_dim=8, compressor_heads=4,
                 compressor_ffn_multiplier=2),
}
COMPRESSOR_QUERIES = 8  # §3.6
COMPRESSOR_BLOCKS = 2
ROPE_THETA = 1e7  # §1.5
DEFAULT_STEPS = 40000
# the batches, learning rate and alignment loss of a new run, where not given; a resumed run keeps
# its own unless given others. On a GPU the small model is bound by the host's work per step (one
# H200 stays ~10 % busy at these sizes), so larger batches there train faster: recipe.sh passes
# larger ones. align_layers "" means every layer but the first (see alignment_loss).
BATCH_DEFAULTS = {"lr": 1e-3, "warmup": 1000, "max_tokens": 24000, "max_batch": 96,
                  "align_weight": 0.0, "align_layers": "", "text_gap": 0, "frame_noise": 0.0,
                  "own_frames": 0.0, "frame_blank": 0.0, "bpe_dropout": 0.0, "text_dropout": 0.0,
                  "cooldown": 0.0}

# §3.1 text repetition, as the published gepard_config.json has it
TEXT_REPETITION = {"enabled": True, "target_text_tokens": 16, "apply_below": 13, "max_repeats": 8,
                   "mixed_keep_prob": 0.25, "seed": 0}


# ---- configs -------------------------------------------------------------------------------------

def mrope_section(head_dim):
    """[T, H, W] split of the head's frequencies, [11, 11, 10] scaled (§1.5: a no-op for text)."""
    n = head_dim // 2
    s = (n * 11 + 31) // 32
    return [s, s, n - 2 * s]


def backbone_dict(shape, vocab_size, special):
    """config.json: the backbone's Qwen3_5TextConfig fields (§2.1, §2.4), both rotary factors 1.0."""
    layers = shape["num_hidden_layers"]
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "hidden_size": shape["hidden_size"],
        "intermediate_size": shape["intermediate_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": shape["num_attention_heads"],
        "num_key_value_heads": shape["num_key_value_heads"],
        "head_dim": shape["head_dim"],
        "vocab_size": vocab_size,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "full_attention_interval": 1,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "dtype": "bfloat16",
        "eos_token_id": special["im_end"],
        "pad_token_id": special["endoftext"],
        "layer_types": ["full_attention"] * layers,
        "partial_rotary_factor": 1.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA,
                            "partial_rotary_factor": 1.0,
                            "mrope_section": mrope_section(shape["head_dim"]),
                            "mrope_interleaved": True},
    }


def gepard_dict(shape, backbone, special, head_levels):
    """gepard_config.json (§2.4), keys in the published order; audio_heads order is the wiring."""
    return {
        "backbone_config": backbone,
        "audio_heads": {f"level_audio_{i}": int(level) for i, level in enumerate(head_levels)},
        "audio_embed_dim": shape["audio_embed_dim"],
        "partial_rotary_factor": 1.0,
        "special_tokens": {
            "tokeniser_length": special["tokeniser_length"],
            "start_of_text": special["start_of_text"],
            "end_of_text": special["end_of_text"],
            "start_of_speech": special["start_of_speech"],
            "end_of_speech": special["end_of_speech"],
            "tts_pad": special["tts_pad"],
        },
        "stop_loss_weight": 1.0,
        "stop_pos_weight": 1.0,
        "model_dtype": "bfloat16",
        "codec": {"name": "nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps", "num_layers": N_CHANNELS // 4,
                  "fsq_levels": list(FSQ_LEVELS), "do_unfold": True, "frame_rate_hz": 21.5,
                  "sample_rate": 22050},
        "text_repetition": dict(TEXT_REPETITION),
        "voice_cloning": {"enabled": True, "compressor": {
            "num_queries": COMPRESSOR_QUERIES, "num_layers": COMPRESSOR_BLOCKS,
            "num_heads": shape["compressor_heads"], "d_model": shape["hidden_size"],
            "ffn_hidden_size_multiplier": shape["compressor_ffn_multiplier"], "dropout": 0.0}},
    }


def tokenizer_special_ids(tokenizer_path):
    """GEPARD role → id (and "tokeniser_length"), read from a tokenizer.json with the 33 added
    tokens (§4), through tools/voice/tokenizer.py."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("voice_tokenizer", pathlib.Path(__file__).with_name("tokenizer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with open(tokenizer_path, encoding="utf-8") as f:
        try:
            return module.special_ids(json.load(f))
        except ValueError as e:
            raise SystemExit(f"{tokenizer_path}: {e}")


# ---- text layout (§3.1) --------------------------------------------------------------------------

def repetition_count(n, rep=TEXT_REPETITION):
    if not rep["enabled"] or n <= 0 or n >= rep["apply_below"] or n >= rep["target_text_tokens"]:
        return 1
    return max(1, min(-(-rep["target_text_tokens"] // n), rep["max_repeats"]))


def text_layout(tokens, special, rep=TEXT_REPETITION):
    """[SOT t… EOT] × (R−1) ++ [SOT t… EOT SOS]."""
    block = [special["start_of_text"], *tokens, special["end_of_text"]]
    return block * (repetition_count(len(tokens), rep) - 1) + block + [special["start_of_speech"]]


# ---- the model -----------------------------------------------------------------------------------

def sinusoidal_positions(length, d_model):
    """§3.6 step 3: PE[t, 2i] = sin(t·ω_i), PE[t, 2i+1] = cos(t·ω_i), ω_i = exp(2i·(−ln 10000/d))."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    omega = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(length, d_model, dtype=torch.float32)
    pe[:, 0::2] = torch.sin(position * omega)
    pe[:, 1::2] = torch.cos(position * omega)
    return pe


class CompressorRMSNorm(nn.Module):
    """§3.6 step 6: weight initialised to ones; normalised, rounded to the input dtype, then × w."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class CompressorAttention(nn.Module):
    """Bidirectional multi-head attention, separate projections without bias (§3.6 step 5)."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, xq, xkv, key_mask=None):
        b, tq, d = xq.shape
        tk = xkv.shape[1]
        hd = d // self.n_heads
        q = self.q_proj(xq).view(b, tq, self.n_heads, hd).transpose(1, 2)
        k = self.k_proj(xkv).view(b, tk, self.n_heads, hd).transpose(1, 2)
        v = self.v_proj(xkv).view(b, tk, self.n_heads, hd).transpose(1, 2)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        return self.out_proj(o.transpose(1, 2).reshape(b, tq, d))


class CompressorFFN(nn.Module):
    def __init__(self, d_model, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class QFormerBlock(nn.Module):
    def __init__(self, d_model, n_heads, ffn_hidden):
        super().__init__()
        self.norm_self = CompressorRMSNorm(d_model)
        self.self_attn = CompressorAttention(d_model, n_heads)
        self.norm_cross = CompressorRMSNorm(d_model)
        self.cross_attn = CompressorAttention(d_model, n_heads)
        self.norm_ffn = CompressorRMSNorm(d_model)
        self.ffn = CompressorFFN(d_model, ffn_hidden)

    def forward(self, q, x, key_mask):
        h = self.norm_self(q)
        q = q + self.self_attn(h, h)
        q = q + self.cross_attn(self.norm_cross(q), x, key_mask)
        return q + self.ffn(self.norm_ffn(q))


class RefCompressor(nn.Module):
    """§3.6: unfolded reference codes [B, T, 32] → speaker prefix [B, 8, d_model]."""

    def __init__(self, d_model, head_levels, n_heads, ffn_multiplier):
        super().__init__()
        self.input_proj = nn.Linear(len(head_levels), d_model)
        self.queries = nn.Parameter(torch.randn(COMPRESSOR_QUERIES, d_model) * 0.02)
        self.blocks = nn.ModuleList(QFormerBlock(d_model, n_heads, d_model * ffn_multiplier)
                                    for _ in range(COMPRESSOR_BLOCKS))
        self.final_norm = CompressorRMSNorm(d_model)
        self.output_scale = nn.Parameter(torch.tensor(1.0 / math.sqrt(1024)))  # 0-dim, as published
        half = torch.tensor([level // 2 for level in head_levels], dtype=torch.float32)
        self.register_buffer("half_levels", half, persistent=False)
        self.register_buffer("positions", sinusoidal_positions(2048, d_model), persistent=False)

    def forward(self, codes, key_mask=None):
        t = codes.shape[1]
        if t > self.positions.shape[0]:
            self.positions = sinusoidal_positions(t, self.positions.shape[1]).to(self.positions)
        v = ((codes.float() - self.half_levels) / self.half_levels).to(self.input_proj.weight.dtype)
        x = self.input_proj(v) + self.positions[:t]
        q = self.queries[None].expand(codes.shape[0], -1, -1)
        for block in self.blocks:
            q = block(q, x, key_mask)
        return self.output_scale * self.final_norm(q)


class GepardLM(nn.Module):
    """GEPARD (§2.3 names): backbone `model`, frame embedding, 32 heads, stop head, compressor and
    null prefix."""

    def __init__(self, backbone, head_levels, audio_embed_dim, compressor_heads, compressor_ffn_multiplier,
                 attn_implementation="sdpa"):
        super().__init__()
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel

        config = Qwen3_5TextConfig.from_dict(dict(backbone))
        config._attn_implementation = attn_implementation
        self.config = config
        h = config.hidden_size
        self.head_levels = list(head_levels)
        self.model = Qwen3_5TextModel(config)
        # the engine rounds inv_freq to bf16 (§1.5, GepardRunner's .to(bf16)); train with the same
        rotary = self.model.rotary_emb
        rotary.inv_freq = rotary.inv_freq.to(torch.bfloat16).float()
        rotary.original_inv_freq = rotary.inv_freq.clone()

        self.audio_embeddings = nn.ModuleList(nn.Embedding(level, audio_embed_dim) for level in head_levels)
        self.audio_embed_proj = nn.Sequential(
            nn.Linear(len(head_levels) * audio_embed_dim, h), nn.GELU(), nn.Linear(h, h),
            nn.LayerNorm(h, elementwise_affine=False))
        # §2.3: a frozen scalar ≈ the text embedding's std
        self.audio_embed_scale = nn.Parameter(torch.tensor(float(config.initializer_range)),
                                              requires_grad=False)
        self.codebook_heads = nn.ModuleList(nn.Linear(h, level) for level in head_levels)
        self.stop_head = nn.Linear(h, 1)
        self.ref_compressor = RefCompressor(h, head_levels, compressor_heads, compressor_ffn_multiplier)
        self.null_prefix = nn.Parameter(torch.randn(COMPRESSOR_QUERIES, h) * 0.02)

        # per-head logits gathered into [.., 32, max L]; the missing levels get a large negative bias
        max_level = max(head_levels)
        offsets = [sum(head_levels[:i]) for i in range(len(head_levels))]
        index = torch.tensor([[offsets[i] + min(j, level - 1) for j in range(max_level)]
                              for i, level in enumerate(head_levels)])
        valid = torch.tensor([[j < level for j in range(max_level)] for level in head_levels])
        self.register_buffer("logit_index", index, persistent=False)
        self.register_buffer("logit_valid", valid, persistent=False)

    def embed_frames(self, codes):
        """§3.5: codes [N, 32] → frame embeddings [N, H]."""
        x = torch.cat([emb(codes[:, i]) for i, emb in enumerate(self.audio_embeddings)], dim=-1)
        return self.audio_embed_proj(x) * self.audio_embed_scale

    def head_logits(self, hidden):
        """hidden [N, H] → per-head logits [N, 32, max L] (fp32; invalid levels at −1e9)."""
        weight = torch.cat([head.weight for head in self.codebook_heads])
        bias = torch.cat([head.bias for head in self.codebook_heads])
        logits = F.linear(hidden, weight.to(hidden.dtype), bias.to(hidden.dtype)).float()
        logits = logits[:, self.logit_index]
        return logits.masked_fill(~self.logit_valid, -1e9)


# ---- the alignment loss (training only) ----------------------------------------------------------
#
# A decoder-only TTS model must find on its own which text token each frame speaks, and a small one
# trained for minutes mostly does not: it continues the audio and drifts off the text. The
# alignment loss teaches a few attention heads a walk over the text that lasts the whole
# utterance. For the query of each frame, a head's attention over the last text block's tokens
# (§3.1), renormalised over them, is read as a distribution over tokens 1 … k, and two terms act
# on it: CTC with an impossible blank (after the "forward-sum" loss of RAD-TTS) maximises the
# probability of all paths through tokens 1 … k in order, every frame on one token; and the
# guided-attention term of DC-TTS, the mass off the diagonal band n/F ≈ t/k (width GUIDE_WIDTH),
# sets the pace. Each alone was seen to fail on the GPU and the CPU: a blank meaning "attending to
# anything else" let the walk race through the text in k frames and rest after; without a blank the
# walk raced through and stayed on the last token (both cost CTC nothing, and the cursor of a
# 134-frame utterance reached its 28th token by frame 44). The model's forward pass is unchanged
# (SDPA computes the attention output; the loss re-reads q and k of the chosen heads), so nothing
# of it reaches the export.

ALIGN_ATTENTION = "gepard_align"
GUIDE_WIDTH = 0.2  # the diagonal band's width, as a share of the utterance (g of guided attention)


def alignment_loss(query, key, scaling, request):
    """CTC + guided attention over the attention of request["heads"] (query heads) from the frame
    rows to the text.

    query [B, Hq, N, D], key [B, Hkv, N, D]; request: rows [B, F] (query positions, F = frames),
    row_len [B], cols [B, T] (text token positions), col_len [B]."""
    rows, cols = request["rows"], request["cols"]
    heads = request["heads"]
    groups = query.shape[1] // key.shape[1]
    with torch.autocast(query.device.type, enabled=False):
        q = query[:, heads].float()
        k = key[:, [h // groups for h in heads]].float()
        b, hs, _, d = q.shape
        f, t = rows.shape[1], cols.shape[1]
        q = torch.gather(q, 2, rows[:, None, :, None].expand(b, hs, f, d))
        k = torch.gather(k, 2, cols[:, None, :, None].expand(b, hs, t, d))
        scores = (q @ k.transpose(-1, -2)) * scaling  # [B, Hs, F, T]: the text keys precede every frame
        col_valid = torch.arange(t, device=q.device)[None, :] < request["col_len"][:, None]
        text = torch.log_softmax(scores.masked_fill(~col_valid[:, None, None, :], float("-inf")), -1)
        blank = torch.full_like(text[..., :1], -1e4)  # never taken
        log_probs = torch.cat([blank, text.clamp(min=-1e4)], -1)  # CTC's gradient is NaN at −inf
        log_probs = log_probs.permute(2, 0, 1, 3).reshape(f, b * hs, 1 + t)
        targets = torch.arange(1, t + 1, device=q.device).expand(b * hs, t)
        walk = F.ctc_loss(log_probs, targets, request["row_len"].repeat_interleave(hs),
                          request["col_len"].repeat_interleave(hs), blank=0, reduction="mean",
                          zero_infinity=True)
        # the guided-attention term: the attention's mass off the diagonal band n/F ≈ t/T
        row_len, col_len = request["row_len"].float(), request["col_len"].float()
        n_rel = torch.arange(f, device=q.device)[None, :] / row_len[:, None]  # [B, F]
        t_rel = (torch.arange(t, device=q.device)[None, :] + 0.5) / col_len[:, None]  # [B, T]
        off = 1 - torch.exp(-(n_rel[:, :, None] - t_rel[:, None, :]) ** 2 / (2 * GUIDE_WIDTH ** 2))
        row_valid = (torch.arange(f, device=q.device)[None, :] < request["row_len"][:, None]).float()
        guided = (text.exp() * off[:, None]).sum(-1)  # [B, Hs, F]
        guided = (guided * row_valid[:, None]).sum() / (row_valid.sum() * hs)
        return walk + guided


def register_align_attention():
    """The attention implementation ALIGN_ATTENTION: SDPA, plus alignment_loss on the layers that
    carry an align_request (its value left in the module's align_value)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        out = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                     dropout=dropout, **kwargs)
        request = getattr(module, "align_request", None)
        if request is not None:
            module.align_value = alignment_loss(query, key, module.scaling if scaling is None else scaling,
                                                request)
        return out

    AttentionInterface.register(ALIGN_ATTENTION, forward)
    AttentionMaskInterface.register(ALIGN_ATTENTION, sdpa_mask)


def align_heads(config):
    """The query heads the alignment loss teaches: the first of each key-value group."""
    return list(range(0, config.num_attention_heads, config.num_attention_heads // config.num_key_value_heads))


def last_block_columns(n_ids, token_count, offset=0):
    """Positions of the last text block's tokens in a sequence whose laid-out ids (text_layout:
    […SOT t₁…t_k EOT SOS]) take positions offset … offset + n_ids − 1."""
    return range(offset + n_ids - 2 - token_count, offset + n_ids - 2)


def align_layer_indices(spec, text):
    """"1,2" → [1, 2]; "" → every layer but the first."""
    layers = spec["num_hidden_layers"]
    chosen = [int(x) for x in text.split(",") if x.strip()] if text else list(range(1, layers))
    if not chosen or any(not 0 <= i < layers for i in chosen):
        raise SystemExit(f"--align-layers {text!r}: layers are 0…{layers - 1}")
    return chosen


def count_parameters(model):
    return sum(p.numel() for p in model.state_dict().values())


# ---- data ----------------------------------------------------------------------------------------

class Utterance:
    """variants: other tokenizations of the text, [(tokens, ids)] (see bpe_dropout_variants)."""
    __slots__ = ("id", "speaker", "tokens", "ids", "codes", "variants")

    def __init__(self, uid, speaker, tokens, ids, codes, variants=()):
        self.id, self.speaker, self.tokens, self.ids, self.codes = uid, speaker, tokens, ids, codes
        self.variants = variants

    def length(self):
        return len(self.ids) + self.codes.shape[0]

    def spelled(self, rng, p):
        """With probability p (where it has variants), the utterance under one of its other
        tokenizations; else itself."""
        if not self.variants or rng.random() >= p:
            return self
        tokens, ids = rng.choice(self.variants)
        return Utterance(self.id, self.speaker, tokens, ids, self.codes)

    def unread(self, empty_ids):
        """The utterance with the empty text (text_layout of no tokens), as text-CFG's second
        branch reads it (§3.4)."""
        return Utterance(self.id, self.speaker, [], empty_ids, self.codes)


def load_codes(path):
    data = torch.load(path, map_location="cpu", weights_only=False)
    levels = [int(level) for level in data["levels"]]
    if levels != [FSQ_LEVELS[i % 4] for i in range(N_CHANNELS)]:
        raise SystemExit(f"{path}: levels {levels} are not the codec's {list(FSQ_LEVELS)} × 8 (§2.3)")
    return levels, data["utterances"]


BPE_VARIANTS = 4  # other tokenizations kept per utterance with --bpe-dropout


def bpe_dropout_variants(tokenizer_path, texts, special, dropout, count=BPE_VARIANTS):
    """Per text, `count` tokenizations with BPE-dropout (each merge skipped with probability
    dropout; Provilkov et al., 2020), as [(tokens, laid-out ids)]. The tokenizer splits a word it
    never saw in training into short pieces, which the common words it keeps whole rarely show the
    model; spelling the training text in pieces too teaches their sounds."""
    from tokenizers import Tokenizer

    config = json.loads(pathlib.Path(tokenizer_path).read_text(encoding="utf-8"))
    config["model"]["dropout"] = dropout
    tokenizer = Tokenizer.from_str(json.dumps(config))
    rounds = [tokenizer.encode_batch(texts, add_special_tokens=False) for _ in range(count)]
    return [[(list(r[i].ids), text_layout(r[i].ids, special)) for r in rounds if r[i].ids]
            for i in range(len(texts))]


def prepare_utterances(records, levels, tokenizer_path, special, max_frames, exclude_speakers,
                       bpe_dropout=0.0):
    """Tokenized, laid-out utterances with uint8 codes of the "train" split (codec.py marks the
    held-out speaker "heldout_speaker"); skips excluded speakers and unusable utterances. With
    bpe_dropout > 0 each also gets BPE_VARIANTS other tokenizations (bpe_dropout_variants)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    bound = torch.tensor(levels)
    kept, skipped = [], 0
    records = [r for r in records
               if r.get("split", "train") == "train" and r["speaker"] not in exclude_speakers]
    texts = [r["text"] for r in records]
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    variants = (bpe_dropout_variants(tokenizer_path, texts, special, bpe_dropout) if bpe_dropout > 0
                else [()] * len(texts))
    for record, enc, spellings in zip(records, encodings, variants):
        codes = torch.as_tensor(record["codes"])
        if (codes.ndim != 2 or codes.shape[1] != N_CHANNELS or codes.shape[0] < 2
                or codes.shape[0] > max_frames or not enc.ids):
            skipped += 1
            continue
        if bool(((codes < 0) | (codes >= bound)).any()):
            raise SystemExit(f"utterance {record['id']}: a code is outside its channel's levels")
        kept.append(Utterance(str(record["id"]), str(record["speaker"]), list(enc.ids),
                              text_layout(enc.ids, special), codes.to(torch.uint8).contiguous(), spellings))
    return kept, skipped


def split_validation(utterances, count, seed):
    """A fixed set of `count` utterances for the validation loss, the rest for training."""
    order = list(range(len(utterances)))
    random.Random(seed).shuffle(order)
    valid = set(order[:count])
    return ([u for i, u in enumerate(utterances) if i not in valid],
            [u for i, u in enumerate(utterances) if i in valid])


def make_batches(utterances, max_tokens, max_batch, seed):
    """Index lists of similar length, each under max_tokens of padded sequence, in random order."""
    rng = random.Random(seed)
    order = sorted(range(len(utterances)), key=lambda i: (utterances[i].length(), rng.random()))
    batches, current, longest = [], [], 0
    for i in order:
        n = utterances[i].length() + COMPRESSOR_QUERIES
        if current and (max(longest, n) * (len(current) + 1) > max_tokens or len(current) >= max_batch):
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


class VoicePlan:
    """Which prefix each example gets (see the module docstring)."""

    def __init__(self, utterances, default_speaker, p_default_none=0.5, p_null=0.15, ref_frames=(48, 430)):
        self.default_speaker = default_speaker
        self.p_default_none, self.p_null = p_default_none, p_null
        self.ref_frames = ref_frames
        self.by_speaker = {}
        for i, u in enumerate(utterances):
            self.by_speaker.setdefault(u.speaker, []).append(i)

    def choose(self, index, utterance, utterances, rng):
        """("none", None), ("null", None) or ("ref", codes [T, 32])."""
        if utterance.speaker == self.default_speaker and rng.random() < self.p_default_none:
            return "none", None
        same = self.by_speaker.get(utterance.speaker, [])
        if len(same) < 2 or rng.random() < self.p_null:
            return "null", None
        other = rng.randrange(len(same) - 1)  # any of the speaker's utterances but this one
        other = same[other] if same[other] != index else same[-1]
        ref = utterances[other].codes
        n = min(ref.shape[0], rng.randint(*self.ref_frames))
        start = rng.randint(0, ref.shape[0] - n)
        return "ref", ref[start:start + n]


def training_batch(train_set, plan, hp, step, indices, empty_ids=()):
    """The collated batch of training step `step` over train_set[indices] (training_examples)."""
    rng = random.Random(hp["seed"] * 1_000_003 + step)
    examples = training_examples(train_set, plan, hp, indices, empty_ids, rng)
    return collate(examples, COMPRESSOR_QUERIES, text_gaps(len(examples), hp["text_gap"], rng))


def training_examples(train_set, plan, hp, indices, empty_ids, rng):
    """[(utterance, mode, ref codes)] of train_set[indices]: their prefixes, spellings and dropped
    texts drawn from rng.

    With hp["text_dropout"] P, a share P of the examples read the empty text empty_ids instead of
    their own (their prefix kept): the model learns the unconditional branch of text-CFG (§3.4),
    which generation with a cfg_scale above 1 steers away from."""
    examples = []
    for i in indices:
        mode, ref = plan.choose(i, train_set[i], train_set, rng)
        # half the time in pieces (BPE-dropout), else as the engine tokenizes it
        utterance = train_set[i].spelled(rng, 0.5)
        if hp["text_dropout"] > 0 and rng.random() < hp["text_dropout"]:
            utterance = utterance.unread(empty_ids)
        examples.append((utterance, mode, ref))
    return examples


class TrainingBatches(torch.utils.data.IterableDataset):
    """The training batches from a given step on, for ever: (step, epoch, index of the batch in its
    epoch, batch). Each epoch's batches come from make_batches seeded by the epoch, each batch from
    training_batch, so a run resumed at any step gets the batches it would have had."""

    def __init__(self, train_set, plan, hp, step, epoch, batch_in_epoch, empty_ids=()):
        super().__init__()
        self.train_set, self.plan, self.hp, self.empty_ids = train_set, plan, hp, empty_ids
        self.start = (step, epoch, batch_in_epoch)

    def __iter__(self):
        hp = self.hp
        step, epoch, batch_in_epoch = self.start
        batches = make_batches(self.train_set, hp["max_tokens"], hp["max_batch"], hp["seed"] * 1000 + epoch)
        while True:
            if batch_in_epoch >= len(batches):
                epoch, batch_in_epoch = epoch + 1, 0
                batches = make_batches(self.train_set, hp["max_tokens"], hp["max_batch"], hp["seed"] * 1000 + epoch)
            yield step, epoch, batch_in_epoch, training_batch(self.train_set, self.plan, hp, step,
                                                              batches[batch_in_epoch], self.empty_ids)
            step, batch_in_epoch = step + 1, batch_in_epoch + 1


def training_batches(dataset, ahead, pin):
    """An iterator over TrainingBatches: with ahead > 0 up to that many built ahead in a worker
    process (forked, so the utterances are shared, not copied), in pinned memory where `pin`. The
    host's work per batch (~15 ms in Python for 300 utterances) then overlaps the GPU's instead of
    adding to it; the batches are the same either way."""
    if ahead <= 0:
        return iter(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1, prefetch_factor=ahead,
                                         pin_memory=pin, multiprocessing_context="fork")
    return (tuple(item) for item in loader)  # (the loader hands tuples over as lists)


def default_speaker_of(utterances):
    """The speaker with the most frames."""
    frames = {}
    for u in utterances:
        frames[u.speaker] = frames.get(u.speaker, 0) + u.codes.shape[0]
    return max(sorted(frames), key=lambda s: frames[s])


def text_gaps(count, max_gap, rng):
    """Per example, how far its frames' positions move past the text: 0 for half of them (the
    engine's layout), 1…max_gap for the rest."""
    return [rng.randint(1, max_gap) if max_gap > 0 and rng.random() < 0.5 else 0 for _ in range(count)]


def collate(examples, n_queries, gaps=None):
    """examples: [(utterance, mode, ref codes)] → the tensors of one teacher-forced batch.

    Every row of the padded input [B, N] is an index into one source table
    [ref prefixes (Bref·Q) | null prefix (Q) | text embeddings | frame embeddings | zero row],
    so the model assembles its input with a single gather.

    gaps (per example, default 0) move the RoPE positions of its frames on by that much past the
    text. The engine never leaves a gap; in training a gap makes the distance from a frame to the
    text it speaks useless as a cue, so attention must find its place in the text by content: a
    head that reads "the token d positions back" walks one token a frame, far faster than speech."""
    refs = [ref for _, mode, ref in examples if mode == "ref"]
    n_ref_rows = len(refs) * n_queries
    null_base = n_ref_rows
    text_base = null_base + n_queries
    n_text = sum(len(u.ids) for u, _, _ in examples)
    frame_base = text_base + n_text
    n_frames = sum(u.codes.shape[0] for u, _, _ in examples)
    zero_row = frame_base + n_frames

    lengths = [(0 if mode == "none" else n_queries) + len(u.ids) + u.codes.shape[0] for u, mode, _ in examples]
    width = max(lengths)
    index = np.full((len(examples), width), zero_row, dtype=np.int64)
    mask = np.zeros((len(examples), width), dtype=np.int64)
    positions = np.tile(np.arange(width, dtype=np.int64), (len(examples), 1))
    head_rows, stop_rows, stop_labels = [], [], []
    # alignment_loss: per row, the query positions of the frames and the last text block's tokens
    n_rows = max(u.codes.shape[0] for u, _, _ in examples)
    n_cols = max(len(u.tokens) for u, _, _ in examples)
    align_rows = np.zeros((len(examples), n_rows), dtype=np.int64)
    align_cols = np.zeros((len(examples), n_cols), dtype=np.int64)
    text_at, frame_at, ref_at = text_base, frame_base, 0
    for b, (u, mode, _) in enumerate(examples):
        pos = 0
        if mode == "ref":
            index[b, :n_queries] = np.arange(ref_at, ref_at + n_queries)
            ref_at += n_queries
            pos = n_queries
        elif mode == "null":
            index[b, :n_queries] = np.arange(null_base, null_base + n_queries)
            pos = n_queries
        n, t = len(u.ids), u.codes.shape[0]
        index[b, pos:pos + n] = np.arange(text_at, text_at + n)
        index[b, pos + n:pos + n + t] = np.arange(frame_at, frame_at + t)
        text_at += n
        frame_at += t
        mask[b, :pos + n + t] = 1
        if gaps is not None and gaps[b]:
            positions[b, pos + n:] += gaps[b]
        align_cols[b, :len(u.tokens)] = last_block_columns(n, len(u.tokens), pos)
        align_rows[b, :t] = np.arange(pos + n - 1, pos + n - 1 + t)
        first_frame = b * width + pos + n
        head_rows.append(np.arange(first_frame - 1, first_frame - 1 + t))  # SOS, frames 0…T−2
        stop_rows.append(np.arange(first_frame, first_frame + t))  # frames 0…T−1
        labels = np.zeros(t, dtype=np.float32)
        labels[-1] = 1.0
        stop_labels.append(labels)

    batch = {
        "text_ids": torch.tensor([i for u, _, _ in examples for i in u.ids], dtype=torch.long),
        "frames": torch.cat([u.codes for u, _, _ in examples]),  # uint8, widened on the device
        "index": torch.from_numpy(index),
        "mask": torch.from_numpy(mask),
        "positions": torch.from_numpy(positions),
        "head_rows": torch.from_numpy(np.concatenate(head_rows)),
        "stop_rows": torch.from_numpy(np.concatenate(stop_rows)),
        "stop_labels": torch.from_numpy(np.concatenate(stop_labels)),
        "ref_codes": None,
        "ref_mask": None,
        "align_rows": torch.from_numpy(align_rows),
        "align_row_len": torch.tensor([u.codes.shape[0] for u, _, _ in examples]),
        "align_cols": torch.from_numpy(align_cols),
        "align_col_len": torch.tensor([len(u.tokens) for u, _, _ in examples]),
    }
    if refs:
        batch["ref_codes"] = torch.nn.utils.rnn.pad_sequence(refs, batch_first=True)
        lengths = torch.tensor([r.shape[0] for r in refs])
        batch["ref_mask"] = torch.arange(batch["ref_codes"].shape[1])[None, :] < lengths[:, None]
    return batch


def noisy_frames(frames, levels, p):
    """frames [M, 32] with each code moved one level up or down (within its channel's levels) with
    probability p. Teacher forcing reads only true frames, generation reads the model's own, whose
    codes are often a level off (greedy agrees with the true code ~77 % of the time): a model that
    never read such errors leans on copying the frames before, and its speech drifts from the text."""
    if p <= 0:
        return frames
    top = torch.tensor(levels, device=frames.device) - 1
    step = torch.where(torch.rand(frames.shape, device=frames.device) < 0.5, -1, 1)
    moved = (frames + step).clamp(min=0)
    moved = torch.minimum(moved, top)
    moved = torch.where(moved == frames, frames - step, moved)  # at an edge: the other neighbour
    return torch.where(torch.rand(frames.shape, device=frames.device) < p, moved, frames)


def own_frames(frames, predicted, p):
    """frames [M, 32] with each whole frame replaced, with probability p, by predicted [M, 32]: the
    model's own argmax prediction of that frame from the true frames before it (scheduled sampling,
    one step deep). Generation reads only its own frames; a model that never read them leans on
    copying the frames before, and its speech drifts from the text at once."""
    if p <= 0:
        return frames
    chosen = torch.rand(frames.shape[0], 1, device=frames.device) < p
    return torch.where(chosen, predicted, frames)


def blanked_frames(count, p, device):
    """[count] bool: which read frames are blanked (their embedding zeroed), each with probability p.
    A frame the model cannot read must be predicted from the text; a model that can always read
    the frame before learns to continue it and speaks novel text as it spoke its training text (the
    information bottleneck that Tacotron's pre-net dropout makes)."""
    return torch.rand(count, device=device) < p


def batch_loss(model, batch, stop_weight=1.0, stop_pos_weight=1.0, align_weight=0.0, align_layers=(),
               frame_noise=0.0, own_frame_share=0.0, frame_blank=0.0):
    """Teacher-forced losses: {"loss" (the total), "ce" (mean channel CE), "stop" (BCE),
    "accuracy" (heads), "align" (alignment_loss averaged over align_layers, when align_weight > 0)}.
    The alignment loss needs a model built with ALIGN_ATTENTION. frame_noise: see noisy_frames;
    own_frame_share: see own_frames (its predictions come from a first pass without gradients);
    frame_blank: see blanked_frames."""
    h = model.config.hidden_size
    frames = batch["frames"].long()

    # the source rows before the frames' (prefixes, null prefix, text), the same in both passes
    parts = []
    if batch["ref_codes"] is not None:
        parts.append(model.ref_compressor(batch["ref_codes"], batch["ref_mask"]).reshape(-1, h).float())
    parts.append(model.null_prefix.float())
    parts.append(model.model.embed_tokens(batch["text_ids"]).float())

    def backbone(read_frames, blank=None):
        embedded = model.embed_frames(read_frames).float()
        if blank is not None:
            embedded = embedded.masked_fill(blank[:, None], 0.0)
        zero = torch.zeros(1, h, device=batch["index"].device)
        inputs = torch.cat(parts + [embedded, zero])[batch["index"]]
        return model.model(inputs_embeds=inputs, attention_mask=batch["mask"], position_ids=batch["positions"],
                           use_cache=False).last_hidden_state.reshape(-1, h)

    read = frames
    if own_frame_share > 0:
        with torch.no_grad():
            predicted = model.head_logits(backbone(frames)[batch["head_rows"]]).argmax(-1)
        read = own_frames(frames, predicted, own_frame_share)
    read = noisy_frames(read, model.head_levels, frame_noise)
    blank = blanked_frames(frames.shape[0], frame_blank, frames.device) if frame_blank > 0 else None

    attentions = [model.model.layers[i].self_attn for i in align_layers] if align_weight > 0 else []
    if attentions and model.config._attn_implementation != ALIGN_ATTENTION:
        raise ValueError(f"the alignment loss needs a model built with {ALIGN_ATTENTION!r}")
    request = {"rows": batch["align_rows"], "row_len": batch["align_row_len"], "cols": batch["align_cols"],
               "col_len": batch["align_col_len"], "heads": align_heads(model.config)}
    for attention in attentions:
        attention.align_request, attention.align_value = request, None
    try:
        hidden = backbone(read, blank)
    finally:
        values = [attention.align_value for attention in attentions]
        for attention in attentions:
            attention.align_request, attention.align_value = None, None

    logits = model.head_logits(hidden[batch["head_rows"]])  # [M, 32, L]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), frames.reshape(-1))
    accuracy = (logits.argmax(-1) == frames).float().mean()
    stop_logits = model.stop_head(hidden[batch["stop_rows"]])[:, 0].float()
    pos_weight = torch.tensor(stop_pos_weight, device=stop_logits.device)
    stop = F.binary_cross_entropy_with_logits(stop_logits, batch["stop_labels"], pos_weight=pos_weight)
    loss = ce + stop_weight * stop
    if values:
        align = torch.stack(values).mean()
        loss = loss + align_weight * align
    else:
        align = torch.zeros((), device=loss.device)
    return {"loss": loss, "ce": ce, "stop": stop, "accuracy": accuracy, "align": align}


def to_device(batch, device):
    return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}


# ---- checkpoints ---------------------------------------------------------------------------------

COMPILE_CACHE = "compile-cache"


class CompileCache:
    """torch.compile's work for one kind of device (traced graphs, generated kernels) kept in
    RUN/compile-cache/DEVICE.bin: loaded before the first compile and saved with every checkpoint,
    so that the run, resumed on a fresh machine of the same kind, takes its kernels from the file
    instead of compiling them again. A file that does not load is reported and compiled afresh."""

    def __init__(self, run_dir, device):
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        self.path = pathlib.Path(run_dir) / COMPILE_CACHE / (re.sub(r"[^A-Za-z0-9.]+", "-", name) + ".bin")

    def load(self):
        if not self.path.exists():
            return
        info = torch.compiler.load_cache_artifacts(self.path.read_bytes())
        if info is None:
            print(f"compile cache {self.path} did not load (another torch?): compiling afresh", flush=True)
        else:
            print(f"compile cache: {sum(map(len, info.artifacts.values()))} artifacts from {self.path}", flush=True)

    def save(self):
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:  # nothing compiled yet
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        partial.write_bytes(saved[0])
        os.replace(partial, self.path)

    @staticmethod
    def counts():
        """(graphs taken from a cache, graphs compiled) by this process so far."""
        from torch._dynamo.utils import counters
        return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]


def save_checkpoint(run_dir, model, optimizer, state):
    """RUN/checkpoint/: state.json + bf16 shards (≤ SHARD_BYTES each), replaced atomically."""
    names = {p: n for n, p in model.named_parameters()}
    tensors = {}
    for name, tensor in model.state_dict().items():
        tensors["model/" + name] = tensor.detach().to(torch.bfloat16).cpu()
    for p, s in optimizer.state.items():
        name = names[p]
        tensors["exp_avg/" + name] = s["exp_avg"].to(torch.bfloat16).cpu()
        tensors["exp_avg_sq/" + name] = s["exp_avg_sq"].to(torch.bfloat16).cpu()
        tensors["step/" + name] = torch.as_tensor(s["step"], dtype=torch.float32).reshape(1).cpu()
    write_checkpoint(run_dir, tensors, state)


def write_checkpoint(run_dir, tensors, state):
    """RUN/checkpoint/ holding ``tensors`` in shards and ``state``, replaced atomically."""
    from safetensors.torch import save_file

    shards, current, size = [], {}, 0
    for key in sorted(tensors):
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[key] = tensors[key].contiguous()
        size += nbytes
    shards.append(current)

    final = pathlib.Path(run_dir) / CHECKPOINT
    tmp = pathlib.Path(run_dir) / (CHECKPOINT + ".tmp")
    old = pathlib.Path(run_dir) / (CHECKPOINT + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = []
    for i, shard in enumerate(shards):
        name = f"state-{i + 1:02d}-of-{len(shards):02d}.safetensors"
        save_file(shard, str(tmp / name), metadata={"format": "pt"})
        os.chmod(tmp / name, 0o644)
        files.append(name)
    with open(tmp / "state.json", "w", encoding="utf-8") as f:
        json.dump(dict(state, files=files), f, indent=2)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def read_checkpoint(run_dir):
    """(state dict from state.json, {name: tensor}) of RUN/checkpoint, or None if there is none."""
    from safetensors.torch import load_file

    path = pathlib.Path(run_dir) / CHECKPOINT
    if not (path / "state.json").exists():
        return None
    with open(path / "state.json", encoding="utf-8") as f:
        state = json.load(f)
    tensors = {}
    for name in state["files"]:
        tensors.update(load_file(str(path / name)))
    return state, tensors


def read_run_checkpoint(run_dir):
    """read_checkpoint of a run that must have one: exits with a message where there is none."""
    restored = read_checkpoint(run_dir)
    if restored is None:
        raise SystemExit(f"{run_dir} has no {CHECKPOINT}/")
    return restored


def load_model_weights(model, tensors, prefix=""):
    own = model.state_dict()
    weights = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    if missing or unexpected:
        raise SystemExit(f"checkpoint does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.load_state_dict({k: v.to(own[k].dtype).reshape(own[k].shape) for k, v in weights.items()})


def restore_optimizer(optimizer, model, tensors, device):
    # fused AdamW keeps its step counts on the parameters' device, the others on the CPU
    step_device = device if optimizer.defaults.get("fused") else "cpu"
    for name, p in model.named_parameters():
        if "exp_avg/" + name not in tensors:
            continue
        optimizer.state[p] = {
            "step": tensors["step/" + name].reshape(()).to(step_device, torch.float32),
            "exp_avg": tensors["exp_avg/" + name].to(device, torch.float32),
            "exp_avg_sq": tensors["exp_avg_sq/" + name].to(device, torch.float32),
        }


def deepen(spec, tensors, layers):
    """``tensors`` (a checkpoint's "model/…" weights) of a backbone ``layers`` deep, grown from the
    shallower one of ``spec`` (updated in place) so that it computes the same: new layer n is a copy
    of old layer n * old // layers (each layer doubled, for twice the layers), its first copy as it
    was, the later ones with their residual outputs (attention's o_proj, the MLP's down_proj)
    zeroed, so that they add nothing until training moves them. The AdamW moments are left out:
    they start afresh."""
    old = spec["shape"]["num_hidden_layers"]
    if layers <= old:
        raise SystemExit(f"--num-hidden-layers {layers}: a resumed run of {old} layers can only grow deeper")
    prefix = "model/model.layers."
    grown = {k: v for k, v in tensors.items() if k.startswith("model/") and not k.startswith(prefix)}
    for new in range(layers):
        source = new * old // layers
        first = new == 0 or (new - 1) * old // layers != source
        for key, value in tensors.items():
            if not key.startswith(f"{prefix}{source}."):
                continue
            name = key[len(f"{prefix}{source}."):]
            zeroed = not first and name in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
            grown[f"{prefix}{new}.{name}"] = torch.zeros_like(value) if zeroed else value.clone()
    spec["shape"] = dict(spec["shape"], num_hidden_layers=layers)
    spec["backbone"] = dict(spec["backbone"], num_hidden_layers=layers, layer_types=["full_attention"] * layers)
    return grown


def build_model(spec, attn_implementation="sdpa"):
    """The model described by a checkpoint spec (state.json's "model")."""
    return GepardLM(spec["backbone"], spec["head_levels"], spec["shape"]["audio_embed_dim"],
                    spec["shape"]["compressor_heads"], spec["shape"]["compressor_ffn_multiplier"],
                    attn_implementation)


def make_optimizer(model, lr, weight_decay, betas, fused=False):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        # matrices decay; norms, biases, scalars, embeddings, queries and the null prefix do not
        if p.ndim == 2 and "embed" not in name and name not in ("null_prefix", "ref_compressor.queries"):
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)


def learning_rate(step, peak, warmup, progress, floor=0.1):
    """Linear warmup over ``warmup`` steps, then cosine decay to ``floor``·peak as progress goes 0 → 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, max(0.0, progress))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def cooldown_factor(remaining, cooldown):
    """What the learning rate is multiplied by with ``remaining`` of the plan left (minutes or steps):
    1 until the last ``cooldown`` of it, then falling linearly towards 0 at its end, so that a run
    trained on long at its floor rate ends on weights that rate's noise does not blur."""
    if cooldown <= 0:
        return 1.0
    return min(1.0, max(0.0, remaining / cooldown))


# ---- train ---------------------------------------------------------------------------------------

def cmd_train(args):
    started = time.time()
    run_dir = pathlib.Path(args.run)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    bf16 = device.type == "cuda" and args.precision == "bf16"
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    restored = read_checkpoint(run_dir)
    if restored is not None and not args.resume:
        raise SystemExit(f"{run_dir}/{CHECKPOINT} exists: pass --resume to continue it, or pick another --run")
    tokenizer_path = run_dir / "tokenizer.json"
    if args.tokenizer and pathlib.Path(args.tokenizer).resolve() != tokenizer_path.resolve():
        if restored is not None and tokenizer_path.exists() and \
                tokenizer_path.read_bytes() != pathlib.Path(args.tokenizer).read_bytes():
            raise SystemExit(f"--tokenizer differs from {tokenizer_path}, which this run was trained with")
        shutil.copyfile(args.tokenizer, tokenizer_path)
    if not tokenizer_path.exists():
        raise SystemExit(f"no tokenizer: give --tokenizer or put it at {tokenizer_path}")
    special = tokenizer_special_ids(tokenizer_path)

    if restored is not None:
        state, tensors = restored
        spec, hp = state["model"], state["train"]
        print(f"resuming {run_dir} at step {state['step']}", flush=True)
        for key, value in spec["shape"].items():
            given = getattr(args, key, None)
            if given is None or given == value or key == "num_hidden_layers":
                continue
            raise SystemExit(f"--{key.replace('_', '-')} {given}: a resumed run keeps its shape ({key} {value}); "
                             "only --num-hidden-layers may deepen it")
        if args.num_hidden_layers not in (None, spec["shape"]["num_hidden_layers"]):
            print(f"deepened from {spec['shape']['num_hidden_layers']} to {args.num_hidden_layers} layers "
                  "(each layer's later copies add nothing at first)", flush=True)
            tensors = deepen(spec, tensors, args.num_hidden_layers)
    else:
        state, tensors = None, None
        shape = dict(PRESETS[args.preset])
        for key in shape:
            value = getattr(args, key, None)
            if value is not None:
                shape[key] = value
        vocab_size = (special["tokeniser_length"] + 63) // 64 * 64
        levels, _ = load_codes(args.data)
        spec = {"shape": shape, "backbone": backbone_dict(shape, vocab_size, special),
                "head_levels": levels, "special": special}
        hp = {k: getattr(args, k) for k in ("weight_decay", "max_frames", "seed", "valid_count",
                                            "stop_pos_weight", "p_default_none", "p_null")}
        hp.update({k: v if getattr(args, k) is None else getattr(args, k) for k, v in BATCH_DEFAULTS.items()})
        hp["steps"] = args.steps if args.steps is not None else DEFAULT_STEPS
        hp["minutes"] = args.minutes
        hp["exclude_speakers"] = list(args.exclude_speaker or [])
        hp["default_speaker"] = args.default_speaker
    if args.steps is not None and restored is not None:
        hp["steps"] = args.steps  # a resumed run may be given a new end
    if args.minutes is not None and restored is not None:
        hp["minutes"] = args.minutes
    if restored is not None:
        for k, v in BATCH_DEFAULTS.items():
            hp.setdefault(k, v)  # a run from before the option
        # a resumed run may go on with other batches, learning rate or alignment loss
        changed = {k: getattr(args, k) for k in BATCH_DEFAULTS if getattr(args, k) not in (None, hp[k])}
        if changed:
            print("resumed with " + ", ".join(f"{k} {hp[k]} → {v}" for k, v in changed.items()), flush=True)
            hp.update(changed)

    levels, records = load_codes(args.data)
    utterances, skipped = prepare_utterances(records, levels, tokenizer_path, special, hp["max_frames"],
                                             set(hp["exclude_speakers"]), hp["bpe_dropout"])
    if not utterances:
        raise SystemExit(f"{args.data}: no usable utterances")
    train_set, valid_set = split_validation(utterances, min(hp["valid_count"], len(utterances) // 10),
                                            hp["seed"])
    if hp["default_speaker"] is None:
        hp["default_speaker"] = default_speaker_of(train_set)
    plan = VoicePlan(train_set, hp["default_speaker"], hp["p_default_none"], hp["p_null"])
    valid_plan = VoicePlan(utterances, hp["default_speaker"], hp["p_default_none"], hp["p_null"])

    align_layers = align_layer_indices(spec["shape"], hp["align_layers"]) if hp["align_weight"] > 0 else []
    if align_layers and hp["text_dropout"] > 0:
        raise SystemExit("--text-dropout and --align-weight do not go together: the alignment loss needs "
                         "every example's text")
    if align_layers:
        register_align_attention()
    torch.manual_seed(hp["seed"])
    model = build_model(spec, ALIGN_ATTENTION if align_layers else "sdpa").to(device)
    optimizer = make_optimizer(model, hp["lr"], hp["weight_decay"], (0.9, 0.95), device.type == "cuda")
    step, epoch, batch_in_epoch, trained_s = 0, 0, 0, 0.0
    rewarm_from = None  # a slimmed checkpoint (no AdamW moments): the learning rate warms up again
    if restored is not None:
        load_model_weights(model, tensors, "model/")
        restore_optimizer(optimizer, model, tensors, device)
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        trained_s = state.get("trained_s", 0.0)
        if not any(k.startswith("exp_avg/") for k in tensors):
            rewarm_from = step
            print(f"no AdamW moments in the checkpoint: they start afresh, the learning rate warms up "
                  f"again over {hp['warmup']} steps", flush=True)
        del tensors

    compile_cache = None
    if args.compile:
        compile_cache = CompileCache(run_dir, device)
        compile_cache.load()
        # each decoder layer in place, not the backbone as one graph: the layers run one code, so
        # dynamo compiles it once for them all and compiling takes as long at any depth (the
        # state dict keeps its names; shapes vary from batch to batch)
        for layer in model.model.layers:
            layer.compile(dynamic=True)
    n_params = count_parameters(model)
    frames_total = sum(u.codes.shape[0] for u in train_set)
    print(f"model: {n_params / 1e6:.2f} M parameters ({n_params * 2 / 2**20:.1f} MiB in bf16); "
          f"{len(train_set)} training utterances ({frames_total / 21.5 / 3600:.2f} h), "
          f"{len(valid_set)} validation, {skipped} skipped; speakers "
          f"{len(plan.by_speaker)}, default speaker {hp['default_speaker']!r}; device {device}", flush=True)

    def snapshot():
        return {"step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch, "trained_s": trained_s,
                "model": spec, "train": hp, "parameters": n_params}

    valid_batches = make_batches(valid_set, hp["max_tokens"], hp["max_batch"], hp["seed"]) if valid_set else []

    position = {id(u): j for j, u in enumerate(utterances)}

    def validate():
        """(loss, CE, stop BCE, CE with each utterance given another's text, CE with the empty
        text): the gap between the first two CEs is what the text is worth to the model, near 0
        until it has learned to follow it; the last is text-CFG's unconditional branch (with
        --text-dropout only, else None)."""
        model.eval()
        rng = random.Random(hp["seed"])
        total, ce_sum, stop_sum, n = 0.0, 0.0, 0.0, 0
        other_sum, n_other, empty_sum = 0.0, 0, 0.0
        empty_ids = text_layout([], special)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            for indices in valid_batches:
                examples = []
                for i in indices:
                    u = valid_set[i]
                    mode, ref = valid_plan.choose(position[id(u)], u, utterances, rng)
                    examples.append((u, mode, ref))
                batch = to_device(collate(examples, COMPRESSOR_QUERIES), device)
                r = batch_loss(model, batch, 1.0, hp["stop_pos_weight"], hp["align_weight"], align_layers)
                total, ce_sum, stop_sum, n = (total + float(r["loss"]), ce_sum + float(r["ce"]),
                                              stop_sum + float(r["stop"]), n + 1)
                if len(examples) > 1:
                    texts = [u for u, _, _ in examples[1:] + examples[:1]]
                    swapped = [(Utterance(u.id, u.speaker, t.tokens, t.ids, u.codes), mode, ref)
                               for (u, mode, ref), t in zip(examples, texts)]
                    r = batch_loss(model, to_device(collate(swapped, COMPRESSOR_QUERIES), device),
                                   1.0, hp["stop_pos_weight"])
                    other_sum, n_other = other_sum + float(r["ce"]), n_other + 1
                if hp["text_dropout"] > 0:
                    unread = [(u.unread(empty_ids), mode, ref) for u, mode, ref in examples]
                    r = batch_loss(model, to_device(collate(unread, COMPRESSOR_QUERIES), device),
                                   1.0, hp["stop_pos_weight"])
                    empty_sum += float(r["ce"])
        model.train()
        if not n:
            return None
        return (total / n, ce_sum / n, stop_sum / n, (other_sum / n_other if n_other else None),
                (empty_sum / n if hp["text_dropout"] > 0 else None))

    log_path = run_dir / "train.log"
    last_save, saved_step = time.time(), (step if restored is not None else None)
    model.train()
    feeder = training_batches(TrainingBatches(train_set, plan, hp, step, epoch, batch_in_epoch,
                                              text_layout([], special)),
                              args.prefetch if args.prefetch is not None else (4 if device.type == "cuda" else 0),
                              pin=device.type == "cuda")

    def fresh_window():
        """The sums behind one train.log record."""
        return {"loss": 0.0, "ce": 0.0, "stop": 0.0, "accuracy": 0.0, "align": 0.0, "n": 0, "frames": 0,
                "t": time.time()}

    window = fresh_window()
    finished = diverged = False
    trained_before, loop_start = trained_s, time.time()

    # --profile-steps: torch.profiler over that many steps, once 20 of this run's have warmed up
    profile_at, profiler = (step + 20, None) if args.profile_steps else (None, None)
    phase = torch.profiler.record_function

    def progress():
        """How far the plan is: by training time when it is in minutes, by steps otherwise."""
        if hp.get("minutes"):
            return trained_s / (hp["minutes"] * 60)
        return (step - hp["warmup"]) / max(1, hp["steps"] - hp["warmup"])

    while True:
        trained_s = trained_before + time.time() - loop_start
        if (step >= hp["steps"] and not hp.get("minutes")) or (hp.get("minutes") and progress() >= 1.0):
            finished = True
            break
        if args.time_limit and time.time() - started > args.time_limit * 60:
            break
        if step == profile_at:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            profiler = torch.profiler.profile(activities=activities)
            profiler.__enter__()
        with phase("data"):
            fed_step, epoch, batch_in_epoch, batch = next(feeder)
            assert fed_step == step, (fed_step, step)
            batch = to_device(batch, device)

        lr = learning_rate(step, hp["lr"], hp["warmup"], progress())
        lr *= cooldown_factor(hp["minutes"] - trained_s / 60 if hp.get("minutes") else hp["steps"] - step,
                              hp["cooldown"])
        if rewarm_from is not None:
            lr *= min(1.0, (step - rewarm_from + 1) / hp["warmup"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        with phase("forward"), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            losses = batch_loss(model, batch, 1.0, hp["stop_pos_weight"], hp["align_weight"], align_layers,
                                hp["frame_noise"], hp["own_frames"], hp["frame_blank"])
        with phase("backward"):
            optimizer.zero_grad(set_to_none=True)
            losses["loss"].backward()
        with phase("optimizer"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        step += 1
        batch_in_epoch += 1
        if profiler is not None and step == profile_at + args.profile_steps:
            profiler.__exit__(None, None, None)
            print(f"profile of steps {profile_at + 1}-{step}:", flush=True)
            print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), flush=True)
            profiler = None

        for key in ("loss", "ce", "stop", "accuracy", "align"):
            window[key] += losses[key].detach()
        window["n"] += 1
        window["frames"] += int(batch["frames"].shape[0])
        if step % args.log_every == 0 or step == hp["steps"]:
            n, dt = window["n"], time.time() - window["t"]
            record = {"step": step, "epoch": epoch, "lr": lr, "loss": float(window["loss"]) / n,
                      "ce": float(window["ce"]) / n, "stop": float(window["stop"]) / n,
                      "accuracy": float(window["accuracy"]) / n,
                      **({"align": float(window["align"]) / n} if align_layers else {}),
                      "frames_per_s": window["frames"] / max(dt, 1e-9), "elapsed_s": time.time() - started}
            if args.eval_every and step % args.eval_every == 0 and valid_batches:
                v = validate()
                record.update(valid_loss=v[0], valid_ce=v[1], valid_stop=v[2], valid_ce_other_text=v[3])
                if v[4] is not None:
                    record.update(valid_ce_empty_text=v[4])
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()),
                  flush=True)
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            window = fresh_window()
            if not math.isfinite(record["loss"]):
                diverged = True
                break
        if args.save_every and time.time() - last_save > args.save_every * 60:
            save_checkpoint(run_dir, model, optimizer, snapshot())
            if compile_cache:
                compile_cache.save()
            last_save, saved_step = time.time(), step

    del feeder  # its worker stops
    if diverged:
        # a learning rate too high for the model's size, say: the weights are lost, and the
        # checkpoint saved before stays as it is
        kept = "none was saved" if saved_step is None else f"{run_dir / CHECKPOINT} keeps step {saved_step}"
        print(f"the loss is not finite at step {step}: stopped without saving the checkpoint ({kept}); "
              f"try a lower --lr", file=sys.stderr, flush=True)
        return 1
    save_checkpoint(run_dir, model, optimizer, snapshot())
    if compile_cache:
        compile_cache.save()
        print("compile: {} graphs from the cache, {} compiled".format(*CompileCache.counts()), flush=True)
    plan_text = f"{hp['minutes']:g} min" if hp.get("minutes") else f"{hp['steps']} steps"
    print(f"{'finished' if finished else 'stopped'} at step {step} ({trained_s / 60:.1f} min) of {plan_text}; "
          f"checkpoint in {run_dir / CHECKPOINT} ({time.time() - started:.0f} s)", flush=True)
    return 0


# ---- export --------------------------------------------------------------------------------------

def export_checkpoint(run_dir, out_dir, cfg_scale=1.0):
    """RUN/checkpoint → a published-layout checkpoint directory (§2.4), weights in bf16. A
    cfg_scale other than 1 is written as model.safetensors metadata "gepard.cfg_scale": the
    text-CFG scale (§3.4) the engine speaks the model with unless told otherwise."""
    from safetensors.torch import save_file

    state, tensors = read_run_checkpoint(run_dir)
    spec = state["model"]
    model = build_model(spec)
    load_model_weights(model, tensors, "model/")
    weights = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "pt"}
    if cfg_scale != 1.0:
        metadata["gepard.cfg_scale"] = f"{cfg_scale:g}"
    save_file(weights, str(out / "model.safetensors"), metadata=metadata)
    os.chmod(out / "model.safetensors", 0o644)
    backbone = spec["backbone"]
    with open(out / "config.json", "w", encoding="utf-8") as f:
        json.dump(backbone, f, indent=2)
        f.write("\n")
    with open(out / "gepard_config.json", "w", encoding="utf-8") as f:
        json.dump(gepard_dict(spec["shape"], backbone, spec["special"], spec["head_levels"]), f, indent=2)
        f.write("\n")
    shutil.copyfile(pathlib.Path(run_dir) / "tokenizer.json", out / "tokenizer.json")
    hp = state["train"]
    metadata = {"recipe": "tools/voice/lm.py", "step": state["step"], "parameters": state["parameters"],
                "default_speaker": hp.get("default_speaker"), "exclude_speakers": hp.get("exclude_speakers"),
                "default_voice": "no prefix (K = 0) speaks as default_speaker"}
    with open(out / "training_metadata.json", "w", encoding="utf-8") as f:
        json.dump(metadata, f, indent=2)
        f.write("\n")
    size = (out / "model.safetensors").stat().st_size
    print(f"{out}: {len(weights)} tensors, {state['parameters'] / 1e6:.2f} M parameters, "
          f"model.safetensors {size / 2**20:.1f} MiB (step {state['step']})")
    return out


def cmd_export(args):
    export_checkpoint(args.run, args.out_dir, args.cfg_scale)
    return 0


def copy_run_files(run_dir, out):
    """A run's tokenizer.json and train.log, where it has them, into the run directory OUT."""
    for name in ("tokenizer.json", "train.log"):
        if (pathlib.Path(run_dir) / name).exists():
            shutil.copyfile(pathlib.Path(run_dir) / name, pathlib.Path(out) / name)


def slim_checkpoint(run_dir, out_dir):
    """RUN/checkpoint without AdamW's moments (2 bytes a parameter instead of 6), into OUT with
    RUN's tokenizer.json and train.log: a run that carries across machines under a size limit.
    Resuming it continues from the same weights, step and data order; AdamW's moments start afresh
    (restore_optimizer leaves the parameters without them to the optimizer's first step)."""
    state, tensors = read_run_checkpoint(run_dir)
    out = pathlib.Path(out_dir)
    if out.resolve() == pathlib.Path(run_dir).resolve():
        raise SystemExit("slim writes a new run directory: give another OUT")
    out.mkdir(parents=True, exist_ok=True)
    write_checkpoint(out, {k: v for k, v in tensors.items() if k.startswith("model/")}, state)
    copy_run_files(run_dir, out)
    size = sum(f.stat().st_size for f in (out / CHECKPOINT).iterdir())
    print(f"{out}: step {state['step']}, weights only, {size / 2**20:.1f} MiB")
    return out


def cmd_slim(args):
    slim_checkpoint(args.run, args.out_run)
    return 0


def average_checkpoints(run_dirs, out_dir):
    """The mean of the weights of runs of one model (checkpoints of one training, at several steps),
    into OUT as a slimmed run of the last (its step, data order, tokenizer.json and train.log): a
    training long at a steady learning rate wanders about a minimum, and the mean of where it was
    lies nearer to it than any one of them."""
    if len(run_dirs) < 2:
        raise SystemExit("average needs two runs or more")
    out = pathlib.Path(out_dir)
    if any(out.resolve() == pathlib.Path(r).resolve() for r in run_dirs):
        raise SystemExit("average writes a new run directory: give another OUT")
    loaded = [read_run_checkpoint(run) for run in run_dirs]
    tokenizers = {(pathlib.Path(r) / "tokenizer.json").read_bytes() for r in run_dirs
                  if (pathlib.Path(r) / "tokenizer.json").exists()}
    if len(tokenizers) > 1:
        raise SystemExit("average: the runs have different tokenizers")
    state, last = loaded[-1]
    names = {k: v.shape for k, v in last.items() if k.startswith("model/")}
    for run, (_, tensors) in zip(run_dirs, loaded):
        shapes = {k: v.shape for k, v in tensors.items() if k.startswith("model/")}
        if shapes != names:
            raise SystemExit(f"average: {run} is not the same model as {run_dirs[-1]} (other weights or shapes)")
    mean = {k: (sum(t[k].float() for _, t in loaded) / len(loaded)).to(last[k].dtype) for k in names}
    out.mkdir(parents=True, exist_ok=True)
    write_checkpoint(out, mean, dict(state, averaged_steps=[s["step"] for s, _ in loaded]))
    copy_run_files(run_dirs[-1], out)
    print(f"{out}: the mean of steps {', '.join(str(s['step']) for s, _ in loaded)}, weights only")
    return out


def cmd_average(args):
    average_checkpoints(args.runs, args.out)
    return 0


# ---- sample --------------------------------------------------------------------------------------

def spec_from_export(model_dir):
    d = pathlib.Path(model_dir)
    with open(d / "gepard_config.json", encoding="utf-8") as f:
        gepard = json.load(f)
    with open(d / "config.json", encoding="utf-8") as f:
        backbone = json.load(f)
    compressor = gepard["voice_cloning"]["compressor"]
    shape = {"audio_embed_dim": gepard["audio_embed_dim"], "compressor_heads": compressor["num_heads"],
             "compressor_ffn_multiplier": compressor["ffn_hidden_size_multiplier"]}
    special = dict(gepard["special_tokens"])
    return {"shape": shape, "backbone": backbone, "head_levels": list(gepard["audio_heads"].values()),
            "special": special}


def load_for_inference(path, device):
    """A GepardLM in bf16 with eager attention (the runner's numerics, §1.4, §1.5) from an export
    directory or a run directory, and its special ids and tokenizer path."""
    from safetensors.torch import load_file

    path = pathlib.Path(path)
    if (path / "model.safetensors").exists():
        spec = spec_from_export(path)
        model = build_model(spec, "eager")
        load_model_weights(model, load_file(str(path / "model.safetensors")))
    else:
        restored = read_checkpoint(path)
        if restored is None:
            raise SystemExit(f"{path} is neither an exported model nor a run directory with a checkpoint")
        state, tensors = restored
        spec = state["model"]
        model = build_model(spec, "eager")
        load_model_weights(model, tensors, "model/")
    model.eval()
    # the runner's cast: parameters and buffers to bf16; inv_freq is bf16-valued already (§1.5)
    model.to(device, dtype=torch.bfloat16)
    return model, spec["special"], path / "tokenizer.json"


def pick_frame(model, logits, greedy, temperature, top_k, generator):
    """§3.4 per-head sampling on the heads' fp32-cast bf16 logits [32, L] (invalid levels at −1e9):
    ÷ temperature, top-k with ties, softmax."""
    if greedy:
        return logits.argmax(-1).tolist()
    if temperature != 1.0:
        logits = logits / temperature
    if top_k > 0:
        k = torch.tensor([min(top_k, level) for level in model.head_levels], device=logits.device)
        kth = torch.sort(logits, dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].tolist()


class Branch:
    """One sequence of the runner's schedule (§3.3): the prefill over [prefix | ids], then one
    cached decode step per frame fed back; `hidden` is its last position's hidden state."""

    def __init__(self, model, ids, prefix):
        self.model = model
        device = model.null_prefix.device
        embeds = model.model.embed_tokens(torch.tensor(ids, device=device))
        if prefix is not None:
            embeds = torch.cat([prefix.to(embeds.dtype), embeds])
        mask = torch.ones(1, embeds.shape[0], dtype=torch.long, device=device)
        out = model.model(inputs_embeds=embeds[None], attention_mask=mask, use_cache=True)
        self.cache, self.hidden = out.past_key_values, out.last_hidden_state[0, -1]

    def feed(self, frame):
        device = self.model.null_prefix.device
        e = self.model.embed_frames(torch.as_tensor([frame], dtype=torch.long, device=device))
        mask = torch.ones(1, self.cache.get_seq_length() + 1, dtype=torch.long, device=device)
        out = self.model.model(inputs_embeds=e[None], attention_mask=mask, past_key_values=self.cache,
                               use_cache=True)
        self.cache, self.hidden = out.past_key_values, out.last_hidden_state[0, -1]


class Runner:
    """The text's branch and, with cfg_scale ≠ 1, text-CFG's second branch over the empty text
    empty_ids and the same prefix (§3.4): the heads' logits are u + w·(c − u) before sampling, the
    stop decided on the text's branch, and both read the frame chosen."""

    def __init__(self, model, ids, prefix=None, cfg_scale=1.0, empty_ids=None):
        if cfg_scale != 1.0 and empty_ids is None:
            raise ValueError("text-CFG needs the empty text's ids")
        self.model, self.cfg_scale = model, cfg_scale
        self.branches = [Branch(model, ids, prefix)]
        if cfg_scale != 1.0:
            self.branches.append(Branch(model, empty_ids, prefix))

    def logits(self):
        """The heads' logits [32, max L] fp32 for the next frame."""
        c = self.model.head_logits(self.branches[0].hidden[None])[0]
        if len(self.branches) == 1:
            return c
        u = self.model.head_logits(self.branches[1].hidden[None])[0]
        return u + self.cfg_scale * (c - u)

    def stop_logit(self):
        return self.model.stop_head(self.branches[0].hidden)[0]

    def feed(self, frame):
        for branch in self.branches:
            branch.feed(frame)


@torch.no_grad()
def generate(model, ids, prefix=None, max_frames=2000, greedy=True, temperature=0.4, top_k=0, seed=0,
             cfg_scale=1.0, empty_ids=None):
    """§3.3/§3.4: prefill over [prefix | ids], frame 0 from the SOS position, then one cached decode
    step per frame with the stop check before each further frame; text-CFG with cfg_scale ≠ 1 (see
    Runner). → (frames [T, 32] int32, stopped)."""
    generator = torch.Generator().manual_seed(seed)
    runner = Runner(model, ids, prefix, cfg_scale, empty_ids)
    frames = [pick_frame(model, runner.logits(), greedy, temperature, top_k, generator)]
    stopped = False
    while len(frames) < max_frames:
        runner.feed(frames[-1])
        if float(torch.sigmoid(runner.stop_logit())) > STOP_THRESHOLD:  # bf16 sigmoid (§3.4)
            stopped = True
            break
        frames.append(pick_frame(model, runner.logits(), greedy, temperature, top_k, generator))
    return torch.tensor(frames, dtype=torch.int32), stopped


@torch.no_grad()
def forced_outputs(model, ids, prefix, frames, cfg_scale=1.0, empty_ids=None):
    """The runner's schedule with given frames [F, 32] (see Runner). → (head logits [F+1, 32, max L]
    fp32, stop logits [F+1] fp32); row j follows frames[:j]."""
    runner = Runner(model, ids, prefix, cfg_scale, empty_ids)
    logits, stops = [runner.logits()], [runner.stop_logit()]
    for frame in torch.as_tensor(frames, dtype=torch.long).tolist():
        runner.feed(frame)
        logits.append(runner.logits())
        stops.append(runner.stop_logit())
    return torch.stack(logits), torch.stack(stops).float()


def read_ref_codes(path, ref_id=None):
    """Reference codes [T, 32]: a safetensors file's "codes", or utterance ref_id of a codes.pt."""
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file
        return load_file(str(path))["codes"].long()
    _, records = load_codes(path)
    for r in records:
        if str(r["id"]) == str(ref_id):
            return torch.as_tensor(r["codes"]).long()
    raise SystemExit(f"{path} has no utterance {ref_id!r} (give --ref-id)")


def cmd_sample(args):
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, special, tokenizer_path = load_for_inference(args.model, device)
    if args.ids:
        ids = [int(x) for x in args.ids.replace(",", " ").split()]
    else:
        tokens = Tokenizer.from_file(str(tokenizer_path)).encode(args.text, add_special_tokens=False).ids
        ids = text_layout(tokens, special)
    prefix = None
    if args.prefix:
        from safetensors.torch import load_file
        prefix = load_file(args.prefix)["prefix"].to(device, torch.bfloat16)
    elif args.ref_codes:
        codes = read_ref_codes(args.ref_codes, args.ref_id).to(device)
        with torch.no_grad():
            prefix = model.ref_compressor(codes[None])[0]
    elif args.voice == "null":
        prefix = model.null_prefix
    frames, stopped = generate(model, ids, prefix, args.max_frames, args.greedy, args.temperature,
                               args.top_k, args.seed, args.cfg_scale, text_layout([], special))
    if args.output:
        # "frames" as gepard-inspect generate writes them, "codes" as gepard-codec-tool decode reads them
        save_file({"frames": frames.contiguous(), "codes": frames.clone()}, args.output)
    print(f"{len(ids)} ids, {'prefix of 8' if prefix is not None else 'no prefix'}: {frames.shape[0]} frames "
          f"({frames.shape[0] / 21.5:.2f} s), {'stopped' if stopped else 'hit --max-frames'}"
          + (f" → {args.output}" if args.output else ""))
    return 0


# ---- walk: where the aligned heads look -----------------------------------------------------------

@torch.no_grad()
def text_walk(model, ids, token_count, frames, layers):
    """For each layer and each head alignment_loss teaches: the last text block's token (0-based)
    that each frame's query attends to most, or −1 where under 10 % of its attention is on that
    text. The queries are those that predict frames 0 … F−1 (SOS, frames 0 … F−2). → {(layer,
    head): [F ints]}"""
    device = model.null_prefix.device
    embeds = torch.cat([model.model.embed_tokens(torch.tensor(ids, device=device)),
                        model.embed_frames(torch.as_tensor(frames, dtype=torch.long, device=device))])
    mask = torch.ones(1, embeds.shape[0], dtype=torch.long, device=device)
    out = model.model(inputs_embeds=embeds[None], attention_mask=mask, output_attentions=True)
    n, f = len(ids), len(frames)
    cols = list(last_block_columns(n, token_count))
    walks = {}
    for layer in layers:
        attention = out.attentions[layer][0].float()  # [H, N, N]
        for head in align_heads(model.config):
            text = attention[head, n - 1:n - 1 + f][:, cols]
            walks[layer, head] = torch.where(text.sum(-1) >= 0.1, text.argmax(-1), -1).tolist()
    return walks


def walk_summary(walk, token_count):
    """"last token at frame X of F (x %)" and the walk as one character per 2 frames."""
    reached = next((i for i, t in enumerate(walk) if t == token_count - 1), None)
    digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    strip = "".join("." if t < 0 else digits[min(t, len(digits) - 1)] for t in walk[::2])
    at = f"frame {reached} of {len(walk)} ({100 * reached / len(walk):.0f} %)" if reached is not None else "never"
    return f"last token at {at}: {strip}"


def cmd_walk(args):
    """Prints, per utterance, where the heads of the alignment loss look over the text, frame by
    frame: generated speech for each --text (greedy, default voice), or the codes of the default
    speaker's first --count utterances in --codes (teacher forced). A walk that lasts the utterance
    reaches the last token near its end; one that races reaches it after about k frames."""
    from tokenizers import Tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    model, special, tokenizer_path = load_for_inference(args.model, torch.device(args.device))
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    layers = align_layer_indices({"num_hidden_layers": model.config.num_hidden_layers}, args.align_layers or "")
    items = []
    for text in args.text or []:
        tokens = tokenizer.encode(text, add_special_tokens=False).ids
        ids = text_layout(tokens, special)
        frames, _ = generate(model, ids, None, args.max_frames, greedy=True)
        items.append((text, tokens, ids, frames))
    if args.codes:
        _, records = load_codes(args.codes)
        speaker = args.speaker or default_speaker_of(
            [Utterance(r["id"], r["speaker"], [], [], torch.as_tensor(r["codes"])) for r in records])
        for r in [r for r in records if r["speaker"] == speaker][:args.count]:
            tokens = tokenizer.encode(r["text"], add_special_tokens=False).ids
            items.append((r["text"], tokens, text_layout(tokens, special), torch.as_tensor(r["codes"])))
    for text, tokens, ids, frames in items:
        print(f"{text!r}: {len(tokens)} tokens, {len(frames)} frames")
        for (layer, head), walk in text_walk(model, ids, len(tokens), frames, layers).items():
            print(f"  layer {layer} head {head}: {walk_summary(walk, len(tokens))}")
    return 0


# ---- command line --------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train or resume (RUN/checkpoint/)")
    t.add_argument("--data", required=True, help="codes.pt from tools/voice/codec.py")
    t.add_argument("--run", required=True, help="run directory (checkpoint, tokenizer.json, train.log)")
    t.add_argument("--tokenizer", help="tokenizer.json from tools/voice/tokenizer.py (copied into RUN)")
    t.add_argument("--resume", action="store_true", help="continue RUN/checkpoint if there is one")
    t.add_argument("--preset", choices=sorted(PRESETS), default="default")
    for key in PRESETS["default"]:
        t.add_argument("--" + key.replace("_", "-"), dest=key, type=int,
                       help="override the preset" + ("; a resumed run given more layers is deepened, "
                                                     "computing the same at first (each layer doubled, "
                                                     "say)" if key == "num_hidden_layers" else ""))
    t.add_argument("--steps", type=int, default=None, help=f"optimizer steps in all (default {DEFAULT_STEPS})")
    t.add_argument("--minutes", type=float, default=None,
                   help="plan the whole training in minutes of training time instead of --steps")
    t.add_argument("--time-limit", type=float, default=0, help="save and stop after this many minutes")
    t.add_argument("--save-every", type=float, default=10, help="save every this many minutes (default 10)")
    t.add_argument("--lr", type=float, help=f"peak learning rate (default {BATCH_DEFAULTS['lr']:g})")
    t.add_argument("--warmup", type=int, help=f"warmup steps (default {BATCH_DEFAULTS['warmup']})")
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--max-tokens", type=int,
                   help=f"padded positions per batch (default {BATCH_DEFAULTS['max_tokens']})")
    t.add_argument("--max-batch", type=int, help=f"utterances per batch (default {BATCH_DEFAULTS['max_batch']})")
    t.add_argument("--align-weight", type=float,
                   help="weight of the alignment loss (default 0: off; see alignment_loss)")
    t.add_argument("--align-layers", help="the layers it teaches, e.g. \"1,2\" (default: all but the first)")
    t.add_argument("--text-gap", type=int,
                   help="move half the examples' frame positions on by up to this many past the text "
                        "(default 0: off; see collate)")
    t.add_argument("--frame-noise", type=float,
                   help="share of the read frames' codes moved a level (default 0: off; see noisy_frames)")
    t.add_argument("--own-frames", type=float,
                   help="share of the read frames replaced by the model's own predictions of them "
                        "(default 0: off; see own_frames)")
    t.add_argument("--bpe-dropout", type=float,
                   help="half the examples' texts tokenized with this BPE-dropout (default 0: off; see "
                        "bpe_dropout_variants)")
    t.add_argument("--text-dropout", type=float,
                   help="share of the examples that read the empty text, for text-CFG (default 0: off; see "
                        "training_examples)")
    t.add_argument("--frame-blank", type=float,
                   help="share of the read frames the model cannot see (default 0: off; see blanked_frames)")
    t.add_argument("--cooldown", type=float,
                   help="over the plan's last this many minutes (steps, planned in steps) the learning rate "
                        "falls linearly towards 0 (default 0: off; see cooldown_factor)")
    t.add_argument("--max-frames", type=int, default=600, help="skip longer utterances (frames)")
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--valid-count", type=int, default=64, help="utterances held back for validation loss")
    t.add_argument("--stop-pos-weight", type=float, default=1.0)
    t.add_argument("--p-default-none", type=float, default=0.5,
                   help="share of the default speaker's examples without a prefix")
    t.add_argument("--p-null", type=float, default=0.15, help="share of examples with the null prefix")
    t.add_argument("--default-speaker", help="the speaker of the default voice (default: most audio)")
    t.add_argument("--exclude-speaker", action="append", help="leave this speaker out (repeatable)")
    t.add_argument("--device", help="cuda or cpu (default: cuda if there is one)")
    t.add_argument("--precision", choices=("bf16", "fp32"), default="bf16", help="autocast on CUDA")
    t.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    t.add_argument("--prefetch", type=int,
                   help="batches built ahead in a worker process; 0 builds each in the loop "
                        "(default: 4 on CUDA, 0 on the CPU)")
    t.add_argument("--compile", action="store_true",
                   help="torch.compile the backbone's layers (fused kernels, fewer launches; compiling one layer "
                        "serves them all and takes a minute or two, or less on a machine whose kind of "
                        "device RUN/compile-cache has seen)")
    t.add_argument("--log-every", type=int, default=100)
    t.add_argument("--eval-every", type=int, default=1000)
    t.add_argument("--profile-steps", type=int, default=0,
                   help="profile this many steps (torch.profiler: CPU and CUDA time per operation and per "
                        "phase: data, forward, backward, optimizer) after 20 of this run, and print the table")

    e = sub.add_parser("export", help="write a published-layout checkpoint directory")
    e.add_argument("run", help="run directory")
    e.add_argument("out_dir")
    e.add_argument("--cfg-scale", type=float, default=1.0,
                   help="the text-CFG scale the engine is to speak the model with (model.safetensors "
                        "metadata gepard.cfg_scale; default 1: off, none written)")

    m = sub.add_parser("slim", help="copy a run with its checkpoint's weights only (resumable, a third the size)")
    m.add_argument("run", help="run directory")
    m.add_argument("out_run", help="the new run directory")

    a = sub.add_parser("average", help="a run whose weights are the mean of several runs' (one training's "
                                       "checkpoints)")
    a.add_argument("runs", nargs="+", help="run directories, the last one's step and state kept")
    a.add_argument("--out", required=True, help="the new run directory")

    s = sub.add_parser("sample", help="generate frames for a sentence (codes out)")
    s.add_argument("model", help="exported directory or run directory")
    s.add_argument("--text", help="the sentence")
    s.add_argument("--ids", help="laid-out ids instead of --text")
    s.add_argument("--voice", choices=("default", "null"), default="default",
                   help="default: no prefix (the engine's default voice); null: the null prefix")
    s.add_argument("--ref-codes", help="reference codes: safetensors with \"codes\" [T, 32], or codes.pt")
    s.add_argument("--ref-id", help="with a codes.pt --ref-codes: the utterance id")
    s.add_argument("--prefix", help="a given prefix: safetensors with \"prefix\" [K, H] (e.g. from "
                   "gepard-inspect lm), instead of computing one")
    s.add_argument("--greedy", action="store_true", help="argmax per head")
    s.add_argument("--temperature", type=float, default=0.4)
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--cfg-scale", type=float, default=1.0, help="text-CFG scale (§3.4; 1: off)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-frames", type=int, default=2000)
    s.add_argument("--output", help="safetensors file: \"frames\" (and the same as \"codes\") [T, 32] int32")
    s.add_argument("--device", default="cpu")
    s.add_argument("--threads", type=int, default=0)

    w = sub.add_parser("walk", help="where the alignment loss's heads look over the text, frame by frame")
    w.add_argument("model", help="exported directory or run directory")
    w.add_argument("--text", action="append", help="a sentence to generate (greedy) and walk (repeatable)")
    w.add_argument("--codes", help="codes.pt: walk the default speaker's utterances, teacher forced")
    w.add_argument("--speaker", help="with --codes: this speaker instead")
    w.add_argument("--count", type=int, default=4, help="with --codes: this many utterances")
    w.add_argument("--align-layers", help="the layers (default: all but the first)")
    w.add_argument("--max-frames", type=int, default=600)
    w.add_argument("--device", default="cpu")
    w.add_argument("--threads", type=int, default=0)

    args = parser.parse_args(argv)
    if args.command == "walk":
        if not args.text and not args.codes:
            parser.error("walk needs --text or --codes")
        return cmd_walk(args)
    if args.command == "train":
        return cmd_train(args)
    if args.command == "export":
        return cmd_export(args)
    if args.command == "slim":
        return cmd_slim(args)
    if args.command == "average":
        return cmd_average(args)
    if not args.text and not args.ids:
        parser.error("sample needs --text or --ids")
    return cmd_sample(args)


if __name__ == "__main__":
    sys.exit(main())
