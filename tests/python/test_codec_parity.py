"""Parity of the C NanoCodec (gepard-codec-tool) with the PyTorch reference in codec_reference.py.

The checkpoints come from `gepard-make-test-model --codec-only` (tiny preset in both file formats,
and the published nanocodec-22khz sizes); the C side is driven through

    gepard-codec-tool decode CODEC CODES.safetensors OUT.safetensors [--chunk N]
    gepard-codec-tool encode CODEC AUDIO.safetensors OUT.safetensors

Each run draws a fresh seed (printed; GEPARD_TEST_SEED=N repeats a run); `pytest -s` prints the
table of measured errors. Without gepard-codec-tool in $GEPARD_BUILD_DIR/tools (default
<repo>/build) only the reference's own checks run.

Ground truth is the float64 reference (spec §8): the C codec computes in fp32, and bit identity
with any fp32 implementation is out of reach because the sums run in another order (blocked GEMM
vs. plain loops) and sinf/tanhf are other implementations. What an fp32 decoder can be expected to
reach was measured with the reference itself, both with torch's fp32 kernels and with every conv
summed as a plain sequential fp32 loop (taps outer, channels inner, up to 6048 products per output
at the published size): against fp64 the output waveform (which lies in [−1, 1]) differs by max
|Δ| ≈ 1e-6 to 4e-6 and ≈ 5e-7 to 8e-7 rms-relative, in line with the ~1e-6 relative agreement
spec §8 expects; the encoder latent differs by ≈ 1e-6 to 4e-6 of its peak (max) and ≈ 1e-6 to
2.3e-6 rms-relative. The two summation schemes land within a factor 2 of each other, so the error
is set by the rounding of every intermediate tensor rather than by the order of the sums. The
limits leave a factor of about 10:

    decode: max |Δ| ≤ 2⁻¹⁵ (one 16-bit PCM step) and rms-relative ≤ 1e-5;
    encode: max |Δ| ≤ 3e-5 · max|latent| and rms-relative ≤ 2e-5.

A wrong layer (a missing branch, a wrong dilation, tanh for clamp, reflect for replicate
padding, the bias counted twice in a transposed conv) moves the output by 1e-2 or more.

FSQ codes are integers: they must be equal, except where the reference's compressed value
y = scale·tanh(x + shift) − offset lies so close to a rounding boundary (k + ½) that the latent
tolerance can move it across: margin ≤ max(scale) · latent tolerance + 4e-6 (the last term covers
a few fp32 ulps of tanhf and the product). Separately, the C codes must be the fp32 FSQ of the C
latent, up to 4e-6 of a boundary.

The reference is checked on its own too: GroupFSQ constants and packing (§4), the two file formats
giving the same tensors, causality and the receptive fields of §6.1/§6.2 (26464 samples reached by
a latent frame; an impulse at sample 32768 moving encoder frames 19…44), and its fp32 path against
its fp64 path.

Streaming (§6.1): decoding in chunks of 1, 3 and 7 frames must give the one-shot samples bit for
bit, which holds when every output is summed in the same order in both modes. The reference shows
the scheme itself is exact: with a fixed summation order its streaming decoder equals its one-shot
decoder with max |Δ| = 0 in float64 (torch's own conv1d changes blocking with the input length,
which leaves ~1e-14 there).
"""

import copy
import os
import random
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("yaml")

from safetensors.numpy import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import codec_reference as ref  # noqa: E402

