"""A small NanoCodec for the default voice: architecture, training, export, encoding, evaluation.

The model is NVIDIA NanoCodec's graph (specs/nanocodec.md) at reduced width: the non-causal
``HiFiGANEncoder`` (LeakyReLU 0.01, replicate padding, down rates 2·2·4·8·8), GroupFSQ with 8 groups
of 4 dims and levels (8, 7, 6, 6), and the causal ``CausalHiFiGANDecoder`` (HalfSnake, grouped
causal transposed convs with up rates 8·8·4·2·2, clamp output), 22050 Hz, 1024 samples per frame.
Every conv is weight-normed with torch's parametrization, so the state dict has the published
tensor names (``….conv.parametrizations.weight.original0/1``) in the published order; only the
channel counts differ (defaults: decoder base 160 instead of 864, encoder base 4 instead of 24).
The exported ``.nemo`` therefore loads in gepard-core (and in codec_reference.py) like the
published checkpoint.

Training: random segments of 32 frames (1.5 s) of the espeak-ng speech from
tools/voice/speech.py, straight-through FSQ, multi-resolution STFT loss (spectral convergence +
log magnitude) plus multi-resolution log-mel L1, with --adversarial-weight W also HiFi-GAN's
adversarial losses (multi-period and multi-resolution discriminators, least squares, feature
matching: see Discriminators), AdamW, bf16 autocast on CUDA. A fresh run starts
from a data-dependent init (initialize_from_data) and keeps the FSQ's tanh inputs within ±2
(latent_bound_loss): without both, the narrow encoder's codes collapse to one value per channel
within the first minutes (seen on the GPU: 1.0 distinct codes per channel after 2.5 min, against
6.4 of about 6.75 with them) and the LM then has nothing to learn. The validation line reports
``codes_used``, the distinct codes per channel, to watch for it. Once the encoder is frozen
(--freeze-encoder-after), ``--codes DATA/codes.pt`` trains the decoder on the codes ``encode``
took from whole utterances, the LM's own, instead of running the encoder on every segment: on an
H200 the encoder's share of a step (as many activations as the decoder's) is gone. Training speed
there: 1.8 steps/s at batch 256 × 1.5 s with the encoder (460 segments/s, the same as at batch 64:
the narrow convolutions keep the GPU busy; replaying the step as a CUDA graph gained nothing), 2.3 steps/s from the
codes while the LM trains beside it. All training audio is held in (GPU) memory as int16.
Training is resumable: the checkpoint holds the fp32 weights, AdamW's moments in bf16 (8 bytes per
parameter in all; about 16 MB at the default width, 12.4 MB once the frozen encoder's moments are
dropped), the step and the widths; it is written every --save-minutes and when --time-limit or
--steps is reached.

Subcommands (DATA is the folder speech.py wrote DATA/speech/ into):

    python3 tools/voice/codec.py train DATA --ckpt CKPT [--resume] [--time-limit MIN] [--steps N]
        [--batch 32] [--lr 5e-4] [--decoder-channels 160] [--encoder-channels 4] [--device cuda]
        [--freeze-encoder-after MIN [--codes DATA/codes.pt]] [--init CODEC]
    python3 tools/voice/codec.py export CKPT OUT.nemo
    python3 tools/voice/codec.py encode CODEC DATA [--out DATA/codes.pt] [--limit N]
    python3 tools/voice/codec.py eval CODEC DATA [--out DIR] [--split heldout_speaker] [--limit N]

CKPT is a training checkpoint; CODEC is a training checkpoint or an exported .nemo.
``--resume`` continues from CKPT when it exists (a fresh run otherwise), so every step of a long
training is the same command. ``--init CODEC`` starts a fresh run from CODEC's weights instead of
the data: with ``--freeze-encoder-after 0 --codes DATA/codes.pt`` it tunes a finished codec's
decoder on new speech (more speakers, say) while its encoder, hence every code an LM learned, stays
as it was; given a ``--decoder-channels`` other than CODEC's, the decoder is a new one of that
width (only its last conv's loudness set from the data) on CODEC's encoder and quantizer.

``encode`` writes DATA/codes.pt (torch.save), the input of the GEPARD LM trainer:

    {"format": "gepard-codes-1",
     "sample_rate": 22050, "samples_per_frame": 1024,
     "levels": [8, 7, 6, 6, 8, 7, 6, 6, …],    # 32 ints: FSQ level count of each channel
     "levels_per_group": [8, 7, 6, 6], "num_groups": 8,
     "utterances": [{"id": str, "speaker": str, "text": str, "split": "train" | "heldout_speaker",
                     "codes": torch.uint8 tensor [T, 32]}, …]}

Channel c of a frame belongs to FSQ group c // 4, dimension c % 4; its code k is in 0 … L−1 and
dequantizes to (k − L//2) / (L//2) (nanocodec.md §4), exactly what the C codec and
``gepard-codec-tool decode`` take. T = ceil(samples / 1024): the audio is zero-padded at the end.

``eval`` encodes and decodes whole utterances and prints the multi-resolution STFT distance, the
log-mel L1 distance and the SNR, and writes a few original/decoded wav pairs to --out.

The whole recipe on a GPU host without network or espeak-ng. Here, once:
``tools/voice/espeak-prefix.sh pack``. There, at each step (a fresh machine regenerates the
data in about a minute; corpus and speech are deterministic), with device-prefix/espeak/debs and
the folder holding CKPT carried along:

    eval "$(tools/voice/espeak-prefix.sh env)"
    python3 tools/voice/corpus.py /tmp/voice/corpus --fortunes-dir "$FORTUNES_DIR"
    python3 tools/voice/speech.py /tmp/voice/corpus /tmp/voice/data
    python3 tools/voice/codec.py train /tmp/voice/data --ckpt CKPT --resume --time-limit 20
    python3 tools/voice/codec.py eval CKPT /tmp/voice/data --out /tmp/voice/eval

and at the end ``export CKPT models/…nemo`` and ``encode`` for the LM trainer.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import tarfile
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm

SAMPLE_RATE = 22050
SAMPLES_PER_FRAME = 1024
LATENT_DIM = 32
NUM_GROUPS = 8
LEVELS = (8, 7, 6, 6)
UP_RATES = (8, 8, 4, 2, 2)
DOWN_RATES = (2, 2, 4, 8, 8)
RES_KERNELS = (3, 7, 11)
RES_DILATIONS = (1, 3, 5)
LRELU_SLOPE = 0.01
FSQ_EPS = 1e-3
DEFAULT_DECODER_CHANNELS = 160
DEFAULT_ENCODER_CHANNELS = 4

MODULE_PATH = "nemo.collections.tts.modules.audio_codec_modules"
CHECKPOINT_VERSION = 1


# ---- modules (nanocodec.md §2, §3) ----------------------------------------------------------------


class Snake(nn.Module):
    """x + 1/(α + 1e-9) · sin²(αx), one α per channel (§2.3)."""

    def __init__(self, channels):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x):
        return x + torch.reciprocal(self.alpha + 1e-9) * torch.sin(self.alpha * x).pow(2)


class HalfSnake(nn.Module):
    """Snake on the first C // 2 channels, LeakyReLU(0.01) on the rest (§2.3)."""

    def __init__(self, channels):
        super().__init__()
        self.snake_channels = channels // 2
        self.snake_act = Snake(self.snake_channels)

    def forward(self, x):
        n = self.snake_channels
        return torch.cat([self.snake_act(x[:, :n]), F.leaky_relu(x[:, n:], LRELU_SLOPE)], dim=1)


