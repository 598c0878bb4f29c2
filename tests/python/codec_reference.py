"""PyTorch reference of NVIDIA NanoCodec, written from /work/shared/specs/nanocodec.md (cited as §n).

The numerics the C codec is checked against:

* checkpoints as gepard-make-test-model --codec-only writes them: a ``.nemo`` tar holding
  ``model_config.yaml`` and ``model_weights.ckpt`` (a torch.save zip, read with
  ``torch.load(weights_only=True)``), or a safetensors export whose metadata key ``model_config.yaml``
  carries the same YAML (§5);
* the causal decoder ``CausalHiFiGANDecoder`` (§2), the non-causal encoder ``HiFiGANEncoder`` (§3) and
  the GroupFSQ quantizer (§4), in plain ``torch.nn.functional`` calls;
* weight norm folded at load, ``W = v · g / ‖v‖`` over all dims but dim 0, no epsilon (§2.4);
* everything runs in float32 or float64; float64 is the ground truth a fp32 implementation is
  measured against (§8). The quantizer always runs in fp32, as NeMo's ``quantize`` does (§4);
* a frame-by-frame streaming decoder with per-layer caches (§6.1), kept separate from the one-shot
  decoder so that the two can be compared. torch's conv1d picks its blocking from the input length,
  so its sums differ in the last bits between chunked and one-shot runs (~1e-14 in float64);
  ``fixed_order=True`` sums every conv in one length-independent order in both decoders, and then
  streaming equals one-shot bit for bit.

Code layout used throughout: a "code" is the per-channel level index k ∈ [0, L) of one latent channel;
``codes`` is an int32 array [T, 32] where channel i belongs to codebook i // 4, FSQ dimension i % 4,
and dequantizes to (k − L//2) / (L//2). ``pack_indices`` / ``unpack_indices`` convert to and from the
packed per-codebook token index k0 + 8·k1 + 56·k2 + 336·k3 (§4).

Entry points: ``load_codec`` → ``NanoCodec`` with ``decode``, ``encode``, ``streaming_decoder``;
``fsq_encode``, ``fsq_dequantize``, ``fsq_boundary_margin``.
"""

from __future__ import annotations

import io
import math
import struct
import tarfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml

F32 = torch.float32
F64 = torch.float64

LRELU_SLOPE = 0.01  # torch.nn.LeakyReLU() default (§2.3, §3.1)
SNAKE_EPS = 1e-9  # added to alpha before the reciprocal (§2.3)
FSQ_EPS = 1e-3  # FiniteScalarQuantizer default (§4)

DECODER_CLASS = "CausalHiFiGANDecoder"
ENCODER_CLASS = "HiFiGANEncoder"
QUANTIZER_CLASS = "GroupFiniteScalarQuantizer"

# §4: fp32 bit patterns of scale = ((L-1)/2)(1-eps) and shift = tan(offset/scale)
FSQ_SCALE_BITS = {8: 0x405FC6A8, 7: 0x403FCED9, 6: 0x401FD70A}
FSQ_SHIFT_BITS = {8: 0x3E137042, 7: 0x00000000, 6: 0x3E4FC9DC}

WEIGHT_G = ".parametrizations.weight.original0"
WEIGHT_V = ".parametrizations.weight.original1"