SOURCE_DIR = os.environ.get("GEPARD_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD_DIR = os.environ.get("GEPARD_BUILD_DIR") or os.path.join(SOURCE_DIR, "build")
MAKE_MODEL = os.path.join(BUILD_DIR, "tools", "gepard-make-test-model")
CODEC_TOOL = os.path.join(BUILD_DIR, "tools", "gepard-codec-tool")
SEED = int(os.environ.get("GEPARD_TEST_SEED") or random.SystemRandom().randrange(1 << 31))
print(f"\ntest_codec_parity: seed {SEED} (GEPARD_TEST_SEED={SEED} repeats it)")

SAMPLE_RATE = 22050
FORMATS = ["nemo", "safetensors"]
TINY_FRAMES = 30  # more than the decoder's 26-frame history (§6.1)
TINY_SECONDS = 2.3
PUBLISHED_FRAMES = 4
PUBLISHED_SECONDS = 0.3
CHUNKS = [1, 3, 7]

# ---- tolerances (the module docstring says where they come from) ---------------------------------
DECODE_MAX_ABS = 2.0 ** -15
DECODE_RMS_REL = 1e-5
LATENT_MAX_REL = 3e-5  # max |Δ| / max |latent|
LATENT_RMS_REL = 2e-5
FSQ_Y_SLACK = 4e-6  # fp32 evaluation of scale·tanh(x + shift) − offset, in rounding units
REF_FP32_MAX_ABS = 2e-5  # the reference's own fp32 path against fp64 (sanity of the reference)

ROWS = []  # (case, quantity, measured, limit) for the printed table


def record(case, quantity, measured, limit=""):
    ROWS.append((case, quantity, measured, limit))


def _fmt(v):
    if isinstance(v, float):
        return "0" if v == 0 else f"{v:.3g}"
    return str(v)


@pytest.fixture(scope="module", autouse=True)
def one_thread_and_error_table():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machines running this are small and shared
    yield
    torch.set_num_threads(threads)
    if not ROWS:
        return
    width = max(len(r[0]) for r in ROWS)
    qwidth = max(len(r[1]) for r in ROWS)
    lines = [f"NanoCodec parity, seed {SEED}",
             f"{'case':<{width}}  {'quantity':<{qwidth}}  {'measured':>10}  limit"]
    for case, quantity, measured, limit in ROWS:
        lines.append(f"{case:<{width}}  {quantity:<{qwidth}}  {_fmt(measured):>10}  {_fmt(limit)}")
    print("\n" + "\n".join(lines))


# ---- files and tools -----------------------------------------------------------------------------


def _run(cmd, timeout=600):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("codec-parity")


def make_codec(workdir, preset, fmt, seed):
    if not os.access(MAKE_MODEL, os.X_OK):
        pytest.skip(f"{MAKE_MODEL} is not built")
    path = workdir / f"{preset}-{seed}.{fmt}"
    if not path.exists():
        r = _run([MAKE_MODEL, "--codec-only", "--preset", preset, "--seed", seed, "--format", fmt, path])
        assert r.returncode == 0, f"gepard-make-test-model failed: {r.stderr}"
    return path


@pytest.fixture(scope="module")
def c_tool():
    if not os.access(CODEC_TOOL, os.X_OK):
        pytest.skip(f"{CODEC_TOOL} is not built yet")
    return CODEC_TOOL


class CodecTool:
    """Runs gepard-codec-tool on files in workdir."""

    def __init__(self, tool, workdir):
        self.tool = tool
        self.workdir = workdir
        self.count = 0

    def _paths(self, stem):
        self.count += 1
        return (self.workdir / f"{stem}-{self.count}-in.safetensors",
                self.workdir / f"{stem}-{self.count}-out.safetensors")

    def decode(self, codec_path, codes, chunk=None):
        src, dst = self._paths("decode")
        save_file({"codes": np.ascontiguousarray(codes, dtype=np.int32)}, str(src))
        cmd = [self.tool, "decode", codec_path, src, dst]
        if chunk is not None:
            cmd += ["--chunk", chunk]
        r = _run(cmd)
        assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stderr}"
        samples = load_file(str(dst))["samples"]
        assert samples.dtype == np.float32, samples.dtype
        assert samples.shape == (codes.shape[0] * 1024,), samples.shape
        return samples

    def encode(self, codec_path, audio):
        src, dst = self._paths("encode")
        save_file({"samples": np.ascontiguousarray(audio, dtype=np.float32)}, str(src))
        cmd = [self.tool, "encode", codec_path, src, dst]
        r = _run(cmd)
        assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stderr}"
        out = load_file(str(dst))
        frames = -(-audio.shape[0] // 1024)
        assert out["codes"].dtype == np.int32 and out["codes"].shape == (frames, 32), out["codes"].shape
        assert out["latent"].dtype == np.float32 and out["latent"].shape == (frames, 32), out["latent"].shape
        return out["codes"], out["latent"]


@pytest.fixture(scope="module")
def tool(c_tool, workdir):
    return CodecTool(c_tool, workdir)


# ---- inputs --------------------------------------------------------------------------------------


def random_codes(rng, quantizer, frames):
    """Uniform codes per channel, with one all-minimum frame (index 0 ↔ all −1) and one all-maximum."""
    levels = quantizer.channel_levels.numpy()
    codes = (rng.random((frames, levels.size)) * levels).astype(np.int32)
    codes[frames // 5] = 0
    codes[(2 * frames) // 3] = levels - 1
    return codes


def make_audio(rng, seconds):
    """Noise plus three sines, gain rising from speech level (peak ≈ 0.6) to loud (peak ≈ 40) so that
    the FSQ sees small and large latents; the length is not a multiple of 1024."""
    n = int(round(seconds * SAMPLE_RATE))
    if n % 1024 == 0:
        n += 1
    t = np.arange(n) / SAMPLE_RATE
    x = 0.1 * rng.standard_normal(n)
    for _ in range(3):
        x += rng.uniform(0.1, 0.3) * np.sin(2 * np.pi * rng.uniform(80, 4000) * t + rng.uniform(0, 2 * np.pi))
    gain = 0.5 * 64.0 ** (t / t[-1])
    return (x * gain).astype(np.float32)


# ---- measures ------------------------------------------------------------------------------------


def _np64(x):
    return x.detach().cpu().numpy().astype(np.float64) if torch.is_tensor(x) else np.asarray(x, np.float64)


def errors(got, want):
    got, want = _np64(got), _np64(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = np.abs(got - want)
    rms_rel = float(np.sqrt(np.mean(diff ** 2)) / max(np.sqrt(np.mean(want ** 2)), 1e-30))
    return float(diff.max()), rms_rel, float(np.abs(want).max())


def check_decode(case, got, want, what="C vs fp64"):
    max_abs, rms_rel, _ = errors(got, want)
    record(case, f"{what} max |Δ|", max_abs, DECODE_MAX_ABS)
    record(case, f"{what} rms rel", rms_rel, DECODE_RMS_REL)
    assert max_abs <= DECODE_MAX_ABS and rms_rel <= DECODE_RMS_REL, (
        f"{case}: decode differs from the fp64 reference: max |Δ| {max_abs:.3g} (limit "
        f"{DECODE_MAX_ABS:.3g}), rms rel {rms_rel:.3g} (limit {DECODE_RMS_REL:.3g}); seed {SEED}")


def check_encode(case, quantizer, c_codes, c_latent, ref_codes, ref_latent):
    max_abs, rms_rel, peak = errors(c_latent, ref_latent)
    latent_tol = LATENT_MAX_REL * peak
    record(case, "latent C vs fp64 max |Δ|/peak", max_abs / peak, LATENT_MAX_REL)
    record(case, "latent C vs fp64 rms rel", rms_rel, LATENT_RMS_REL)

    # codes against the reference, with the boundary margin of the reference's latent
    margin_tol = float(quantizer.scale.max()) * latent_tol + FSQ_Y_SLACK
    ref_margin = quantizer.boundary_margin(torch.as_tensor(_np64(ref_latent))).numpy()
    near = ref_margin <= margin_tol
    mismatch = np.asarray(c_codes) != np.asarray(ref_codes)
    used = sum(len(np.unique(np.asarray(ref_codes)[:, i])) for i in range(ref_codes.shape[1]))
    record(case, "codes used (channel, level) pairs", f"{used}/{int(quantizer.channel_levels.sum())}")
    record(case, f"codes within {margin_tol:.2g} of a boundary", int(near.sum()))
    record(case, "codes C vs fp64 differing", int(mismatch.sum()), "only near a boundary")

    # the C codes must be the fp32 FSQ of the C latent
    own = quantizer.encode(torch.as_tensor(np.asarray(c_latent))).numpy()
    own_margin = quantizer.boundary_margin(torch.as_tensor(np.asarray(c_latent, np.float64))).numpy()
    own_mismatch = own != np.asarray(c_codes)
    record(case, "codes C vs FSQ(C latent) differing", int(own_mismatch.sum()), f"≤ {FSQ_Y_SLACK:g} of a boundary")

    assert max_abs <= latent_tol and rms_rel <= LATENT_RMS_REL, (
        f"{case}: latent differs from the fp64 reference: max |Δ| {max_abs:.3g} (limit {latent_tol:.3g}"
        f" = {LATENT_MAX_REL:g}·peak {peak:.3g}), rms rel {rms_rel:.3g} (limit {LATENT_RMS_REL:g}); seed {SEED}")
    bad = np.argwhere(own_mismatch & (own_margin > FSQ_Y_SLACK))
    assert bad.size == 0, (
        f"{case}: C codes are not the FSQ of the C latent at (frame, channel) {bad[:8].tolist()}; seed {SEED}")
    bad = np.argwhere(mismatch & ~near)
    assert bad.size == 0, (
        f"{case}: C codes differ from the reference away from any rounding boundary at (frame, channel) "
        f"{bad[:8].tolist()} (margins {ref_margin[mismatch & ~near][:8].tolist()}); seed {SEED}")


# ---- checkpoints and references ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(workdir):
    """{format: (path, fp64 reference)}; both files come from the same seed."""
    out = {}
    for fmt in FORMATS:
        path = make_codec(workdir, "tiny", fmt, SEED)
        checkpoint = ref.read_checkpoint(path)
        out[fmt] = (path, checkpoint, ref.load_codec(path, ref.F64, checkpoint))
    return out


@pytest.fixture(scope="module")
def published(workdir):
    """(path, checkpoint, fp64 reference) at the published sizes, as a .nemo like the real download."""
    path = make_codec(workdir, "nanocodec-22khz", "nemo", SEED)
    checkpoint = ref.read_checkpoint(path)
    return path, checkpoint, ref.load_codec(path, ref.F64, checkpoint)


# ---- the reference on its own --------------------------------------------------------------------


def test_fsq_constants_and_packing():
    q = ref.Quantizer(8, [8, 7, 6, 6])
    for level in (8, 7, 6):
        # the spec's bit patterns are what torch computes in fp32
        scale = torch.tensor((level - 1) / 2, dtype=torch.float32) * (1 - ref.FSQ_EPS)
        shift = torch.tan(torch.tensor(0.5 if level % 2 == 0 else 0.0) / scale)
        assert ref.f32_bits(float(scale)) == ref.FSQ_SCALE_BITS[level]
        assert ref.f32_bits(float(shift)) == ref.FSQ_SHIFT_BITS[level]
    assert q.bases == (1, 8, 56, 336) and q.codebook_size == 2016
    every = np.arange(2016, dtype=np.int32)[:, None].repeat(8, axis=1)
    codes = q.unpack(every)
    assert np.array_equal(q.pack(codes).numpy(), every)
    values = q.dequantize(codes)
    assert torch.equal(values[0], torch.full((32,), -1.0))
    assert sorted(set(values[:, 0].tolist())) == [v / 4 for v in range(-4, 4)]
    assert sorted(set(values[:, 1].tolist())) == [float(np.float32(v / 3)) for v in range(-3, 4)]
    # saturated latents land on the end levels; zero lands on L//2 for odd L and on L//2 − 1 … L//2
    big = torch.full((1, 32), 50.0)
    assert torch.equal(q.encode(big)[0], q.channel_levels.to(torch.int32) - 1)
    assert torch.equal(q.encode(-big)[0], torch.zeros(32, dtype=torch.int32))
    assert q.encode(torch.zeros(1, 32))[0, :4].tolist() == [4, 3, 3, 3]


def test_reference_formats_agree(tiny):
    (_, (cfg_n, sd_n), _), (_, (cfg_s, sd_s), _) = tiny["nemo"], tiny["safetensors"]
    assert cfg_n == cfg_s
    codec_keys = [k for k in sd_n if k.startswith(("audio_encoder.", "vector_quantizer.", "audio_decoder."))]
    assert sorted(codec_keys) == sorted(sd_s)
    assert all(torch.equal(sd_n[k], sd_s[k]) for k in sd_s)


def test_reference_streaming_equals_one_shot(tiny):
    """§6.1 in float64: caches + carries reproduce the one-shot decoder exactly."""
    _, _, codec = tiny["safetensors"]
    rng = np.random.default_rng(SEED)
    codes = random_codes(rng, codec.quantizer, TINY_FRAMES)
    one_shot = codec.decode(codes, fixed_order=True)
    assert float((one_shot - codec.decode(codes)).abs().max()) < 1e-12  # fixed order = torch's conv

    sizes = []
    stream = codec.streaming_decoder(fixed_order=True)
    parts, pos = [], 0
    while pos < TINY_FRAMES:
        n = min(int(rng.choice([1, 2, 3, 5])), TINY_FRAMES - pos)
        sizes.append(n)
        parts.append(stream.push(codes[pos:pos + n]))
        pos += n
    streamed = torch.cat(parts)
    diff = float((streamed - one_shot).abs().max())
    record("tiny reference", f"fp64 stream vs one-shot max |Δ| ({len(sizes)} chunks)", diff, 0.0)
    assert diff == 0.0, f"streaming differs by {diff} with chunks {sizes}"
    assert stream.state_floats() == codec.decoder.state_floats

    plain = codec.streaming_decoder()
    torch_streamed = torch.cat([plain.push(codes[i:i + 3]) for i in range(0, TINY_FRAMES, 3)])
    diff = float((torch_streamed - codec.decode(codes)).abs().max())
    record("tiny reference", "fp64 stream vs one-shot, torch conv1d", diff, 1e-12)
    assert diff < 1e-12


def test_reference_decoder_is_causal(tiny):
    """§6.1: changing frame j changes the output from frame j on, never before. (Its first sample
    may still come out equal: where the output clamp saturates, a change does not show.)"""
    _, _, codec = tiny["safetensors"]
    rng = np.random.default_rng(SEED + 1)
    codes = random_codes(rng, codec.quantizer, 12)
    base = codec.decode(codes)
    for j in (0, 5, 11):
        changed = codes.copy()
        changed[j] = (changed[j] + 1) % codec.quantizer.channel_levels.numpy()
        moved = torch.nonzero(codec.decode(changed) != base)
        assert moved.numel() > 0 and 1024 * j <= int(moved[0]) < 1024 * (j + 1), (j, moved[:1])


def _positive(item):
    if torch.is_tensor(item):
        return item.abs()  # a Snake alpha
    if isinstance(item, tuple) and len(item) == 2 and all(torch.is_tensor(t) for t in item) \
            and item[0].dim() == 3 and item[1].dim() == 1:
        return item[0].abs(), torch.zeros_like(item[1])  # a conv: |W|, no bias
    if isinstance(item, (list, tuple)):
        return type(item)(_positive(x) for x in item)
    return item


def positive_probe(codec):
    """A float64 copy with |W|, zero biases and |alpha|. Zero input then gives exactly zero
    everywhere, and every sample an input change reaches turns strictly positive: nothing cancels
    and nothing is lost to rounding, so the changed samples are the receptive field itself."""
    assert codec.dtype == ref.F64
    probe = copy.copy(codec)
    for name in ("decoder", "encoder"):
        part = copy.copy(getattr(codec, name))
        part.__dict__.update({k: _positive(v) for k, v in part.__dict__.items()})
        setattr(probe, name, part)
    return probe


def test_reference_receptive_fields(tiny):
    """§6.1 and §6.2, structural facts of the graph (the tiny preset has the published rates and
    kernels): latent frame j reaches decoder samples [1024·j, 1024·j + 26463]; an impulse at sample
    32768 moves encoder frames 19…44."""
    probe = positive_probe(tiny["safetensors"][2])
    j = 2
    latent = torch.zeros(j + 28, 32, dtype=torch.float64)
    latent[j] = 0.5
    moved = torch.nonzero(probe.decode_latent(latent))[:, 0]
    record("tiny reference", "decoder reach of frame j, samples",
           f"{int(moved[0]) - 1024 * j}…{int(moved[-1]) - 1024 * j}", "0…26463")
    assert (int(moved[0]), int(moved[-1])) == (1024 * j, 1024 * j + 26463)
    assert moved.numel() == 26464

    audio = np.zeros(64 * 1024, dtype=np.float32)
    audio[32768] = 0.5
    _, latent = probe.encode(audio)
    frames = torch.nonzero((latent != 0).any(dim=1))[:, 0].tolist()
    record("tiny reference", "encoder frames moved by sample 32768", f"{frames[0]}…{frames[-1]}", "19…44")
    assert frames == list(range(19, 45))


def test_reference_fp32_against_fp64(tiny, published):
    """The reference's fp32 path (NeMo's numerics) against its fp64 path: the noise floor."""
    rng = np.random.default_rng(SEED + 2)
    cases = [("tiny", tiny["safetensors"], TINY_FRAMES, TINY_SECONDS),
             ("published", published, PUBLISHED_FRAMES, PUBLISHED_SECONDS)]
    for name, (path, checkpoint, codec64), frames, seconds in cases:
        codec32 = ref.load_codec(path, ref.F32, checkpoint)
        codes = random_codes(rng, codec64.quantizer, frames)
        max_abs, rms_rel, _ = errors(codec32.decode(codes), codec64.decode(codes))
        record(f"{name} reference", "decode torch fp32 vs fp64 max |Δ|", max_abs)
        record(f"{name} reference", "decode torch fp32 vs fp64 rms rel", rms_rel)
        assert max_abs < REF_FP32_MAX_ABS
        audio = make_audio(rng, seconds)
        _, latent32 = codec32.encode(audio)
        _, latent64 = codec64.encode(audio)
        max_abs, rms_rel, peak = errors(latent32, latent64)
        record(f"{name} reference", "latent torch fp32 vs fp64 max |Δ|/peak", max_abs / peak)
        record(f"{name} reference", "latent torch fp32 vs fp64 rms rel", rms_rel)
        assert max_abs / peak < LATENT_MAX_REL / 3
    assert published[2].decoder.state_floats == 186816  # §6.1


# ---- C against the reference ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_decodes(tiny, tool):
    """{format: (codes, C one-shot samples, fp64 reference samples)}."""
    rng = np.random.default_rng(SEED + 3)
    out = {}
    for fmt, (path, _, codec) in tiny.items():
        codes = random_codes(rng, codec.quantizer, TINY_FRAMES)
        out[fmt] = (codes, tool.decode(path, codes), codec.decode(codes))
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_c_decode_matches_reference(fmt, tiny, tiny_decodes):
    codes, c_samples, ref_samples = tiny_decodes[fmt]
    _, _, codec = tiny[fmt]
    case = f"tiny/{fmt} decode {len(codes)} frames"
    check_decode(case, c_samples, ref_samples)
    codec32 = ref.NanoCodec(codec.config, tiny[fmt][1][1], ref.F32)
    max_abs, rms_rel, _ = errors(c_samples, codec32.decode(codes))
    record(case, "C vs torch fp32 max |Δ| (info)", max_abs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_c_streaming_is_bit_exact(fmt, tiny, tool, tiny_decodes):
    codes, one_shot, _ = tiny_decodes[fmt]
    path = tiny[fmt][0]
    for chunk in CHUNKS:
        streamed = tool.decode(path, codes, chunk=chunk)
        differing = int(np.count_nonzero(streamed.view(np.uint32) != one_shot.view(np.uint32)))
        record(f"tiny/{fmt} decode {len(codes)} frames", f"--chunk {chunk} vs one-shot differing samples",
               differing, 0)
        assert differing == 0, (
            f"--chunk {chunk}: {differing} samples differ from the one-shot decode, first at "
            f"{int(np.argmax(streamed.view(np.uint32) != one_shot.view(np.uint32)))}, max |Δ| "
            f"{float(np.abs(streamed.astype(np.float64) - one_shot).max()):.3g}; seed {SEED}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_c_encode_matches_reference(fmt, tiny, tool):
    path, _, codec = tiny[fmt]
    rng = np.random.default_rng(SEED + 4 + FORMATS.index(fmt))
    audio = make_audio(rng, TINY_SECONDS)
    c_codes, c_latent = tool.encode(path, audio)
    ref_codes, ref_latent = codec.encode(audio)
    check_encode(f"tiny/{fmt} encode {audio.size} samples", codec.quantizer, c_codes, c_latent,
                 ref_codes.numpy(), ref_latent)


def test_c_published_decode(published, tool):
    path, _, codec = published
    rng = np.random.default_rng(SEED + 6)
    codes = random_codes(rng, codec.quantizer, PUBLISHED_FRAMES)
    one_shot = tool.decode(path, codes)
    case = f"published decode {PUBLISHED_FRAMES} frames"
    check_decode(case, one_shot, codec.decode(codes))
    for chunk in (1, 3):
        streamed = tool.decode(path, codes, chunk=chunk)
        differing = int(np.count_nonzero(streamed.view(np.uint32) != one_shot.view(np.uint32)))
        record(case, f"--chunk {chunk} vs one-shot differing samples", differing, 0)
        assert differing == 0, f"--chunk {chunk}: {differing} samples differ from one-shot; seed {SEED}"


def test_c_published_encode(published, tool):
    path, _, codec = published
    rng = np.random.default_rng(SEED + 7)
    audio = make_audio(rng, PUBLISHED_SECONDS)
    c_codes, c_latent = tool.encode(path, audio)
    ref_codes, ref_latent = codec.encode(audio)
    check_encode(f"published encode {audio.size} samples", codec.quantizer, c_codes, c_latent,
                 ref_codes.numpy(), ref_latent)