class Activation(nn.Module):
    """NeMo's CodecActivation: the tensor path is ``….activation.snake_act.alpha``."""

    def __init__(self, kind, channels):
        super().__init__()
        self.activation = HalfSnake(channels) if kind == "half_snake" else nn.LeakyReLU(LRELU_SLOPE)

    def forward(self, x):
        return self.activation(x)


class CausalConv(nn.Module):
    """Stride-1 conv with (k−1)·d zeros on the left only (§2.3)."""

    def __init__(self, in_channels, out_channels, kernel_size, dilation=1):
        super().__init__()
        self.padding = (kernel_size - 1) * dilation
        self.conv = weight_norm(nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation))

    def forward(self, x):
        return self.conv(F.pad(x, (self.padding, 0)))


class CausalConvTranspose(nn.Module):
    """Grouped transposed conv (groups = C_out, kernel 2s, stride s); keeps samples [0, T·s) (§2.3)."""

    def __init__(self, in_channels, out_channels, stride):
        super().__init__()
        self.stride = stride
        self.conv = weight_norm(nn.ConvTranspose1d(in_channels, out_channels, 2 * stride, stride=stride,
                                                   groups=out_channels))

    def forward(self, x):
        return self.conv(x)[..., : x.shape[-1] * self.stride]


class ReplicateConv(nn.Module):
    """Non-causal conv with replicate padding on both sides (§3.4)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, dilation=1, padding=None):
        super().__init__()
        if padding is None:
            padding = (kernel_size - 1) * dilation // 2
        self.conv = weight_norm(nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride,
                                          dilation=dilation, padding=padding, padding_mode="replicate"))

    def forward(self, x):
        return self.conv(x)


class ResidualBlock(nn.Module):
    """x + skip_conv(act(input_conv(act(x)))), the input conv dilated (§2.2)."""

    def __init__(self, channels, kernel_size, dilation, causal):
        super().__init__()
        kind = "half_snake" if causal else "lrelu"
        conv = CausalConv if causal else ReplicateConv
        self.input_activation = Activation(kind, channels)
        self.skip_activation = Activation(kind, channels)
        self.input_conv = conv(channels, channels, kernel_size, dilation=dilation)
        self.skip_conv = conv(channels, channels, kernel_size)

    def forward(self, x):
        h = self.input_conv(self.input_activation(x))
        return x + self.skip_conv(self.skip_activation(h))


class ResBlockChain(nn.Module):
    """NeMo's HiFiGANResBlock: one kernel size, dilations 1, 3, 5 in sequence."""

    def __init__(self, channels, kernel_size, causal):
        super().__init__()
        self.res_blocks = nn.ModuleList(ResidualBlock(channels, kernel_size, d, causal) for d in RES_DILATIONS)

    def forward(self, x):
        for block in self.res_blocks:
            x = block(x)
        return x


class ResLayer(nn.Module):
    """NeMo's HiFiGANResLayer: mean of three parallel chains with kernels 3, 7, 11."""

    def __init__(self, channels, causal):
        super().__init__()
        self.res_blocks = nn.ModuleList(ResBlockChain(channels, k, causal) for k in RES_KERNELS)

    def forward(self, x):
        total = self.res_blocks[0](x)
        for chain in self.res_blocks[1:]:
            total = total + chain(x)
        return total / len(self.res_blocks)


