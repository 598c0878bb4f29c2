"""PyTorch reference of GEPARD inference, the numerics the C backends are checked against.

Everything follows /work/shared/specs/gepard-model.md (cited as §n below):

* the backbone is transformers' own ``Qwen3_5TextModel`` (transformers 5.x), built in fp32 from the
  checkpoint's config.json with eager attention, loaded from the ``model.*`` tensors and then cast with
  ``.to(torch.bfloat16)`` as GEPARD's runner does, which also rounds the RoPE ``inv_freq`` buffer to
  bf16 (§1.5); ``inv_freq="f32"`` puts the fp32 frequencies back after the cast;
* the overlay (frame embedding §3.5, codebook and stop heads §3.4, reference compressor §3.6,
  null prefix §3.7) is written out below in plain torch, in bf16 like the runner;
* the schedule is the runner's: one prefill forward over ``[prefix | embed_tokens(ids)]``, then one
  cached decode step per frame (§3.3, §3.4).

Entry points: ``run_lm`` (forced frames, every intermediate tensor), ``generate_greedy`` (§3.3/§3.4
with argmax per head), ``text_layout`` / ``repetition_count`` / ``tokenize`` (§3.1).
"""

from __future__ import annotations

import json
import math
import os
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F

BF16 = torch.bfloat16
FSQ_LEVELS = (8, 7, 6, 6)  # §2.3: channel i has L_i = FSQ_LEVELS[i % 4]
STOP_THRESHOLD = 0.5  # §3.4; in bf16 this means stop ⇔ logit > 2⁻⁷

# The spec's R table (§3.1), n → R, used to check repetition_count().
SPEC_REPETITION_TABLE = {0: 1, 1: 8, 2: 8, 3: 6, 4: 4, 5: 4, 6: 3, 7: 3, 8: 2, 9: 2, 10: 2, 11: 2,
                         12: 2, 13: 1, 14: 1, 16: 1, 40: 1}


# ---- checkpoint files (§2.3, §2.4) -----------------------------------------------------------------