def f32_from_bits(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def f32_bits(value):
    return struct.unpack("<I", struct.pack("<f", value))[0]


# ---- checkpoint files (§5) --------------------------------------------------------------------------


def _is_tar(path):
    with open(path, "rb") as f:
        head = f.read(512)
    return len(head) == 512 and head[257:262] == b"ustar"


def read_checkpoint(path):
    """(config dict from model_config.yaml, state dict of CPU tensors) of a .nemo or safetensors file."""
    path = Path(path)
    if _is_tar(path):
        with tarfile.open(path, "r:*") as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            config_text = tar.extractfile(members["model_config.yaml"]).read().decode("utf-8")
            ckpt_bytes = tar.extractfile(members["model_weights.ckpt"]).read()
        state = torch.load(io.BytesIO(ckpt_bytes), map_location="cpu", weights_only=True)
        del ckpt_bytes
    else:
        from safetensors import safe_open

        state = {}
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            config_text = metadata["model_config.yaml"]
            for key in f.keys():
                state[key] = f.get_tensor(key)
    return yaml.safe_load(config_text), dict(state)


class _Params:
    """Takes named tensors from a state dict; ``unused`` lists what nobody asked for (strict load)."""

    def __init__(self, state, prefix, dtype):
        self.state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        self.prefix = prefix
        self.dtype = dtype
        self.taken = set()

    def tensor(self, name):
        if name not in self.state:
            raise KeyError(f"checkpoint has no tensor {self.prefix}{name}")
        self.taken.add(name)
        return self.state[name]

    def conv(self, name):
        """(weight, bias) of a weight-normed conv, folded as torch's weight_norm with dim=0 (§2.4)."""
        g = self.tensor(name + WEIGHT_G)
        v = self.tensor(name + WEIGHT_V)
        bias = self.tensor(name + ".bias")
        if g.dtype != F32 or v.dtype != F32 or bias.dtype != F32:
            raise ValueError(f"{self.prefix}{name}: expected float32 tensors")
        if tuple(g.shape) != (v.shape[0],) + (1,) * (v.dim() - 1):
            raise ValueError(f"{self.prefix}{name}: g {tuple(g.shape)} does not match v {tuple(v.shape)}")
        if self.dtype == F32:
            # exactly the fp32 weight NeMo's modules compute
            weight = torch._weight_norm(v, g, 0)
        else:
            v64 = v.to(F64)
            norm = v64.reshape(v64.shape[0], -1).norm(dim=1).reshape(g.shape)
            weight = v64 * (g.to(F64) / norm)
        return weight.to(self.dtype).contiguous(), bias.to(self.dtype).contiguous()

    def alpha(self, name):
        a = self.tensor(name + ".activation.snake_act.alpha")
        if a.dim() != 3 or a.shape[0] != 1 or a.shape[2] != 1:
            raise ValueError(f"{self.prefix}{name}: alpha shape {tuple(a.shape)}")
        return a.to(self.dtype)

    def check_all_taken(self):
        unused = sorted(set(self.state) - self.taken)
        if unused:
            raise ValueError(f"unused {self.prefix}* tensors: {unused[:5]} ({len(unused)} in all)")


def _class_name(section):
    return str(section.get("_target_", "")).rsplit(".", 1)[-1]


# ---- pointwise primitives (§2.3) ---------------------------------------------------------------------


def snake(x, alpha):
    """x + 1/(alpha + 1e-9) · sin²(alpha·x), per channel alpha of shape (1, C, 1)."""
    inv = torch.reciprocal(alpha + SNAKE_EPS)
    return x + inv * torch.sin(alpha * x).pow(2)


def half_snake(x, alpha):
    """Snake on the first C // 2 channels, LeakyReLU(0.01) on the rest, concatenated in that order."""
    n = x.shape[1] // 2
    if alpha.shape[1] != n:
        raise ValueError(f"HalfSnake over {x.shape[1]} channels needs {n} alphas, got {alpha.shape[1]}")
    return torch.cat([snake(x[:, :n], alpha), F.leaky_relu(x[:, n:], LRELU_SLOPE)], dim=1)


def lrelu(x):
    return F.leaky_relu(x, LRELU_SLOPE)


# ---- convolutions -------------------------------------------------------------------------------------


def conv1d_fixed_order(x, weight, bias, dilation=1):
    """Unpadded stride-1 conv whose every output is summed in one fixed order, whatever the length.

    acc = Σ_m Σ_c W[o, c, m] · x[c, t + m·d], taps m outer, input channels c inner, one rounding per
    product and per add, then + bias. F.conv1d picks its blocking (oneDNN, MKL) from the input length,
    so its sums are not chunk-invariant; this one is, which makes one-shot and streaming runs
    comparable bit for bit. Slow: meant for small models.
    """
    c_out, c_in, k = weight.shape
    length = x.shape[-1] - (k - 1) * dilation
    acc = x.new_zeros(x.shape[0], c_out, length)
    for m in range(k):
        xs = x[:, :, m * dilation: m * dilation + length]
        for c in range(c_in):
            acc += weight[:, c, m].reshape(1, c_out, 1) * xs[:, c: c + 1, :]
    return acc + bias.reshape(1, c_out, 1)


def _conv1d(x, weight, bias, dilation, fixed_order):
    if fixed_order:
        return conv1d_fixed_order(x, weight, bias, dilation)
    return F.conv1d(x, weight, bias, dilation=dilation)


def causal_conv(x, conv, dilation=1, fixed_order=False):
    """Stride-1 causal conv: zero left padding (k−1)·d, no right padding (§2.3)."""
    weight, bias = conv
    pad = (weight.shape[-1] - 1) * dilation
    return _conv1d(F.pad(x, (pad, 0)), weight, bias, dilation, fixed_order)


def _check_transposed(weight, bias, stride):
    if weight.shape[-1] != 2 * stride or weight.shape[0] != 2 * bias.shape[0] or weight.shape[1] != 1:
        raise ValueError(f"transposed conv weight {tuple(weight.shape)} for stride {stride}")


def transposed_contributions(x, weight):
    """Bias-free output of each input frame of the grouped transposed conv: [B, C_out, n, 2s].

    Output channel j reads input channels 2j and 2j+1: x[2j, i]·W[2j, m] + x[2j+1, i]·W[2j+1, m].
    """
    xe, xo = x[:, 0::2, :, None], x[:, 1::2, :, None]
    we, wo = weight[0::2, 0][None, :, None, :], weight[1::2, 0][None, :, None, :]
    return xe * we + xo * wo


def causal_conv_transpose(x, conv, stride, fixed_order=False):
    """Grouped transposed conv (groups = C_out, kernel 2s, stride s), samples [0, T·s) kept (§2.3).

    With fixed_order, sample i·s + m is (frame i−1's tap m+s + frame i's tap m) + bias, the order the
    streaming decoder uses.
    """
    weight, bias = conv
    _check_transposed(weight, bias, stride)
    if not fixed_order:
        y = F.conv_transpose1d(x, weight, bias, stride=stride, groups=bias.shape[0])
        return y[..., : x.shape[-1] * stride]
    contrib = transposed_contributions(x, weight)
    older = F.pad(contrib[:, :, :-1, stride:], (0, 0, 1, 0))  # frame i−1's tail, zero before frame 0
    out = (older + contrib[:, :, :, :stride]) + bias.reshape(1, -1, 1, 1)
    return out.reshape(x.shape[0], bias.shape[0], -1)


def replicate_conv(x, conv, padding, stride=1, dilation=1):
    """Non-causal conv with replicate padding on both sides (§3.4)."""
    weight, bias = conv
    if padding:
        x = F.pad(x, (padding, padding), mode="replicate")
    return F.conv1d(x, weight, bias, stride=stride, dilation=dilation)


# ---- GroupFSQ (§4) -----------------------------------------------------------------------------------


def fsq_constants(level):
    """(scale, offset, shift) of one FSQ dimension as Python floats holding fp32 values."""
    scale = float(torch.tensor((level - 1) / 2, dtype=F32) * torch.tensor(1.0 - FSQ_EPS, dtype=F32))
    offset = 0.5 if level % 2 == 0 else 0.0
    shift = float(torch.tan(torch.tensor(offset, dtype=F32) / torch.tensor(scale, dtype=F32)))
    # the spec lists the bits for the published levels; prefer them over this platform's tanf
    if level in FSQ_SCALE_BITS:
        scale = f32_from_bits(FSQ_SCALE_BITS[level])
        shift = f32_from_bits(FSQ_SHIFT_BITS[level])
    return scale, offset, shift


class Quantizer:
    """GroupFSQ with ``num_groups`` groups of ``len(levels)`` dims; group g = channels g·D … g·D+D−1."""

    def __init__(self, num_groups, levels):
        self.num_groups = int(num_groups)
        self.levels = tuple(int(v) for v in levels)
        self.dim = len(self.levels)
        self.channels = self.num_groups * self.dim
        per_channel = [self.levels[i % self.dim] for i in range(self.channels)]
        self.channel_levels = torch.tensor(per_channel, dtype=torch.int64)
        consts = [fsq_constants(level) for level in per_channel]
        self.scale = torch.tensor([c[0] for c in consts], dtype=F32)
        self.offset = torch.tensor([c[1] for c in consts], dtype=F32)
        self.shift = torch.tensor([c[2] for c in consts], dtype=F32)
        self.half = torch.tensor([level // 2 for level in per_channel], dtype=torch.int64)
        bases, base = [], 1
        for level in self.levels:
            bases.append(base)
            base *= level
        self.bases = tuple(bases)
        self.codebook_size = base

    def encode(self, latent):
        """latent [T, C] (any float dtype, evaluated in fp32) → codes int32 [T, C]."""
        x = torch.as_tensor(latent).to(F32)
        y = self.scale * torch.tanh(x + self.shift) - self.offset
        k = torch.round(y) + self.half.to(F32)
        return k.to(torch.int32)

    def compressed(self, latent):
        """scale·tanh(x + shift) − offset in float64 with the same fp32 constants (for margins)."""
        x = torch.as_tensor(latent).to(F64)
        return self.scale.to(F64) * torch.tanh(x + self.shift.to(F64)) - self.offset.to(F64)

    def boundary_margin(self, latent):
        """Distance, in rounding units, of each compressed value from the nearest .5 rounding boundary."""
        y = self.compressed(latent)
        return (0.5 - (y - torch.round(y)).abs()).abs()

    def dequantize(self, codes):
        """codes [T, C] → latent fp32 [T, C], (k − L//2) / (L//2) evaluated in fp32."""
        k = torch.as_tensor(np.asarray(codes), dtype=torch.int64)
        if k.dim() != 2 or k.shape[1] != self.channels:
            raise ValueError(f"codes must be [T, {self.channels}], got {tuple(k.shape)}")
        if bool(((k < 0) | (k >= self.channel_levels)).any()):
            raise ValueError("code out of range for its FSQ level")
        return (k - self.half).to(F32) / self.half.to(F32)

    def pack(self, codes):
        """codes [T, C] → packed token indices [T, num_groups] (dim 0 least significant)."""
        k = torch.as_tensor(np.asarray(codes), dtype=torch.int64).reshape(-1, self.num_groups, self.dim)
        return (k * torch.tensor(self.bases, dtype=torch.int64)).sum(-1).to(torch.int32)

    def unpack(self, indices):
        """packed token indices [T, num_groups] → codes [T, C]."""
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.int64).unsqueeze(-1)
        bases = torch.tensor(self.bases, dtype=torch.int64)
        levels = torch.tensor(self.levels, dtype=torch.int64)
        return ((idx // bases) % levels).reshape(idx.shape[0], -1).to(torch.int32)


# ---- decoder (§2) ------------------------------------------------------------------------------------


class Decoder:
    """CausalHiFiGANDecoder weights: pre_conv, 5 upsampling stages, post activation and conv."""

    def __init__(self, config, state, dtype):
        if _class_name(config) != DECODER_CLASS:
            raise ValueError(f"decoder class {config.get('_target_')!r} is not {DECODER_CLASS}")
        for key, want in (("activation", "half_snake"), ("output_activation", "clamp")):
            if config.get(key, want) != want:
                raise ValueError(f"decoder {key}={config.get(key)!r}; only {want!r} is implemented")
        if not config.get("n_groups_equal_to_out_channels", False):
            raise ValueError("decoder must have n_groups_equal_to_out_channels: true")
        p = _Params(state, "audio_decoder.", dtype)
        self.dtype = dtype
        self.rates = [int(r) for r in config["up_sample_rates"]]
        self.kernels = [int(k) for k in config.get("resblock_kernel_sizes", (3, 7, 11))]
        self.dilations = [int(d) for d in config.get("resblock_dilation_sizes", (1, 3, 5))]
        self.input_dim = int(config["input_dim"])
        self.pre_conv = p.conv("pre_conv.conv")
        self.stage_alpha, self.up_conv, self.res = [], [], []
        for i in range(len(self.rates)):
            self.stage_alpha.append(p.alpha(f"activations.{i}"))
            self.up_conv.append(p.conv(f"up_sample_conv_layers.{i}.conv"))
            branches = []
            for j, k in enumerate(self.kernels):
                blocks = []
                for m, _ in enumerate(self.dilations):
                    base = f"res_layers.{i}.res_blocks.{j}.res_blocks.{m}."
                    block = (
                        p.alpha(base + "input_activation"),
                        p.conv(base + "input_conv.conv"),
                        p.alpha(base + "skip_activation"),
                        p.conv(base + "skip_conv.conv"),
                    )
                    if block[1][0].shape[-1] != k or block[3][0].shape[-1] != k:
                        raise ValueError(f"{base}: kernel size is not {k}")
                    blocks.append(block)
                branches.append(blocks)
            self.res.append(branches)
        self.post_alpha = p.alpha("post_activation")
        self.post_conv = p.conv("post_conv.conv")
        p.check_all_taken()
        self.samples_per_frame = math.prod(self.rates)
        # history of every causal conv, for the streaming decoder and the state count of §6.1
        self.state_floats = self._count_state()

    def _count_state(self):
        total = self.pre_conv[0].shape[1] * (self.pre_conv[0].shape[-1] - 1)
        for i, rate in enumerate(self.rates):
            total += self.up_conv[i][1].shape[0] * rate
            for j, k in enumerate(self.kernels):
                for d in self.dilations:
                    c = self.up_conv[i][1].shape[0]
                    total += c * (k - 1) * d + c * (k - 1)
        total += self.post_conv[0].shape[1] * (self.post_conv[0].shape[-1] - 1)
        return total

    def res_layer(self, x, i, fixed_order=False):
        """Mean of the parallel branches, (b3 + b7 + b11) / 3, each a chain of residual blocks."""
        outs = []
        for j, blocks in enumerate(self.res[i]):
            h = x
            for m, (a_in, conv_in, a_skip, conv_skip) in enumerate(blocks):
                t = causal_conv(half_snake(h, a_in), conv_in, self.dilations[m], fixed_order)
                t = causal_conv(half_snake(t, a_skip), conv_skip, 1, fixed_order)
                h = h + t
            outs.append(h)
        total = outs[0]
        for o in outs[1:]:
            total = total + o
        return total / len(outs)

    def forward(self, latent, fixed_order=False):
        """latent [1, 32, T] → samples [1, T·1024], one shot."""
        x = causal_conv(latent.to(self.dtype), self.pre_conv, 1, fixed_order)
        for i, rate in enumerate(self.rates):
            x = half_snake(x, self.stage_alpha[i])
            x = causal_conv_transpose(x, self.up_conv[i], rate, fixed_order)
            x = self.res_layer(x, i, fixed_order)
        x = half_snake(x, self.post_alpha)
        x = causal_conv(x, self.post_conv, 1, fixed_order)
        return torch.clamp(x, -1.0, 1.0)[:, 0]


class StreamingDecoder:
    """Frame-chunk decoder of §6.1: per-conv input caches and per-transposed-conv bias-free carries.

    ``push(codes)`` takes n ≥ 1 new frames and returns their n·1024 samples. Caches start at zero
    (NeMo's zero left padding); nothing is flushed at the end. With ``fixed_order`` the convolutions
    are summed as in ``conv1d_fixed_order`` / ``causal_conv_transpose(fixed_order=True)``, so the
    output equals ``NanoCodec.decode(codes, fixed_order=True)`` bit for bit.
    """

    def __init__(self, codec, fixed_order=False):
        self.codec = codec
        self.dec = codec.decoder
        self.fixed_order = fixed_order
        self.cache = {}
        self.carry = {}

    def _conv(self, key, x, conv, dilation=1):
        weight, bias = conv
        pad = (weight.shape[-1] - 1) * dilation
        if pad:
            hist = self.cache.get(key)
            if hist is None:
                hist = x.new_zeros(x.shape[0], x.shape[1], pad)
            x = torch.cat([hist, x], dim=-1)
            self.cache[key] = x[..., x.shape[-1] - pad:].clone()
        return _conv1d(x, weight, bias, dilation, self.fixed_order)

    def _conv_transpose(self, key, x, conv, stride):
        """§6.1 step 3: carry + new contributions, emit n·s samples + bias, carry the last s."""
        weight, bias = conv
        n = x.shape[-1]
        carry = self.carry.get(key)
        if carry is None:
            carry = x.new_zeros(x.shape[0], bias.shape[0], stride)
        if self.fixed_order:
            contrib = transposed_contributions(x, weight)  # [B, C_out, n, 2s]
            older = torch.cat([carry.unsqueeze(2), contrib[:, :, :-1, stride:]], dim=2)
            out = (older + contrib[:, :, :, :stride]) + bias.reshape(1, -1, 1, 1)
            self.carry[key] = contrib[:, :, -1, stride:].clone()
            return out.reshape(x.shape[0], bias.shape[0], n * stride)
        raw = F.conv_transpose1d(x, weight, None, stride=stride, groups=bias.shape[0])  # n·s + s
        head = carry + raw[..., :stride]  # older frame's overlap first, then the new frame's
        out = torch.cat([head, raw[..., stride: n * stride]], dim=-1) + bias.reshape(1, -1, 1)
        self.carry[key] = raw[..., n * stride:].clone()
        return out

    def _res_layer(self, x, i):
        dec = self.dec
        outs = []
        for j, blocks in enumerate(dec.res[i]):
            h = x
            for m, (a_in, conv_in, a_skip, conv_skip) in enumerate(blocks):
                t = self._conv(("in", i, j, m), half_snake(h, a_in), conv_in, dec.dilations[m])
                t = self._conv(("skip", i, j, m), half_snake(t, a_skip), conv_skip, 1)
                h = h + t
            outs.append(h)
        total = outs[0]
        for o in outs[1:]:
            total = total + o
        return total / len(outs)

    @torch.no_grad()
    def push(self, codes):
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] < 1:
            raise ValueError("push needs codes [n >= 1, 32]")
        dec = self.dec
        latent = self.codec.quantizer.dequantize(codes).T.unsqueeze(0).to(dec.dtype)
        x = self._conv("pre", latent, dec.pre_conv)
        for i, rate in enumerate(dec.rates):
            x = half_snake(x, dec.stage_alpha[i])
            x = self._conv_transpose(("up", i), x, dec.up_conv[i], rate)
            x = self._res_layer(x, i)
        x = half_snake(x, dec.post_alpha)
        x = self._conv("post", x, dec.post_conv)
        return torch.clamp(x, -1.0, 1.0)[0, 0]

    def state_floats(self):
        return sum(t.numel() for t in self.cache.values()) + sum(t.numel() for t in self.carry.values())


# ---- encoder (§3) ------------------------------------------------------------------------------------


class Encoder:
    """HiFiGANEncoder weights: pre_conv, 5 (res layer, LeakyReLU, strided conv) stages, post conv."""

    def __init__(self, config, state, dtype):
        if _class_name(config) != ENCODER_CLASS:
            raise ValueError(f"encoder class {config.get('_target_')!r} is not {ENCODER_CLASS}")
        for key, want in (("activation", "lrelu"), ("pad_mode", "replicate")):
            if config.get(key) != want:
                raise ValueError(f"encoder {key}={config.get(key)!r}; only {want!r} is implemented")
        p = _Params(state, "audio_encoder.", dtype)
        self.dtype = dtype
        self.rates = [int(r) for r in config["down_sample_rates"]]
        self.kernels = [int(k) for k in config.get("resblock_kernel_sizes", (3, 7, 11))]
        self.dilations = [int(d) for d in config.get("resblock_dilation_sizes", (1, 3, 5))]
        self.pre_conv = p.conv("pre_conv.conv")
        self.down_conv, self.res = [], []
        for i, rate in enumerate(self.rates):
            conv = p.conv(f"down_sample_conv_layers.{i}.conv")
            if conv[0].shape[-1] != 2 * rate:
                raise ValueError(f"down_sample_conv_layers.{i}: kernel {conv[0].shape[-1]} for rate {rate}")
            self.down_conv.append(conv)
            branches = []
            for j, k in enumerate(self.kernels):
                blocks = []
                for m, _ in enumerate(self.dilations):
                    base = f"res_layers.{i}.res_blocks.{j}.res_blocks.{m}."
                    blocks.append((p.conv(base + "input_conv.conv"), p.conv(base + "skip_conv.conv")))
                branches.append(blocks)
            self.res.append(branches)
        self.post_conv = p.conv("post_conv.conv")
        p.check_all_taken()
        self.samples_per_frame = math.prod(self.rates)

    def res_layer(self, x, i):
        outs = []
        for j, blocks in enumerate(self.res[i]):
            h = x
            k = self.kernels[j]
            for m, (conv_in, conv_skip) in enumerate(blocks):
                d = self.dilations[m]
                t = replicate_conv(lrelu(h), conv_in, padding=(k - 1) * d // 2, dilation=d)
                t = replicate_conv(lrelu(t), conv_skip, padding=(k - 1) // 2)
                h = h + t
            outs.append(h)
        total = outs[0]
        for o in outs[1:]:
            total = total + o
        return total / len(outs)

    def forward(self, audio):
        """audio [1, 1, N'] with N' a multiple of samples_per_frame → latent [1, 32, N'/1024]."""
        x = replicate_conv(audio.to(self.dtype), self.pre_conv, padding=(self.pre_conv[0].shape[-1] - 1) // 2)
        for i, rate in enumerate(self.rates):
            x = self.res_layer(x, i)
            x = lrelu(x)
            x = replicate_conv(x, self.down_conv[i], padding=(rate + 1) // 2, stride=rate)
        x = lrelu(x)
        return replicate_conv(x, self.post_conv, padding=(self.post_conv[0].shape[-1] - 1) // 2)


# ---- the codec ---------------------------------------------------------------------------------------


class NanoCodec:
    """A loaded codec in one dtype (float32 or float64)."""

    def __init__(self, config, state, dtype=F64):
        if dtype not in (F32, F64):
            raise ValueError("dtype must be torch.float32 or torch.float64")
        self.config = config
        self.dtype = dtype
        self.sample_rate = int(config.get("sample_rate", 22050))
        vq = config["vector_quantizer"]
        if _class_name(vq) != QUANTIZER_CLASS:
            raise ValueError(f"quantizer class {vq.get('_target_')!r} is not {QUANTIZER_CLASS}")
        if float(vq.get("eps", FSQ_EPS)) != FSQ_EPS:
            raise ValueError("only the default FSQ eps 1e-3 is implemented")
        self.quantizer = Quantizer(vq["num_groups"], vq["num_levels_per_group"])
        self._check_quantizer_buffers(state)
        self.decoder = Decoder(config["audio_decoder"], state, dtype)
        self.encoder = Encoder(config["audio_encoder"], state, dtype)
        self.samples_per_frame = int(config.get("samples_per_frame", self.decoder.samples_per_frame))
        if not (self.samples_per_frame == self.decoder.samples_per_frame == self.encoder.samples_per_frame):
            raise ValueError("samples_per_frame disagrees with the up/down sample rates")
        if self.decoder.input_dim != self.quantizer.channels:
            raise ValueError("decoder input_dim differs from the quantizer's channel count")

    def _check_quantizer_buffers(self, state):
        q = self.quantizer
        for g in range(q.num_groups):
            levels = state[f"vector_quantizer.fsqs.{g}.num_levels"].reshape(-1).tolist()
            bases = state[f"vector_quantizer.fsqs.{g}.dim_base_index"].reshape(-1).tolist()
            if tuple(levels) != q.levels or tuple(bases) != q.bases:
                raise ValueError(f"fsqs.{g} buffers {levels} {bases} disagree with the config")

    @torch.no_grad()
    def decode(self, codes, fixed_order=False):
        """codes int [T, 32] → samples [T·1024] in this codec's dtype (one shot).

        fixed_order=True sums every conv in a length-independent order (slow; small models).
        """
        latent = self.quantizer.dequantize(codes)  # fp32 values, as the shared fp32 LUT holds them
        return self.decoder.forward(latent.T.unsqueeze(0), fixed_order)[0]

    @torch.no_grad()
    def decode_latent(self, latent, fixed_order=False):
        """latent [T, 32] → samples [T·1024] (no quantization step)."""
        return self.decoder.forward(torch.as_tensor(latent).T.unsqueeze(0), fixed_order)[0]

    def streaming_decoder(self, fixed_order=False):
        return StreamingDecoder(self, fixed_order)

    @torch.no_grad()
    def encode(self, samples):
        """samples [N] at 22050 Hz → (codes int32 [T, 32], latent [T, 32] before FSQ), T = ceil(N/1024).

        The input is taken as fp32 (what a caller hands the C codec) and zero-padded at the end.
        """
        x = torch.as_tensor(np.asarray(samples, dtype=np.float32)).reshape(-1)
        if x.numel() == 0:
            raise ValueError("no samples to encode")
        frames = -(-x.numel() // self.samples_per_frame)
        x = F.pad(x, (0, frames * self.samples_per_frame - x.numel()))
        latent = self.encoder.forward(x.reshape(1, 1, -1).to(self.dtype))[0].T.contiguous()
        return self.quantizer.encode(latent), latent


def load_codec(path, dtype=F64, checkpoint=None):
    """NanoCodec from a .nemo or safetensors file; ``checkpoint`` reuses a read_checkpoint() result."""
    config, state = checkpoint if checkpoint is not None else read_checkpoint(path)
    return NanoCodec(config, state, dtype)