class Encoder(nn.Module):
    """HiFiGANEncoder: waveform [B, 1, N] (N a multiple of 1024) → latent [B, 32, N/1024] (§3.3)."""

    def __init__(self, base_channels):
        super().__init__()
        channels = [base_channels * 2 ** i for i in range(len(DOWN_RATES) + 1)]
        self.pre_conv = ReplicateConv(1, base_channels, 7)
        self.down_sample_conv_layers = nn.ModuleList(
            ReplicateConv(channels[i], channels[i + 1], 2 * r, stride=r, padding=(r + 1) // 2)
            for i, r in enumerate(DOWN_RATES))
        self.res_layers = nn.ModuleList(ResLayer(channels[i], causal=False) for i in range(len(DOWN_RATES)))
        self.post_conv = ReplicateConv(channels[-1], LATENT_DIM, 7)

    def forward(self, audio):
        x = self.pre_conv(audio)
        for res, down in zip(self.res_layers, self.down_sample_conv_layers):
            x = down(F.leaky_relu(res(x), LRELU_SLOPE))
        return self.post_conv(F.leaky_relu(x, LRELU_SLOPE))


class Decoder(nn.Module):
    """CausalHiFiGANDecoder: latent [B, 32, T] → waveform [B, T·1024] in [−1, 1] (§2.2)."""

    def __init__(self, base_channels):
        super().__init__()
        channels = [base_channels // 2 ** i for i in range(len(UP_RATES) + 1)]
        self.pre_conv = CausalConv(LATENT_DIM, base_channels, 7)
        self.activations = nn.ModuleList(Activation("half_snake", channels[i]) for i in range(len(UP_RATES)))
        self.up_sample_conv_layers = nn.ModuleList(
            CausalConvTranspose(channels[i], channels[i + 1], r) for i, r in enumerate(UP_RATES))
        self.res_layers = nn.ModuleList(ResLayer(channels[i + 1], causal=True) for i in range(len(UP_RATES)))
        self.post_activation = Activation("half_snake", channels[-1])
        self.post_conv = CausalConv(channels[-1], 1, 3)

    def forward(self, latent):
        x = self.pre_conv(latent)
        for act, up, res in zip(self.activations, self.up_sample_conv_layers, self.res_layers):
            x = res(up(act(x)))
        x = self.post_conv(self.post_activation(x))
        return torch.clamp(x, -1.0, 1.0)[:, 0]


class FSQ(nn.Module):
    """One FSQ group's buffers, named as NeMo's FiniteScalarQuantizer stores them (§4)."""

    def __init__(self, levels):
        super().__init__()
        bases = np.cumprod((1,) + tuple(levels[:-1]))
        self.register_buffer("dim_base_index", torch.tensor(bases, dtype=torch.int32).reshape(1, -1, 1))
        self.register_buffer("num_levels", torch.tensor(levels, dtype=torch.int32).reshape(1, -1, 1))


class GroupFSQ(nn.Module):
    """GroupFSQ over [B, 32, T]: channel c has L = LEVELS[c % 4]; straight-through rounding (§4)."""

    def __init__(self):
        super().__init__()
        self.fsqs = nn.ModuleList(FSQ(LEVELS) for _ in range(NUM_GROUPS))
        levels = torch.tensor(LEVELS * NUM_GROUPS, dtype=torch.float32)
        scale = (levels - 1) / 2 * (1 - FSQ_EPS)
        offset = torch.where(levels % 2 == 0, 0.5, 0.0)
        self.register_buffer("channel_levels", levels.reshape(1, -1, 1), persistent=False)
        self.register_buffer("scale", scale.reshape(1, -1, 1), persistent=False)
        self.register_buffer("offset", offset.reshape(1, -1, 1), persistent=False)
        self.register_buffer("shift", torch.tan(offset / scale).reshape(1, -1, 1), persistent=False)
        self.register_buffer("half_levels", torch.floor(levels / 2).reshape(1, -1, 1), persistent=False)

    def compress(self, latent):
        return self.scale * torch.tanh(latent.float() + self.shift) - self.offset

    def forward(self, latent):
        """Quantized latent in [−1, 1] with the straight-through gradient, fp32."""
        y = self.compress(latent)
        q = y + (torch.round(y) - y).detach()
        return q / self.half_levels

    def codes(self, latent):
        """Per-channel level indices k = round(y) + L//2 ∈ [0, L), int64 [B, 32, T]."""
        return (torch.round(self.compress(latent)) + self.half_levels).long()

    def dequantize(self, codes):
        return (codes.float() - self.half_levels) / self.half_levels


class NanoCodec(nn.Module):
    """Encoder, quantizer and decoder under the published module names."""

    def __init__(self, decoder_channels=DEFAULT_DECODER_CHANNELS, encoder_channels=DEFAULT_ENCODER_CHANNELS):
        super().__init__()
        if decoder_channels % 32 or decoder_channels // 32 < 2:
            raise ValueError("decoder channels must be a multiple of 32 (halved five times, ≥ 2 at the end)")
        self.decoder_channels = decoder_channels
        self.encoder_channels = encoder_channels
        self.audio_encoder = Encoder(encoder_channels)
        self.vector_quantizer = GroupFSQ()
        self.audio_decoder = Decoder(decoder_channels)

    def forward(self, audio):
        """audio [B, N] → (reconstruction [B, N], latent [B, 32, N/1024])."""
        latent = self.audio_encoder(audio.unsqueeze(1))
        quantized = self.vector_quantizer(latent)
        return self.audio_decoder(quantized.to(latent.dtype)), latent

    @torch.no_grad()
    def encode(self, audio):
        """audio [B, N] (N a multiple of 1024) → codes int64 [B, 32, T], evaluated in fp32."""
        return self.vector_quantizer.codes(self.audio_encoder(audio.float().unsqueeze(1)))

    @torch.no_grad()
    def decode(self, codes):
        """codes [B, 32, T] → waveform [B, T·1024]."""
        return self.audio_decoder(self.vector_quantizer.dequantize(codes))

    def widths(self):
        return {"decoder_channels": self.decoder_channels, "encoder_channels": self.encoder_channels}

    def model_config_yaml(self):
        """model_config.yaml with every constructor argument, as gepard-core writes and reads it (§5)."""

        def ints(values):
            return "[" + ", ".join(str(v) for v in values) + "]"

        return "\n".join([
            "target: nemo.collections.tts.models.audio_codec.AudioCodecModel",
            f"sample_rate: {SAMPLE_RATE}",
            f"samples_per_frame: {SAMPLES_PER_FRAME}",
            "audio_encoder:",
            f"  _target_: {MODULE_PATH}.HiFiGANEncoder",
            f"  encoded_dim: {LATENT_DIM}",
            f"  down_sample_rates: {ints(DOWN_RATES)}",
            f"  base_channels: {self.encoder_channels}",
            "  in_kernel_size: 7",
            "  out_kernel_size: 7",
            f"  resblock_kernel_sizes: {ints(RES_KERNELS)}",
            f"  resblock_dilation_sizes: {ints(RES_DILATIONS)}",
            "  activation: lrelu",
            "  pad_mode: replicate",
            "vector_quantizer:",
            f"  _target_: {MODULE_PATH}.GroupFiniteScalarQuantizer",
            f"  num_groups: {NUM_GROUPS}",
            f"  num_levels_per_group: {ints(LEVELS)}",
            "audio_decoder:",
            f"  _target_: {MODULE_PATH}.CausalHiFiGANDecoder",
            f"  input_dim: {LATENT_DIM}",
            f"  up_sample_rates: {ints(UP_RATES)}",
            f"  base_channels: {self.decoder_channels}",
            "  in_kernel_size: 7",
            "  out_kernel_size: 3",
            f"  resblock_kernel_sizes: {ints(RES_KERNELS)}",
            f"  resblock_dilation_sizes: {ints(RES_DILATIONS)}",
            "  activation: half_snake",
            "  output_activation: clamp",
            "  pad_mode: zeros",
            "  n_groups_equal_to_out_channels: true",
            "",
        ])


def parameter_count(module):
    return sum(p.numel() for p in module.parameters())


# ---- .nemo files (§5) --------------------------------------------------------------------------------


def export_nemo(model, path):
    """Uncompressed tar: ./, ./model_config.yaml, ./model_weights.ckpt (torch.save of the state dict)."""
    state = {k: v.detach().to("cpu", torch.float32 if v.is_floating_point() else v.dtype).contiguous()
             for k, v in model.state_dict().items()}
    weights = io.BytesIO()
    torch.save(state, weights)
    config = model.model_config_yaml().encode("utf-8")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    now = int(time.time())
    with tarfile.open(tmp, "w:", format=tarfile.USTAR_FORMAT) as tar:
        root = tarfile.TarInfo("./")
        root.type, root.mode, root.mtime = tarfile.DIRTYPE, 0o755, now
        tar.addfile(root)
        for name, data in (("./model_config.yaml", config), ("./model_weights.ckpt", weights.getvalue())):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)


TRAINING_ONLY_PREFIXES = ("discriminator.", "mel_loss_fn.", "stft_loss_fn.")


def read_nemo(path):
    """(widths, state dict) of a .nemo written by export_nemo (or any file of the same layout; the
    published checkpoint's training-only tensors, "discriminator." and the losses', are left out)."""
    import yaml

    with tarfile.open(path, "r:*") as tar:
        members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
        config = yaml.safe_load(tar.extractfile(members["model_config.yaml"]).read().decode("utf-8"))
        state = torch.load(io.BytesIO(tar.extractfile(members["model_weights.ckpt"]).read()),
                           map_location="cpu", weights_only=True)
    state = {k: v for k, v in state.items() if not k.startswith(TRAINING_ONLY_PREFIXES)}
    widths = {"decoder_channels": int(config["audio_decoder"]["base_channels"]),
              "encoder_channels": int(config["audio_encoder"]["base_channels"])}
    return widths, state


def load_codec(path, device="cpu"):
    """NanoCodec from a training checkpoint or a .nemo, in eval mode."""
    if tarfile.is_tarfile(str(path)):
        widths, state = read_nemo(path)
    else:
        ckpt = torch.load(str(path), map_location="cpu", weights_only=True)
        widths, state = ckpt["widths"], ckpt["model"]
    model = NanoCodec(**widths)
    model.load_state_dict(state)
    return model.to(device).eval()


# ---- training checkpoints ---------------------------------------------------------------------------


def adamw_moments(module, optimizer):
    """(exp_avg, exp_avg_sq): each parameter's AdamW moments in bf16, None where it has none."""
    exp_avg, exp_avg_sq = [], []
    for p in module.parameters():
        state = optimizer.state.get(p, {}) if p.requires_grad else {}  # a frozen encoder's are not kept
        exp_avg.append(state["exp_avg"].to("cpu", torch.bfloat16) if state else None)
        exp_avg_sq.append(state["exp_avg_sq"].to("cpu", torch.bfloat16) if state else None)
    return exp_avg, exp_avg_sq


def restore_adamw_moments(module, optimizer, exp_avg, exp_avg_sq, step):
    for p, m, v in zip(module.parameters(), exp_avg, exp_avg_sq):
        if m is not None:
            optimizer.state[p] = {"step": torch.tensor(float(step)),
                                  "exp_avg": m.to(p.device, torch.float32),
                                  "exp_avg_sq": v.to(p.device, torch.float32)}


def save_checkpoint(path, model, optimizer, progress, critic=None):
    """fp32 weights, AdamW moments in bf16, the progress dict (step, trained_s, plan) and widths,
    and where given the discriminators and their optimizer (critic = (Discriminators, AdamW)) alike;
    written atomically."""
    exp_avg, exp_avg_sq = adamw_moments(model, optimizer)
    ckpt = {
        "version": CHECKPOINT_VERSION,
        "widths": model.widths(),
        **progress,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "exp_avg": exp_avg,
        "exp_avg_sq": exp_avg_sq,
    }
    if critic is not None:
        discriminators, critic_optimizer = critic
        ckpt["discriminators"] = {k: v.detach().cpu() for k, v in discriminators.state_dict().items()}
        ckpt["discriminators_exp_avg"], ckpt["discriminators_exp_avg_sq"] = adamw_moments(discriminators,
                                                                                         critic_optimizer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


PROGRESS_DEFAULTS = {"step": 0, "trained_s": 0.0, "total_steps": 100000, "minutes": None,
                     "freeze_encoder_after": None, "finished": False}


def restore_checkpoint(path, model, optimizer, critic=None):
    """Loads weights and moments into model/optimizer, and into the critic (see save_checkpoint)
    where it is given and the checkpoint has one (else it starts afresh); returns the progress dict."""
    ckpt = torch.load(str(path), map_location="cpu", weights_only=True)
    if ckpt.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{path}: checkpoint version {ckpt.get('version')}, expected {CHECKPOINT_VERSION}")
    model.load_state_dict(ckpt["model"])
    progress = {k: ckpt.get(k, v) for k, v in PROGRESS_DEFAULTS.items()}
    restore_adamw_moments(model, optimizer, ckpt["exp_avg"], ckpt["exp_avg_sq"], progress["step"])
    if critic is not None and "discriminators" in ckpt:
        discriminators, critic_optimizer = critic
        discriminators.load_state_dict(ckpt["discriminators"])
        restore_adamw_moments(discriminators, critic_optimizer, ckpt["discriminators_exp_avg"],
                              ckpt["discriminators_exp_avg_sq"], progress["step"])
    return progress


# ---- losses -----------------------------------------------------------------------------------------


def mel_filterbank(n_fft, n_mels, sample_rate=SAMPLE_RATE, f_min=0.0, f_max=None):
    """[n_mels, n_fft//2 + 1] triangular filters on the HTK mel scale."""
    f_max = f_max or sample_rate / 2

    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2))
    lower = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    upper = (edges[2:, None] - freqs[None, :]) / (edges[2:, None] - edges[1:-1, None])
    return torch.tensor(np.maximum(0.0, np.minimum(lower, upper)), dtype=torch.float32)