def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_tensors(checkpoint_dir):
    """All tensors of model.safetensors, or of the shards named by model.safetensors.index.json."""
    from safetensors import safe_open

    index_path = os.path.join(checkpoint_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        files = sorted(set(_read_json(index_path)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        with safe_open(os.path.join(checkpoint_dir, name), framework="pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    return tensors


class CheckpointConfig:
    """The numbers the reference needs from config.json and gepard_config.json."""

    def __init__(self, checkpoint_dir):
        self.backbone = _read_json(os.path.join(checkpoint_dir, "config.json"))
        self.gepard = _read_json(os.path.join(checkpoint_dir, "gepard_config.json"))
        b = self.backbone
        self.hidden_size = b["hidden_size"]
        heads = self.gepard.get("audio_heads")
        # §2.4: audio_heads is written unsorted, its order is the head wiring
        self.head_levels = list(heads.values()) if heads else [FSQ_LEVELS[i % 4] for i in range(32)]
        self.n_heads = len(self.head_levels)
        self.audio_embed_dim = self.gepard.get("audio_embed_dim", 32)
        compressor = self.gepard.get("voice_cloning", {}).get("compressor", {})
        self.compressor_heads = compressor.get("num_heads", 8)
        self.compressor_layers = compressor.get("num_layers", 2)
        self.compressor_queries = compressor.get("num_queries", 8)
        special = self.gepard.get("special_tokens", {})
        self.sot = special.get("start_of_text", 248073)
        self.eot = special.get("end_of_text", 248074)
        self.sos = special.get("start_of_speech", 248070)
        self.tokenizer_length = special.get("tokeniser_length")
        rep = self.gepard.get("text_repetition", {})
        self.repetition = {
            "enabled": rep.get("enabled", False),
            "target_text_tokens": rep.get("target_text_tokens", 16),
            "apply_below": rep.get("apply_below", 13),
            "max_repeats": rep.get("max_repeats", 8),
        }


# ---- text layout (§3.1) ----------------------------------------------------------------------------

def repetition_count(n, enabled=True, target_text_tokens=16, apply_below=13, max_repeats=8):
    """R for n text tokens: clamp(ceil(target / n), 1, max_repeats) for 1 ≤ n < apply_below, else 1."""
    if not enabled or n <= 0 or n >= apply_below or n >= target_text_tokens:
        return 1
    return max(1, min(-(-target_text_tokens // n), max_repeats))


def text_layout(tokens, sot, eot, sos, repetition=None):
    """``[SOT t… EOT] × (R−1) ++ [SOT t… EOT SOS]``; repetition: the gepard_config text_repetition."""
    rep = repetition or {}
    r = repetition_count(len(tokens), **rep) if rep else 1
    block = [sot, *tokens, eot]
    return block * (r - 1) + block + [sos]


def tokenize(checkpoint_dir, text):
    """Token ids of text through the checkpoint's tokenizer.json (no special tokens added, §3.1)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(checkpoint_dir, "tokenizer.json"))
    return tok.encode(text, add_special_tokens=False).ids


def layout_ids(checkpoint_dir, text):
    """The full prefill ids for text: tokenizer, repetition and special ids from the checkpoint."""
    cfg = CheckpointConfig(checkpoint_dir)
    return text_layout(tokenize(checkpoint_dir, text), cfg.sot, cfg.eot, cfg.sos, cfg.repetition)


# ---- the model ---------------------------------------------------------------------------------------

def _linear(x, weight, bias=None, f32_gemm=False):
    """bf16 Linear. f32_gemm: bf16 operands widened to fp32, an fp32 GEMM (bias added in fp32) and one
    rounding to bf16: the C CPU backend's scheme, with another summation order than torch's kernels."""
    if not f32_gemm:
        return F.linear(x, weight, bias)
    y = torch.matmul(x.float(), weight.float().transpose(0, 1))
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _matmul(a, b, f32_gemm=False):
    if not f32_gemm:
        return torch.matmul(a, b)
    return torch.matmul(a.float(), b.float()).to(a.dtype)


def _compressor_rmsnorm(x, weight, eps=1e-6):
    """§3.6 step 6: the compressor's own variant, rounded to bf16 before the (second) weight multiply."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y * weight


def sinusoidal_positions(length, d_model):
    """§3.6 step 3: PE[t, 2i] = sin(t·ω_i), PE[t, 2i+1] = cos(t·ω_i), ω_i = exp(2i·(−ln 10000 / d)),
    all in fp32 (the scalar −ln(10000)/d is a Python double that torch applies as fp32)."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    omega = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(length, d_model, dtype=torch.float32)
    pe[:, 0::2] = torch.sin(position * omega)
    pe[:, 1::2] = torch.cos(position * omega)
    return pe


def dequantize_codes(codes, head_levels):
    """§3.6 step 1: v = (c − s)/s with s = floor(L/2), in fp32, then bf16. codes [..., 32] int."""
    s = torch.tensor([L // 2 for L in head_levels], dtype=torch.float32, device=codes.device)
    return ((codes.float() - s) / s).to(BF16)


class GepardReference:
    """One checkpoint on one device, in bf16, ready to run the runner's schedule."""

    def __init__(self, checkpoint_dir, device="cpu"):
        from transformers.initialization import no_init_weights
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel

        self.checkpoint_dir = checkpoint_dir
        self.device = torch.device(device)
        if self.device.type == "cuda":
            # fp32 accumulation in every bf16 GEMM (§1.9), as the C backends do: no split-K
            # reductions in bf16, no TF32 for the fp32 ones
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
            torch.backends.cuda.matmul.allow_tf32 = False
        self.cfg = CheckpointConfig(checkpoint_dir)
        tensors = load_tensors(checkpoint_dir)

        # Backbone: transformers reads the nested rope_parameters.partial_rotary_factor (§1.5).
        config = Qwen3_5TextConfig.from_dict(dict(self.cfg.backbone))
        config._attn_implementation = "eager"  # the runner's default; sdpa differs (§1.4)
        self.backbone_config = config
        with no_init_weights():  # every parameter is loaded below; random init would only cost time
            model = Qwen3_5TextModel(config)
        state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        # load_state_dict copies into the fp32 parameters (bf16 → fp32 is exact), strict: every
        # backbone tensor must be there and nothing else under model.*
        model.load_state_dict(state, strict=True)
        model.eval()
        # exactly the runner's cast: parameters and buffers (inv_freq included) to bf16 (§1.5)
        model.to(self.device, dtype=BF16)
        self.model = model
        self.inv_freq_bf16 = model.rotary_emb.inv_freq.clone()
        inv_freq_f32, _ = model.rotary_emb.compute_default_rope_parameters(config)
        self.inv_freq_f32 = inv_freq_f32.to(self.device, torch.float32)
        self.inv_freq_mode = "bf16"
        self.f32_gemm = False  # see _linear; True only for estimating a port's expected deviation

        # Overlay: every float tensor cast to bf16 like model.to(bf16) does (round to nearest even).
        def w(name):
            return tensors[name].to(self.device, dtype=BF16)

        cfg = self.cfg
        self.audio_embeddings = [w(f"audio_embeddings.{i}.weight") for i in range(cfg.n_heads)]
        self.embed_proj = (w("audio_embed_proj.0.weight"), w("audio_embed_proj.0.bias"),
                           w("audio_embed_proj.2.weight"), w("audio_embed_proj.2.bias"))
        self.audio_embed_scale = w("audio_embed_scale").reshape(())  # [1] or 0-dim (§2.3)
        self.heads = [(w(f"codebook_heads.{i}.weight"), w(f"codebook_heads.{i}.bias"))
                      for i in range(cfg.n_heads)]
        self.stop_head = (w("stop_head.weight"), w("stop_head.bias"))
        self.null_prefix = w("null_prefix") if "null_prefix" in tensors else None
        self.has_compressor = "ref_compressor.queries" in tensors
        if self.has_compressor:
            c = {k[len("ref_compressor."):]: w(k) for k in tensors if k.startswith("ref_compressor.")}
            c["output_scale"] = c["output_scale"].reshape(())
            self.compressor = c
            # built in fp32 on the CPU when the module is made, cast with the model (§3.6 step 3)
            self._pe = sinusoidal_positions(2048, cfg.hidden_size).to(self.device, BF16)

    # -- RoPE frequencies --------------------------------------------------------------------------
    def set_inv_freq(self, mode):
        """"bf16": as GepardRunner has it after .to(bf16); "f32": from_pretrained/training/vLLM."""
        if mode not in ("bf16", "f32"):
            raise ValueError(f"inv_freq must be 'bf16' or 'f32', not {mode!r}")
        rotary = self.model.rotary_emb
        rotary.inv_freq = (self.inv_freq_bf16 if mode == "bf16" else self.inv_freq_f32).clone()
        self.inv_freq_mode = mode

    def linear(self, x, weight, bias=None):
        return _linear(x, weight, bias, self.f32_gemm)

    # -- overlay -----------------------------------------------------------------------------------
    def _tensor_codes(self, codes):
        t = torch.as_tensor(np.asarray(codes), dtype=torch.long, device=self.device)
        if t.ndim != 2 or t.shape[1] != self.cfg.n_heads:
            raise ValueError(f"codes must be [N, {self.cfg.n_heads}], got {tuple(t.shape)}")
        levels = torch.tensor(self.cfg.head_levels, device=self.device)
        if bool(((t < 0) | (t >= levels)).any()):
            raise ValueError("a code is outside its channel's level range")
        return t

    def frame_embed_pre_norm(self, frames):
        """§3.5 up to the LayerNorm: 32 lookups → concat → Linear+b → exact GELU → Linear+b, the b
        the LayerNorm normalizes. frames [F, 32] → [F, H] bf16."""
        codes = self._tensor_codes(frames)
        x = torch.cat([self.audio_embeddings[i][codes[:, i]] for i in range(self.cfg.n_heads)], dim=-1)
        w0, b0, w2, b2 = self.embed_proj
        a = self.linear(x, w0, b0)
        g = F.gelu(a)  # approximate='none': the erf form
        return self.linear(g, w2, b2)

    def frame_embed(self, frames):
        """§3.5: frame_embed_pre_norm → LayerNorm (eps 1e-5, no affine) → × audio_embed_scale.
        frames [F, 32] → [F, H] bf16."""
        b = self.frame_embed_pre_norm(frames)
        n = F.layer_norm(b, (b.shape[-1],), eps=1e-5)
        return n * self.audio_embed_scale

    def head_logits(self, hidden):
        """§3.4: the heads' bf16 logits, concatenated in head order, read out as fp32. hidden [N, H]."""
        return torch.cat([self.linear(hidden, wt, bs) for wt, bs in self.heads], dim=-1).float()

    def stop_logits(self, hidden):
        """bf16 stop-head logit per row, as fp32."""
        wt, bs = self.stop_head
        return self.linear(hidden, wt, bs)[..., 0].float()

    def stop_decision(self, hidden_row):
        """§3.4: bf16(sigmoid(bf16 logit)) > 0.5, compared as a Python float like the runner."""
        wt, bs = self.stop_head
        p = torch.sigmoid(self.linear(hidden_row, wt, bs))
        return float(p.reshape(-1)[0]) > STOP_THRESHOLD

    def _attention(self, prefix, xq, xkv):
        """Compressor attention: separate projections, no bias, SDPA, bidirectional (§3.6 step 5)."""
        c, nh = self.compressor, self.cfg.compressor_heads
        bsz, tq, d = xq.shape
        tk = xkv.shape[1]
        q = self.linear(xq, c[prefix + ".q_proj.weight"]).view(bsz, tq, nh, d // nh).transpose(1, 2)
        k = self.linear(xkv, c[prefix + ".k_proj.weight"]).view(bsz, tk, nh, d // nh).transpose(1, 2)
        v = self.linear(xkv, c[prefix + ".v_proj.weight"]).view(bsz, tk, nh, d // nh).transpose(1, 2)
        # ref_mask is all true at inference: no mask at all gives the same softmax
        if self.f32_gemm:  # SDPA's math: fp32 scores and softmax, no bf16 rounding in between
            s = torch.matmul(q.float(), k.float().transpose(2, 3)) / math.sqrt(d // nh)
            o = torch.matmul(torch.softmax(s, -1), v.float()).to(q.dtype)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False)
        o = o.transpose(1, 2).reshape(bsz, tq, d)
        return self.linear(o, c[prefix + ".out_proj.weight"])

    def compress(self, ref_codes):
        """§3.6: RefCompressor over unfolded reference codes [T_ref, 32] → prefix [8, H] (bf16)."""
        if not self.has_compressor:
            raise ValueError("this checkpoint has no reference compressor")
        c = self.compressor
        codes = self._tensor_codes(ref_codes)
        t_ref = codes.shape[0]
        if t_ref > self._pe.shape[0]:  # the module rebuilds its table when a clip is longer
            self._pe = sinusoidal_positions(t_ref, self.cfg.hidden_size).to(self.device, BF16)
        v = dequantize_codes(codes, self.cfg.head_levels)[None]
        x = self.linear(v, c["input_proj.weight"], c["input_proj.bias"])
        x = x + self._pe[:t_ref]
        q = c["queries"][None]
        for b in range(self.cfg.compressor_layers):
            p = f"blocks.{b}"
            h = _compressor_rmsnorm(q, c[p + ".norm_self.weight"])
            q = q + self._attention(p + ".self_attn", h, h)
            h = _compressor_rmsnorm(q, c[p + ".norm_cross.weight"])
            q = q + self._attention(p + ".cross_attn", h, x)
            h = _compressor_rmsnorm(q, c[p + ".norm_ffn.weight"])
            gate = self.linear(h, c[p + ".ffn.gate_proj.weight"])
            up = self.linear(h, c[p + ".ffn.up_proj.weight"])
            q = q + self.linear(F.silu(gate) * up, c[p + ".ffn.down_proj.weight"])
        return (c["output_scale"] * _compressor_rmsnorm(q, c["final_norm.weight"]))[0]

    def prefix(self, ref_codes=None, null_prefix=False):
        """§3.2: compressor output, the learned null_prefix, or None (K = 0, no prefix at all)."""
        if ref_codes is not None and null_prefix:
            raise ValueError("give ref_codes or null_prefix, not both")
        if ref_codes is not None:
            return self.compress(ref_codes)
        if null_prefix:
            if self.null_prefix is None:
                raise ValueError("this checkpoint has no null_prefix")
            return self.null_prefix
        return None

    # -- backbone ----------------------------------------------------------------------------------
    def embed_text(self, ids):
        t = torch.as_tensor(np.asarray(ids), dtype=torch.long, device=self.device).reshape(-1)
        return self.model.embed_tokens(t)

    def prefill_embeds(self, ids, prefix):
        text = self.embed_text(ids)
        return text if prefix is None else torch.cat([prefix, text], dim=0)

    def forward(self, embeds, cache=None):
        """One backbone call as the runner makes it: inputs_embeds, a 2-D mask of ones, positions from
        the cache length (§1.8). embeds [N, H] → (final-norm hidden [N, H], cache)."""
        past = cache.get_seq_length() if cache is not None else 0
        mask = torch.ones(1, past + embeds.shape[0], dtype=torch.long, device=self.device)
        out = self.model(inputs_embeds=embeds[None], attention_mask=mask, past_key_values=cache,
                         use_cache=True)
        return out.last_hidden_state[0], out.past_key_values


def _zero_centred_rmsnorm(x, weight, eps):
    """§1.2: y = bf16(xf · rsqrt(mean(xf²) + eps) · (1 + w)), one rounding."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(x.dtype)


@torch.no_grad()
def spec_forward(ref, embeds, cache=None):
    """The backbone written op by op from §1 (no transformers code), with the §1.9 rounding points.

    Used to check that the transformers model is configured as the spec says (nested partial rotary
    factor, eager attention, gate layout); it also reads as a plain description for a port.
    embeds [N, H] bf16; cache: None or the list returned by a previous call. → (hidden [N, H], cache)
    """
    m, c = ref.model, ref.backbone_config
    lin = ref.linear

    def mm(a, b):
        return _matmul(a, b, ref.f32_gemm)

    nq, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    eps = c.rms_norm_eps
    past = 0 if cache is None else cache[0][0].shape[1]
    n = embeds.shape[0]
    pos = torch.arange(past, past + n, device=embeds.device, dtype=torch.float32)
    angles = pos[:, None] * m.rotary_emb.inv_freq.float()[None, :]  # §1.5: one fp32 product
    cos = torch.cat([angles.cos(), angles.cos()], -1).to(BF16)  # [n, rotary_dim]
    sin = torch.cat([angles.sin(), angles.sin()], -1).to(BF16)
    rot = cos.shape[-1]

    def rope(x):  # x [heads, n, hd]: half-split, each product and the sum rounded (§1.5)
        xr, xp = x[..., :rot], x[..., rot:]
        half = torch.cat([-xr[..., rot // 2:], xr[..., :rot // 2]], -1)
        return torch.cat([xr * cos + half * sin, xp], -1)

    x = embeds
    new_cache = []
    for li, layer in enumerate(m.layers):
        a = layer.self_attn
        u = _zero_centred_rmsnorm(x, layer.input_layernorm.weight, eps)
        qg = lin(u, a.q_proj.weight).view(n, nq, 2 * hd)  # §1.4: per head [query | gate]
        q, gate = qg[..., :hd], qg[..., hd:].reshape(n, nq * hd)
        q = _zero_centred_rmsnorm(q, a.q_norm.weight, eps).transpose(0, 1)
        k = _zero_centred_rmsnorm(lin(u, a.k_proj.weight).view(n, nkv, hd), a.k_norm.weight, eps)
        v = lin(u, a.v_proj.weight).view(n, nkv, hd).transpose(0, 1)
        q, k = rope(q), rope(k.transpose(0, 1))
        if cache is not None:
            k = torch.cat([cache[li][0], k], 1)
            v = torch.cat([cache[li][1], v], 1)
        new_cache.append((k, v))
        group = nq // nkv
        kk, vv = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        s = mm(q, kk.transpose(1, 2)) * a.scaling  # bf16 scores, then the exact scale
        t = past + n
        keys = torch.arange(t, device=x.device)
        causal = keys[None, :] <= (past + torch.arange(n, device=x.device))[:, None]
        s = s.masked_fill(~causal, torch.finfo(BF16).min)
        p = torch.softmax(s.float(), -1).to(BF16)
        o = mm(p, vv).transpose(0, 1).reshape(n, nq * hd)
        o = o * torch.sigmoid(gate)
        x = x + lin(o, a.o_proj.weight)
        y = _zero_centred_rmsnorm(x, layer.post_attention_layernorm.weight, eps)
        mlp = layer.mlp
        x = x + lin(F.silu(lin(y, mlp.gate_proj.weight)) * lin(y, mlp.up_proj.weight),
                         mlp.down_proj.weight)
    return _zero_centred_rmsnorm(x, m.norm.weight, eps), new_cache


_CACHE: "OrderedDict[tuple, GepardReference]" = OrderedDict()
_CACHE_SIZE = 1  # a gepard-1.0-shaped model is ~0.6 GB in bf16: keep one


def load_reference(checkpoint_dir, device="cpu"):
    """The GepardReference of a checkpoint, kept loaded for the next call with the same one."""
    key = (os.path.realpath(checkpoint_dir), str(device))
    ref = _CACHE.get(key)
    if ref is None:
        while len(_CACHE) >= _CACHE_SIZE:
            _CACHE.popitem(last=False)
        ref = GepardReference(checkpoint_dir, device)
        _CACHE[key] = ref
    _CACHE.move_to_end(key)
    return ref


def _np(t):
    return t.detach().float().cpu().numpy()


@torch.no_grad()
def run_lm(checkpoint_dir, ids, ref_codes=None, null_prefix=False, frames=None, inv_freq="bf16",
           device="cpu", schedule="cached", backbone="hf", f32_gemm=False, prefix=None):
    """The runner's schedule with forced frames; every tensor as float32 numpy.

    schedule="cached" (the runner's): one prefill forward, then one cached decode step per frame j at
    position P + j with the frame embedding of frames[j]. schedule="full": one forward over
    [prefix | text | frame embeddings] (HF's own other schedule, for checking the reference itself).
    prefix: a given [K, H] prefix (cast to bf16) instead of ref_codes/null_prefix, e.g. another
    implementation's compressor output, to compare the backbones on the very same input.
    backbone="spec" runs spec_forward instead of the transformers model; f32_gemm=True widens every
    GEMM to fp32 (see _linear). Both only serve to check the reference and size tolerances.

    Returns a dict: prefix [K, H] (only when K > 0), prefill_hidden [P, H], step_hidden [F, H],
    frame_embeds [F, H], head_logits [F+1, sum(L_i)], stop_logits [F+1].
    """
    ref = load_reference(checkpoint_dir, device)
    ref.set_inv_freq(inv_freq)
    if backbone not in ("hf", "spec"):
        raise ValueError(f"unknown backbone {backbone!r}")
    if f32_gemm and backbone == "hf":
        raise ValueError("f32_gemm needs backbone='spec'")
    forward = ref.forward if backbone == "hf" else (lambda e, c=None: spec_forward(ref, e, c))
    ref.f32_gemm = f32_gemm
    try:
        return _run_lm(ref, forward, ids, ref_codes, null_prefix, frames, schedule, prefix)
    finally:
        ref.f32_gemm = False


def _prefix(ref, ref_codes, null_prefix, given_prefix):
    """The prefix rows [K, H] in bf16 (None for none): the given ones, or the reference's own."""
    if given_prefix is None:
        return ref.prefix(ref_codes, null_prefix)
    if ref_codes is not None or null_prefix:
        raise ValueError("give prefix, ref_codes or null_prefix, not several")
    prefix = torch.as_tensor(np.asarray(given_prefix, dtype=np.float32), device=ref.device).to(BF16)
    if prefix.ndim != 2 or prefix.shape[1] != ref.cfg.hidden_size:
        raise ValueError(f"prefix must be [K, {ref.cfg.hidden_size}]")
    return prefix if prefix.shape[0] > 0 else None


def _run_lm(ref, forward, ids, ref_codes, null_prefix, frames, schedule, given_prefix):
    prefix = _prefix(ref, ref_codes, null_prefix, given_prefix)
    embeds = ref.prefill_embeds(ids, prefix)
    p = embeds.shape[0]
    h = ref.cfg.hidden_size
    if frames is None or len(frames) == 0:
        frame_embeds = torch.zeros(0, h, dtype=BF16, device=ref.device)
    else:
        frame_embeds = ref.frame_embed(frames)
    n_frames = frame_embeds.shape[0]

    if schedule == "cached":
        prefill_hidden, cache = forward(embeds)
        steps = []
        for j in range(n_frames):
            hj, cache = forward(frame_embeds[j:j + 1], cache)
            steps.append(hj)
        step_hidden = torch.cat(steps, dim=0) if steps else frame_embeds[:0]
    elif schedule == "full":
        hidden, _ = forward(torch.cat([embeds, frame_embeds], dim=0))
        prefill_hidden, step_hidden = hidden[:p], hidden[p:]
    else:
        raise ValueError(f"unknown schedule {schedule!r}")

    rows = torch.cat([prefill_hidden[-1:], step_hidden], dim=0)
    out = {
        "prefill_hidden": _np(prefill_hidden),
        "step_hidden": _np(step_hidden).reshape(n_frames, h),
        "frame_embeds": _np(frame_embeds).reshape(n_frames, h),
        "head_logits": _np(ref.head_logits(rows)),
        "stop_logits": _np(ref.stop_logits(rows)),
    }
    if prefix is not None:
        out["prefix"] = _np(prefix)
    return out


def top2_gap(logits):
    """Best minus second-best logit along the last axis (0 for a tie)."""
    top = torch.topk(logits, 2, dim=-1).values
    return top[..., 0] - top[..., 1]


@torch.no_grad()
def generate_greedy(checkpoint_dir, ids, ref_codes=None, null_prefix=False, max_frames=16,
                    inv_freq="bf16", device="cpu", prefix=None):
    """§3.3/§3.4 with argmax per head (first index on exact ties, like torch.argmax).

    Frame 0 comes from the last prefill position (SOS) with no stop check; then each step decodes the
    last frame, checks stop (bf16 sigmoid > 0.5) and, if not stopping, appends the argmax frame.
    prefix: a given [K, H] prefix instead of ref_codes/null_prefix, as in run_lm.

    Returns a dict: frames [T, 32] int32; gaps [T, 32] float32, the top-2 logit gap of each sampled
    head; stop_logits [T'] float32, the stop logit at each check made (T' = T − 1, or T when stop
    fired); stopped (bool).
    """
    ref = load_reference(checkpoint_dir, device)
    ref.set_inv_freq(inv_freq)
    levels = ref.cfg.head_levels
    bounds = np.cumsum([0] + list(levels))

    def pick(hidden_row):
        logits = ref.head_logits(hidden_row[None])[0]
        frame, gaps = [], []
        for i in range(len(levels)):
            part = logits[bounds[i]:bounds[i + 1]]
            frame.append(int(torch.argmax(part)))
            gaps.append(float(top2_gap(part)))
        return frame, gaps

    prefix = _prefix(ref, ref_codes, null_prefix, prefix)
    hidden, cache = ref.forward(ref.prefill_embeds(ids, prefix))
    frame, gaps = pick(hidden[-1])
    frames, all_gaps, stops, stopped = [frame], [gaps], [], False
    for _ in range(1, max_frames):
        e = ref.frame_embed([frames[-1]])
        h, cache = ref.forward(e, cache)
        stops.append(float(ref.stop_logits(h)[0]))
        if ref.stop_decision(h[0]):
            stopped = True
            break
        frame, gaps = pick(h[0])
        frames.append(frame)
        all_gaps.append(gaps)
    return {
        "frames": np.asarray(frames, dtype=np.int32).reshape(-1, len(levels)),
        "gaps": np.asarray(all_gaps, dtype=np.float32).reshape(-1, len(levels)),
        "stop_logits": np.asarray(stops, dtype=np.float32),
        "stopped": stopped,
    }


def check_self_consistency(checkpoint_dir, ids, frames, ref_codes=None, null_prefix=False,
                           inv_freq="bf16", device="cpu"):
    """Cached decode vs one full recompute over the same inputs: max |Δ| per tensor (spec §6 saw
    0.047 on the 14-layer shape)."""
    a = run_lm(checkpoint_dir, ids, ref_codes, null_prefix, frames, inv_freq, device, "cached")
    b = run_lm(checkpoint_dir, ids, ref_codes, null_prefix, frames, inv_freq, device, "full")
    return {k: float(np.max(np.abs(a[k] - b[k]))) if a[k].size else 0.0 for k in a}