class SpectralLoss(nn.Module):
    """Multi-resolution STFT loss (spectral convergence + log magnitude L1) and log-mel L1."""

    RESOLUTIONS = ((512, 128, 40), (1024, 256, 80), (2048, 512, 128))  # n_fft, hop, mels

    def __init__(self):
        super().__init__()
        for n_fft, _, n_mels in self.RESOLUTIONS:
            self.register_buffer(f"window_{n_fft}", torch.hann_window(n_fft), persistent=False)
            self.register_buffer(f"mel_{n_fft}", mel_filterbank(n_fft, n_mels), persistent=False)

    def magnitude(self, x, n_fft, hop):
        spec = torch.stft(x, n_fft, hop, window=getattr(self, f"window_{n_fft}"), return_complex=True)
        return spec.abs().clamp_min(1e-7)

    def forward(self, pred, target):
        """pred, target [B, N] fp32 → dict of scalar losses (averaged over resolutions)."""
        sc = logmag = mel = 0.0
        for n_fft, hop, _ in self.RESOLUTIONS:
            p, t = self.magnitude(pred, n_fft, hop), self.magnitude(target, n_fft, hop)
            sc = sc + torch.linalg.norm(t - p) / torch.linalg.norm(t).clamp_min(1e-7)
            logmag = logmag + F.l1_loss(torch.log(p), torch.log(t))
            fb = getattr(self, f"mel_{n_fft}")
            mel = mel + F.l1_loss(torch.log(fb @ p + 1e-5), torch.log(fb @ t + 1e-5))
        n = len(self.RESOLUTIONS)
        return {"sc": sc / n, "logmag": logmag / n, "mel": mel / n}


def snr_db(reference, estimate):
    noise = (reference - estimate).pow(2).sum()
    return float(10 * torch.log10(reference.pow(2).sum() / noise.clamp_min(1e-12)))


# Adversarial losses (HiFi-GAN's, training only; off unless --adversarial-weight): discriminators
# that tell the decoder's output from the speech, a multi-period one (the waveform folded by 2, 3,
# 5, 7 and 11 samples, 2-D convs along time) and a multi-resolution one (2-D convs over log-magnitude
# STFTs), least-squares GAN losses and feature matching (the L1 distance of their inner features on
# the decoder's output and on the speech). Trained on the spectral losses alone, the default voice's
# decoder passes espeak-ng's speech with most of the words a recognizer hears in it lost (its word
# error rate in docs/voice.md), though not for its balance across frequencies: the fine structure
# those losses do not see is what the discriminators judge.


def scored(convs, post, h):
    """A discriminator's convs (LeakyReLU 0.1 after each) and its scoring conv over h → (scores [B, …],
    the convs' outputs: the inner features)."""
    features = []
    for conv in convs:
        h = F.leaky_relu(conv(h), 0.1)
        features.append(h)
    return post(h).flatten(1), features


class PeriodDiscriminator(nn.Module):
    def __init__(self, period, channels=(16, 64, 128, 128)):
        super().__init__()
        self.period = period
        widths = (1,) + channels
        self.convs = nn.ModuleList(
            nn.utils.parametrizations.weight_norm(nn.Conv2d(a, b, (5, 1), (3, 1), padding=(2, 0)))
            for a, b in zip(widths, widths[1:]))
        self.post = nn.utils.parametrizations.weight_norm(nn.Conv2d(channels[-1], 1, (3, 1), padding=(1, 0)))

    def forward(self, x):
        """x [B, N] → (scores [B, …], inner features)."""
        pad = -x.shape[-1] % self.period
        x = F.pad(x, (0, pad), mode="reflect") if pad else x
        h = x.reshape(x.shape[0], 1, -1, self.period)
        return scored(self.convs, self.post, h)


class ResolutionDiscriminator(nn.Module):
    def __init__(self, n_fft, hop, channels=32):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)
        shapes = [(1, channels, (3, 9), (1, 1), (1, 4))] + [(channels, channels, (3, 9), (1, 2), (1, 4))] * 3 + \
            [(channels, channels, (3, 3), (1, 1), (1, 1))]
        self.convs = nn.ModuleList(nn.utils.parametrizations.weight_norm(nn.Conv2d(a, b, k, st, padding=pd))
                                   for a, b, k, st, pd in shapes)
        self.post = nn.utils.parametrizations.weight_norm(nn.Conv2d(channels, 1, (3, 3), padding=(1, 1)))

    def forward(self, x):
        """x [B, N] → (scores [B, …], inner features)."""
        spec = torch.stft(x.float(), self.n_fft, self.hop, window=self.window, return_complex=True)
        h = torch.log(spec.abs().clamp_min(1e-5)).transpose(1, 2).unsqueeze(1)  # [B, 1, frames, bins]
        return scored(self.convs, self.post, h)


class Discriminators(nn.Module):
    PERIODS = (2, 3, 5, 7, 11)
    RESOLUTIONS = ((512, 128), (1024, 256), (2048, 512))

    def __init__(self):
        super().__init__()
        self.period = nn.ModuleList(PeriodDiscriminator(p) for p in self.PERIODS)
        self.resolution = nn.ModuleList(ResolutionDiscriminator(n, h) for n, h in self.RESOLUTIONS)

    def forward(self, x):
        """x [B, N] → [(scores, features)] of each discriminator."""
        return [d(x) for d in (*self.period, *self.resolution)]


def discriminator_loss(real, fake):
    """Least squares: the speech's scores towards 1, the decoder's towards 0, summed over discriminators."""
    return sum(torch.mean((r - 1).pow(2)) + torch.mean(f.pow(2)) for (r, _), (f, _) in zip(real, fake))


def generator_losses(real, fake):
    """(adversarial, feature matching) for the decoder: its scores towards 1, and the mean L1 distance
    of each discriminator's inner features on its output from those on the speech, summed over
    discriminators."""
    adversarial = sum(torch.mean((f - 1).pow(2)) for f, _ in fake)
    matching = sum(sum(F.l1_loss(a, b.detach()) for a, b in zip(fa, ra)) / len(fa)
                   for (_, ra), (_, fa) in zip(real, fake))
    return adversarial, matching


def conv_output(conv, run):
    """conv's (first) output while run() runs the model."""
    seen = {}
    hook = conv.register_forward_hook(lambda module, inputs, output: seen.setdefault("out", output))
    run()
    hook.remove()
    return seen["out"]


@torch.no_grad()
def initialize_from_data(model, audio, passes=2):
    """Data-dependent start (layer-sequential unit variance): each encoder conv's weight-norm gain
    and bias are set so that its output over ``audio`` [B, N] has zero mean and unit deviation, and
    the decoder's last conv so that its output is as loud as the audio. With torch's default init
    the narrow encoder's latent barely varies over time (deviation ~1e-4), every code is the same
    from the first step, the decoder learns to ignore them and the encoder never recovers."""
    x = audio.unsqueeze(1)

    convs = [m for m in model.audio_encoder.modules() if isinstance(m, nn.Conv1d)]
    for _ in range(passes):
        for conv in convs:
            out = conv_output(conv, lambda: model.audio_encoder(x))
            std = float(out.std()) + 1e-8
            conv.parametrizations.weight.original0.mul_(1.0 / std)
            conv.bias.sub_(out.mean(dim=(0, 2))).div_(std)
    initialize_decoder_from_data(model, audio)


@torch.no_grad()
def initialize_decoder_from_data(model, audio):
    """The decoder's last conv set so that its output over ``audio`` [B, N] is as loud as the audio."""
    post = model.audio_decoder.post_conv.conv
    latent = model.audio_encoder(audio.unsqueeze(1))
    out = conv_output(post, lambda: model.audio_decoder(model.vector_quantizer(latent)))
    scale = float(audio.std()) / (float(out.std()) + 1e-8)
    post.parametrizations.weight.original0.mul_(scale)
    post.bias.copy_(-scale * (out.mean(dim=(0, 2)) - post.bias))  # no offset: HalfSnake's sin² has one


def with_new_decoder(model, decoder_channels):
    """A codec with ``model``'s encoder and quantizer (so its codes) and a new decoder of another
    width, torch's default init, for a decoder trained anew on the codes an LM already learned."""
    fresh = NanoCodec(decoder_channels=decoder_channels, encoder_channels=model.encoder_channels)
    fresh.audio_encoder.load_state_dict(model.audio_encoder.state_dict())
    fresh.vector_quantizer.load_state_dict(model.vector_quantizer.state_dict())
    return fresh


def codes_used(model, audio):
    """Distinct codes per channel over ``audio`` [B, N], averaged over the 32 channels (of 6–8 levels):
    1.0 is a collapsed encoder whose codes carry nothing."""
    codes = model.encode(audio)
    return sum(len(torch.unique(codes[:, c])) for c in range(codes.shape[1])) / codes.shape[1]


def latent_bound_loss(quantizer, latent, bound):
    """Mean squared excess of the FSQ's tanh input beyond ±bound. The straight-through gradient
    keeps pushing saturated latents outward, and Adam turns the vanishing tanh slope into full
    steps, so without this the latents run off to where every code is an extreme and stays one."""
    return F.relu((latent.float() + quantizer.shift).abs() - bound).pow(2).mean()


# ---- data ---------------------------------------------------------------------------------------


def read_index(data_dir, split=None):
    rows = []
    with open(Path(data_dir) / "speech" / "index.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if split is None or row.get("split", "train") == split:
                    rows.append(row)
    return rows


def read_wav_int16(path):
    with wave.open(str(path), "rb") as w:
        if w.getframerate() != SAMPLE_RATE or w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16-bit mono {SAMPLE_RATE} Hz")
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def write_wav(path, samples):
    pcm = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes((pcm * 32767.0).round().astype("<i2").tobytes())


def load_audio(data_dir, rows, workers=16):
    """All utterances of ``rows`` as one int16 array plus (offset, length) per utterance."""
    base = Path(data_dir) / "speech"
    with ThreadPoolExecutor(workers) as pool:
        clips = list(pool.map(lambda r: read_wav_int16(base / r["path"]), rows))
    lengths = np.array([c.size for c in clips], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return np.concatenate(clips), offsets, lengths


class SegmentSampler:
    """Random segments of whole frames from audio held on one device, zero past an utterance's end."""

    def __init__(self, audio, offsets, lengths, device, seed):
        self.audio = torch.from_numpy(audio).to(device)
        self.offsets = torch.from_numpy(offsets).to(device)
        self.lengths = torch.from_numpy(lengths).to(device)
        self.device = device
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    def sample(self, batch, min_frames, max_frames):
        frames = int(torch.randint(min_frames, max_frames + 1, (1,), generator=self.generator))
        length = frames * SAMPLES_PER_FRAME
        pick = torch.randint(0, self.lengths.numel(), (batch,), generator=self.generator).to(self.device)
        room = (self.lengths[pick] - length).clamp_min(0)
        start = (torch.rand(batch, generator=self.generator).to(self.device) * (room + 1)).long()
        return self.audio_at(pick, start, length)

    def audio_at(self, pick, start, length):
        """Samples start … start + length − 1 of the utterances ``pick`` (device tensors [B]), zero
        past their ends, as float [B, length]."""
        pos = start[:, None] + torch.arange(length, device=self.device)[None, :]
        valid = pos < self.lengths[pick][:, None]
        index = (self.offsets[pick][:, None] + pos).clamp_max(self.audio.numel() - 1)
        x = torch.where(valid, self.audio[index], torch.zeros((), dtype=self.audio.dtype, device=self.device))
        return x.float() / 32768.0


class CodeSegmentSampler:
    """Random segments of ``frames`` frames as (codes [B, 32, F], audio [B, F·1024]): the codes the
    frozen encoder gave each whole utterance (``codec.py encode``) and the audio they stand for, read
    from ``segments`` (the SegmentSampler of ``rows``, whose audio is on the device already).
    Utterances shorter than a segment are left out."""

    def __init__(self, codes_path, segments, rows, frames, seed):
        payload = torch.load(str(codes_path), map_location="cpu", weights_only=False)
        by_id = {u["id"]: u["codes"] for u in payload["utterances"]}
        keep = [i for i, r in enumerate(rows) if r["id"] in by_id and by_id[r["id"]].shape[0] >= frames]
        if not keep:
            raise SystemExit(f"codec: no utterance of {codes_path} has {frames} frames")
        codes = [torch.as_tensor(by_id[rows[i]["id"]]) for i in keep]
        self.segments = segments
        self.device = segments.device
        self.utterances = torch.tensor(keep, device=self.device)  # rows of segments' table
        self.frames = frames
        self.codes = torch.cat(codes).to(self.device)  # uint8 [ΣT, 32]
        counts = torch.tensor([c.shape[0] for c in codes])
        self.code_offsets = (torch.cumsum(counts, 0) - counts).to(self.device)
        self.code_counts = counts.to(self.device)
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    def sample(self, batch):
        pick = torch.randint(0, len(self.utterances), (batch,), generator=self.generator).to(self.device)
        room = self.code_counts[pick] - self.frames
        start = (torch.rand(batch, generator=self.generator).to(self.device) * (room + 1)).long()
        frame = start[:, None] + torch.arange(self.frames, device=self.device)[None, :]
        codes = self.codes[self.code_offsets[pick][:, None] + frame].transpose(1, 2).long()
        x = self.segments.audio_at(self.utterances[pick], start * SAMPLES_PER_FRAME,
                                   self.frames * SAMPLES_PER_FRAME)
        return codes, x


def validation_batch(data_dir, device, count=16, frames=43):
    """The first ``frames`` frames of the held-out speaker's first utterances (zero-padded), or None."""
    rows = read_index(data_dir, "heldout_speaker")[:count]
    if not rows:
        return None
    audio, offsets, lengths = load_audio(data_dir, rows)
    x = np.zeros((len(rows), frames * SAMPLES_PER_FRAME), dtype=np.float32)
    for i, (offset, length) in enumerate(zip(offsets, lengths)):
        n = min(int(length), x.shape[1])
        x[i, :n] = audio[offset: offset + n] / 32768.0
    return torch.from_numpy(x).to(device)


# ---- subcommands --------------------------------------------------------------------------------


def pick_device(name):
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def exact_fp32():
    """No TF32 in convs and matmuls: codes and metrics as the C codec computes them (fp32)."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def learning_rate(step, base, warmup, progress):
    """Linear warmup over ``warmup`` steps, then cosine decay to 10 % of base as ``progress`` goes 0 → 1."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, max(0.0, progress))
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(args):
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    ckpt_path = Path(args.ckpt)
    resuming = args.resume and ckpt_path.exists()
    initialized = resuming or bool(args.init)  # else from the data, below
    new_decoder = False  # --init with another decoder width: the decoder's loudness from the data, below
    if resuming:
        widths = torch.load(str(ckpt_path), map_location="cpu", weights_only=True)["widths"]
        model = NanoCodec(**widths)
    elif args.init:
        model = load_codec(args.init)  # its widths and weights
        widths = model.widths()
        if args.decoder_channels not in (None, widths["decoder_channels"]):
            widths["decoder_channels"] = args.decoder_channels
            model = with_new_decoder(model, args.decoder_channels)
            new_decoder = True
            print(f"codec: a new run with the encoder of {args.init} and a new decoder {args.decoder_channels} "
                  "channels wide")
        else:
            print(f"codec: a new run from the weights of {args.init}")
    else:
        widths = {"decoder_channels": args.decoder_channels or DEFAULT_DECODER_CHANNELS,
                  "encoder_channels": args.encoder_channels}
        model = NanoCodec(**widths)
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.8, 0.99), weight_decay=0.01)
    critic = None
    if args.adversarial_weight > 0:
        discriminators = Discriminators().to(device)
        critic = (discriminators, torch.optim.AdamW(discriminators.parameters(), lr=args.lr, betas=(0.8, 0.99),
                                                    weight_decay=0.01))
        print(f"codec: adversarial losses (weight {args.adversarial_weight:g}, feature matching "
              f"{args.feature_weight:g}), discriminators of {parameter_count(discriminators)} parameters")
    progress = dict(PROGRESS_DEFAULTS)
    if resuming:
        progress.update(restore_checkpoint(ckpt_path, model, optimizer, critic))
        print(f"codec: resumed {ckpt_path} at step {progress['step']} ({progress['trained_s'] / 60:.1f} min trained)")
    # the plan: a new run takes it from the options; a resumed one keeps its own unless given a new one
    if not resuming or args.minutes is not None or args.total_steps is not None:
        progress["minutes"] = args.minutes
        progress["total_steps"] = args.total_steps if args.total_steps is not None else 100000
    if args.freeze_encoder_after is not None:
        progress["freeze_encoder_after"] = args.freeze_encoder_after
    print(f"codec: {parameter_count(model.audio_encoder)} encoder + {parameter_count(model.audio_decoder)} "
          f"decoder parameters, widths {widths}, device {device}")

    rows = read_index(args.data, "train")
    if args.limit:
        rows = rows[: args.limit]
    t0 = time.time()
    audio, offsets, lengths = load_audio(args.data, rows)
    print(f"codec: {len(rows)} utterances, {audio.size / SAMPLE_RATE / 3600:.2f} h loaded in {time.time() - t0:.1f} s")
    sampler = SegmentSampler(audio, offsets, lengths, device, args.seed + progress["step"])
    if not initialized:
        initialize_from_data(model, sampler.sample(min(args.batch, 16), args.min_frames, args.min_frames))
    elif new_decoder:
        initialize_decoder_from_data(model, sampler.sample(min(args.batch, 16), args.min_frames, args.min_frames))
    loss_fn = SpectralLoss().to(device)
    valid_batch = validation_batch(args.data, device)
    use_bf16 = device.type == "cuda"
    torch.backends.cudnn.benchmark = True

    def report_validation():
        if valid_batch is None:
            return
        model.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            y, _ = model(valid_batch)
        losses = loss_fn(y.float(), valid_batch)
        model.train()
        print(f"step {progress['step']} valid (held-out speaker) "
              + " ".join(f"{k} {float(v):.4f}" for k, v in losses.items())
              + f" snr_db {snr_db(valid_batch, y.float()):.2f} codes_used {codes_used(model, valid_batch):.2f}",
              flush=True)

    def encoder_frozen():
        after = progress["freeze_encoder_after"]
        return after is not None and progress["trained_s"] >= after * 60

    def plan_done():
        if progress["minutes"]:
            return progress["trained_s"] >= progress["minutes"] * 60
        return progress["step"] >= progress["total_steps"]

    def schedule():
        if progress["minutes"]:
            return progress["trained_s"] / (progress["minutes"] * 60)
        return (progress["step"] - args.warmup) / max(1, progress["total_steps"] - args.warmup)

    def set_lr(lr):
        for group in optimizer.param_groups + (critic[1].param_groups if critic else []):
            group["lr"] = lr

    def critic_step(x, y):
        """One AdamW step of the discriminators on speech x and the decoder's output y; the decoder's
        (adversarial, feature matching) losses from them."""
        discriminators, critic_optimizer = critic
        critic_optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            real = discriminators(x)
            d_loss = discriminator_loss(real, discriminators(y.detach()))
        d_loss.float().backward()
        torch.nn.utils.clip_grad_norm_(discriminators.parameters(), args.clip)
        critic_optimizer.step()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            with torch.no_grad():
                real = discriminators(x)
            adversarial, matching = generator_losses(real, discriminators(y))
        return d_loss.detach(), adversarial.float(), matching.float()

    def step_on(x, codes=None):
        """Forward, losses, backward, clip and AdamW on batch x (decoded from codes where given);
        no host synchronisation."""
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            if codes is None:
                y, latent = model(x)
            else:
                y = model.audio_decoder(model.vector_quantizer.dequantize(codes))
        losses = loss_fn(y.float(), x)
        if codes is None:
            losses["bound"] = latent_bound_loss(model.vector_quantizer, latent, args.latent_bound)
        else:
            losses["bound"] = torch.zeros((), device=device)
        loss = losses["sc"] + losses["logmag"] + args.mel_weight * losses["mel"] + args.bound_weight * losses["bound"]
        if critic is not None:
            losses["critic"], losses["adversarial"], losses["matching"] = critic_step(x, y.float())
            loss = loss + args.adversarial_weight * (losses["adversarial"] + args.feature_weight * losses["matching"])
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        return {**losses, "loss": loss, "grad": grad_norm}

    code_sampler = None

    def one_step(lr):
        nonlocal code_sampler
        set_lr(lr)
        if frozen and args.codes:
            # the encoder no longer changes: the decoder learns from its codes of whole utterances
            # (those the LM learns from) and no encoder runs
            if code_sampler is None:
                code_sampler = CodeSegmentSampler(args.codes, sampler, rows, args.max_frames,
                                                  args.seed + progress["step"])
                print(f"codec: the decoder trains on the codes in {args.codes} "
                      f"({len(code_sampler.utterances)} utterances)", flush=True)
            codes, x = code_sampler.sample(args.batch)
            optimizer.zero_grad(set_to_none=True)
            return step_on(x, codes)
        x = sampler.sample(args.batch, args.min_frames, args.max_frames)
        optimizer.zero_grad(set_to_none=True)
        return step_on(x)

    start = time.time()
    trained_before = progress["trained_s"]
    last_save = last_log = start
    log_sums, log_count = {}, 0
    model.train()
    frozen = None
    why = "time limit"
    while True:
        progress["trained_s"] = trained_before + time.time() - start
        if plan_done():
            progress["finished"], why = True, "end of the plan"
            break
        if args.steps is not None and progress["step"] >= args.steps:
            why = "--steps"
            break
        if args.until_minutes is not None and progress["trained_s"] >= args.until_minutes * 60:
            why = "--until-minutes"
            break
        if args.time_limit and time.time() - start >= args.time_limit * 60:
            break
        if encoder_frozen() != frozen:
            frozen = encoder_frozen()
            for p in model.audio_encoder.parameters():
                p.requires_grad_(not frozen)  # frozen: the codes the LM learns from stay valid
                p.grad = None
            if frozen:
                print(f"codec: encoder frozen from step {progress['step']}", flush=True)
        lr = learning_rate(progress["step"], args.lr, args.warmup, schedule())
        stats = one_step(lr)
        progress["step"] += 1
        for k, v in stats.items():
            log_sums[k] = log_sums.get(k, 0.0) + v.detach()  # summed on the device: no sync per step
        log_count += 1
        if progress["step"] % args.log_every == 0:
            means = " ".join(f"{k} {float(v) / log_count:.4f}" for k, v in log_sums.items())
            rate = log_count / max(1e-9, time.time() - last_log)
            last_log = time.time()
            print(f"step {progress['step']} lr {lr:.2e} {means} ({rate:.1f} steps/s)", flush=True)
            log_sums, log_count = {}, 0
        if time.time() - last_save >= args.save_minutes * 60:
            save_checkpoint(ckpt_path, model, optimizer, progress, critic)
            report_validation()
            last_save = time.time()
    save_checkpoint(ckpt_path, model, optimizer, progress, critic)
    report_validation()
    print(f"codec: {'finished' if progress['finished'] else 'stopped'} ({why}) at step {progress['step']}, "
          f"{progress['trained_s'] / 60:.1f} min trained; saved {ckpt_path} "
          f"({os.path.getsize(ckpt_path) / 2**20:.1f} MiB)")
    return progress["step"]


def export(args):
    model = load_codec(args.codec)
    export_nemo(model, args.out)
    print(f"codec: wrote {args.out} ({os.path.getsize(args.out) / 2**20:.2f} MiB, "
          f"{parameter_count(model)} parameters, widths {model.widths()})")


def pad_to_frames(samples):
    frames = max(1, -(-samples.shape[-1] // SAMPLES_PER_FRAME))
    return F.pad(samples, (0, frames * SAMPLES_PER_FRAME - samples.shape[-1]))


def encode_rows(model, data_dir, rows, device, batch_frames=32768):
    """Codes uint8 [T, 32] per row; utterances of equal frame count are encoded together."""
    audio, offsets, lengths = load_audio(data_dir, rows)
    frames = -(-lengths // SAMPLES_PER_FRAME)
    codes = [None] * len(rows)
    for t in np.unique(frames):
        members = np.flatnonzero(frames == t)
        per_batch = max(1, batch_frames // int(t))
        for b in range(0, members.size, per_batch):
            chunk = members[b: b + per_batch]
            x = torch.zeros(chunk.size, int(t) * SAMPLES_PER_FRAME)
            for j, i in enumerate(chunk):
                piece = audio[offsets[i]: offsets[i] + lengths[i]]
                x[j, : lengths[i]] = torch.from_numpy(piece.astype(np.float32) / 32768.0)
            c = model.encode(x.to(device)).transpose(1, 2).to("cpu", torch.uint8)
            for j, i in enumerate(chunk):
                codes[i] = c[j].contiguous()
    return codes


def encode(args):
    device = pick_device(args.device)
    exact_fp32()
    model = load_codec(args.codec, device)
    rows = read_index(args.data)
    if args.limit:
        rows = rows[: args.limit]
    t0 = time.time()
    codes = encode_rows(model, args.data, rows, device)
    out = Path(args.out) if args.out else Path(args.data) / "codes.pt"
    payload = {
        "format": "gepard-codes-1",
        "sample_rate": SAMPLE_RATE,
        "samples_per_frame": SAMPLES_PER_FRAME,
        "levels": list(LEVELS) * NUM_GROUPS,
        "levels_per_group": list(LEVELS),
        "num_groups": NUM_GROUPS,
        "utterances": [{"id": r["id"], "speaker": r["speaker"], "text": r["text"],
                        "split": r.get("split", "train"), "codes": c} for r, c in zip(rows, codes)],
    }
    torch.save(payload, out)
    total = sum(c.shape[0] for c in codes)
    print(f"codec: {len(rows)} utterances, {total} frames encoded in {time.time() - t0:.1f} s → {out}")


@torch.no_grad()
def evaluate(args):
    device = pick_device(args.device)
    exact_fp32()
    model = load_codec(args.codec, device)
    rows = read_index(args.data, args.split)[: args.limit]
    if not rows:
        raise SystemExit(f"codec: no utterances with split {args.split}")
    loss_fn = SpectralLoss().to(device)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    base = Path(args.data) / "speech"
    totals = {"sc": 0.0, "logmag": 0.0, "mel": 0.0, "snr_db": 0.0}
    for i, row in enumerate(rows):
        x = torch.from_numpy(read_wav_int16(base / row["path"]).astype(np.float32) / 32768.0)
        x = pad_to_frames(x)[None].to(device)
        y = model.decode(model.encode(x))
        losses = loss_fn(y, x)
        for k in ("sc", "logmag", "mel"):
            totals[k] += float(losses[k])
        totals["snr_db"] += snr_db(x, y)
        if out and i < args.wavs:
            write_wav(out / f"{row['id']}-original.wav", x[0].cpu().numpy())
            write_wav(out / f"{row['id']}-decoded.wav", y[0].cpu().numpy())
    means = {k: v / len(rows) for k, v in totals.items()}
    print(f"codec eval on {len(rows)} {args.split} utterances: " + " ".join(f"{k} {v:.4f}" for k, v in means.items()))
    return means


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train (or resume) on DATA/speech")
    p.add_argument("data")
    p.add_argument("--ckpt", required=True, help="checkpoint file to write (and to resume from)")
    p.add_argument("--resume", action="store_true", help="continue from --ckpt when it exists")
    p.add_argument("--init", metavar="CODEC",
                   help="a new run starts from this codec's weights (a .nemo or a checkpoint; its widths), "
                        "not from the data; with --freeze-encoder-after 0 it tunes the decoder alone, or with "
                        "another --decoder-channels trains a new one")
    p.add_argument("--time-limit", type=float, default=0, help="minutes of training in this run, then save and stop")
    p.add_argument("--steps", type=int, help="stop at this total step count (0: just write the initial checkpoint)")
    p.add_argument("--total-steps", type=int,
                   help="the plan: the whole training's length in steps, the end of the cosine decay (default 100000)")
    p.add_argument("--minutes", type=float,
                   help="the plan in minutes of training time instead of steps (kept in the checkpoint)")
    p.add_argument("--until-minutes", type=float, help="stop once the training has run this many minutes in all")
    p.add_argument("--freeze-encoder-after", type=float, metavar="MIN",
                   help="train the decoder alone once the training has run MIN minutes in all (codes stay fixed)")
    p.add_argument("--codes", metavar="CODES_PT",
                   help="once the encoder is frozen, train the decoder on these codes of whole utterances "
                        "(codec.py encode's output) instead of running the encoder on each segment")
    p.add_argument("--save-minutes", type=float, default=5.0)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--min-frames", type=int, default=32, help="shortest segment in frames (~1.5 s)")
    p.add_argument("--max-frames", type=int, default=32, help="longest segment in frames")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--mel-weight", type=float, default=1.0)
    p.add_argument("--clip", type=float, default=10.0, help="gradient norm clip")
    p.add_argument("--adversarial-weight", type=float, default=0.0,
                   help="weight of the adversarial losses (HiFi-GAN's discriminators; 0: off)")
    p.add_argument("--feature-weight", type=float, default=2.0,
                   help="with --adversarial-weight: feature matching's weight beside the adversarial loss")
    p.add_argument("--latent-bound", type=float, default=2.0, help="FSQ tanh input kept within ±this")
    p.add_argument("--bound-weight", type=float, default=1.0, help="weight of the latent bound loss")
    p.add_argument("--decoder-channels", type=int,
                   help=f"the decoder's base width (default {DEFAULT_DECODER_CHANNELS}); with --init, another than "
                        "the codec's trains a new decoder on its encoder's codes")
    p.add_argument("--encoder-channels", type=int, default=DEFAULT_ENCODER_CHANNELS)
    p.add_argument("--limit", type=int, help="train on the first N utterances only")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device")
    p.set_defaults(func=train)

    p = sub.add_parser("export", help="write the .nemo the C codec loads")
    p.add_argument("codec")
    p.add_argument("out")
    p.set_defaults(func=export)

    p = sub.add_parser("encode", help="write DATA/codes.pt for the LM trainer")
    p.add_argument("codec")
    p.add_argument("data")
    p.add_argument("--out")
    p.add_argument("--limit", type=int)
    p.add_argument("--device")
    p.set_defaults(func=encode)

    p = sub.add_parser("eval", help="STFT / mel distance and SNR on held-out audio")
    p.add_argument("codec")
    p.add_argument("data")
    p.add_argument("--split", default="heldout_speaker")
    p.add_argument("--limit", type=int, default=64)
    p.add_argument("--out", help="folder for original/decoded wav pairs")
    p.add_argument("--wavs", type=int, default=4)
    p.add_argument("--device")
    p.set_defaults(func=evaluate)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
