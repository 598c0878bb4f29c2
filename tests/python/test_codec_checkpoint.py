"""NanoCodec test checkpoints written by gepard-make-test-model --codec-only.

Checks the files against the contract in specs/nanocodec.md: the 694 tensor names, shapes and dtypes
of Appendix A in checkpoint order (§5), the .nemo layout (an uncompressed tar around a torch.save
zip whose data.pkl is the pickle torch emits), the safetensors export, the model_config.yaml, and
that the seeded weights make a decoder (§2, re-implemented here in numpy) produce bounded,
non-trivial audio.
"""

import collections
import contextlib
import ctypes
import io
import json
import math
import os
import pickle
import re
import struct
import subprocess
import sys
import tarfile
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

try:
    import torch
except ImportError:
    torch = None

HERE = Path(__file__).resolve().parent
SOURCE_DIR = Path(os.environ.get("GEPARD_SOURCE_DIR", HERE.parents[1]))
BUILD_DIR = Path(os.environ.get("GEPARD_BUILD_DIR", SOURCE_DIR / "build"))
GENERATOR = BUILD_DIR / "tools" / "gepard-make-test-model"
TENSOR_LIST = SOURCE_DIR / "tests" / "data" / "nanocodec-tensors.txt"

CODEC_PREFIXES = ("audio_encoder.", "vector_quantizer.", "audio_decoder.")
EXTRA_PREFIXES = ("discriminator.", "mel_loss_fn.", "stft_loss_fn.")
STORAGE_DTYPES = {
    "FloatStorage": np.dtype("<f4"),
    "IntStorage": np.dtype("<i4"),
    "LongStorage": np.dtype("<i8"),
    "HalfStorage": np.dtype("<f2"),
    "ByteStorage": np.dtype("u1"),
}
SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4")}


def _generator_skip_reason():
    if not GENERATOR.exists():
        return f"{GENERATOR} is not built"
    help_text = subprocess.run(
        [str(GENERATOR), "--help-all"], capture_output=True, text=True, timeout=60
    )
    if "--codec-only" not in help_text.stdout + help_text.stderr:
        return f"{GENERATOR} has no --codec-only option yet"
    return None


_SKIP_REASON = _generator_skip_reason()


def require_generator():
    if _SKIP_REASON is not None:
        pytest.skip(_SKIP_REASON)


def generate(path, preset, seed, fmt):
    require_generator()
    result = subprocess.run(
        [
            str(GENERATOR),
            "--codec-only",
            "--preset",
            preset,
            "--seed",
            str(seed),
            "--format",
            fmt,
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return path


def load_tensor_list():
    """Appendix A as (name, shape, dtype) triples."""
    entries = []
    for line in TENSOR_LIST.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, shape, dtype = line.split()
        entries.append((name, tuple(int(s) for s in shape.split(",")), dtype))
    return entries


# --- reading a torch.save checkpoint without torch ---------------------------------------------


class _StorageType:
    def __init__(self, name):
        self.name = name
        self.dtype = STORAGE_DTYPES[name]


def _contiguous_strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks, *metadata):
    assert requires_grad is False
    assert isinstance(backward_hooks, collections.OrderedDict) and not backward_hooks
    assert tuple(stride) == _contiguous_strides(size), (size, stride)
    count = math.prod(size)
    return storage[offset : offset + count].reshape(size)


class CheckpointUnpickler(pickle.Unpickler):
    """Unpickles data.pkl allowing only the globals torch.save emits for a state dict."""

    def __init__(self, file, archive, root):
        super().__init__(file)
        self.archive = archive
        self.root = root
        self.storages = []  # (key, storage class name, numel) in pickle order

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")

    def persistent_load(self, pid):
        kind, storage_type, key, location, numel = pid
        assert kind == "storage" and location == "cpu"
        assert isinstance(storage_type, _StorageType)
        self.storages.append((key, storage_type.name, numel))
        data = self.archive.read(f"{self.root}/data/{key}")
        assert len(data) == numel * storage_type.dtype.itemsize
        return np.frombuffer(data, dtype=storage_type.dtype)


def numpy_dtype_name(array):
    return {np.dtype("<f4"): "float32", np.dtype("<i4"): "int32"}[array.dtype]


class Ckpt:
    """A torch.save zip opened with zipfile; `state` is its state dict as numpy arrays."""

    def __init__(self, path):
        self.path = path
        self.zip = zipfile.ZipFile(path)
        names = self.zip.namelist()
        self.root = names[0].split("/")[0]
        assert all(n.startswith(self.root + "/") for n in names), names
        self.data_pkl = self.zip.read(f"{self.root}/data.pkl")
        unpickler = CheckpointUnpickler(io.BytesIO(self.data_pkl), self.zip, self.root)
        self.state = unpickler.load()
        self.storages = unpickler.storages

    def close(self):
        self.zip.close()


class Nemo:
    """A .nemo archive: its member list, yaml text and checkpoint (extracted beside it)."""

    def __init__(self, path, workdir):
        with tarfile.open(path, "r:") as tar:
            self.members = tar.getmembers()
            self.yaml_text = tar.extractfile("./model_config.yaml").read().decode()
            ckpt_member = tar.getmember("./model_weights.ckpt")
            self.ckpt_offset = ckpt_member.offset_data
            ckpt_path = Path(workdir) / "model_weights.ckpt"
            with tar.extractfile(ckpt_member) as src, open(ckpt_path, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
        self.ckpt = Ckpt(ckpt_path)
        self.config = yaml.safe_load(self.yaml_text)


def read_safetensors(path):
    data = Path(path).read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    metadata = header.pop("__metadata__", {})
    buffer = memoryview(data)[8 + header_len :]
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        array = np.frombuffer(buffer[begin:end], dtype=SAFETENSORS_DTYPES[entry["dtype"]])
        tensors[name] = array.reshape(entry["shape"])
    order = sorted(header, key=lambda n: header[n]["data_offsets"][0])
    return tensors, metadata, order


# --- the checkpoint names NeMo's classes produce (nanocodec.md §5), from a config --------------


def expected_tensors(config):
    """(name, shape, dtype) for every codec tensor, from model_config.yaml, following NeMo's
    module structure: written independently of the C enumeration it checks."""
    out = []

    def conv(prefix, c_out, c_in_per_group, k, g_rows=None):
        out.append((f"{prefix}.conv.bias", (c_out,), "float32"))
        rows = c_out if g_rows is None else g_rows
        out.append((f"{prefix}.conv.parametrizations.weight.original0", (rows, 1, 1), "float32"))
        out.append(
            (
                f"{prefix}.conv.parametrizations.weight.original1",
                (rows, c_in_per_group, k),
                "float32",
            )
        )

    def alpha(prefix, channels):
        out.append((f"{prefix}.activation.snake_act.alpha", (1, channels // 2, 1), "float32"))

    def res_layer(module, stage, channels, kernels, dilations, snake):
        for j, k in enumerate(kernels):
            for m, _ in enumerate(dilations):
                block = f"{module}.res_layers.{stage}.res_blocks.{j}.res_blocks.{m}"
                if snake:
                    alpha(f"{block}.input_activation", channels)
                    alpha(f"{block}.skip_activation", channels)
                conv(f"{block}.input_conv", channels, channels, k)
                conv(f"{block}.skip_conv", channels, channels, k)

    enc = config["audio_encoder"]
    base = enc["base_channels"]
    conv("audio_encoder.pre_conv", base, 1, enc["in_kernel_size"])
    for i, rate in enumerate(enc["down_sample_rates"]):
        c = base << i
        conv(f"audio_encoder.down_sample_conv_layers.{i}", 2 * c, c, 2 * rate)
    for i, _ in enumerate(enc["down_sample_rates"]):
        res_layer(
            "audio_encoder",
            i,
            base << i,
            enc["resblock_kernel_sizes"],
            enc["resblock_dilation_sizes"],
            False,
        )
    conv(
        "audio_encoder.post_conv",
        enc["encoded_dim"],
        base << len(enc["down_sample_rates"]),
        enc["out_kernel_size"],
    )

    vq = config["vector_quantizer"]
    n_dims = len(vq["num_levels_per_group"])
    for g in range(vq["num_groups"]):
        out.append((f"vector_quantizer.fsqs.{g}.dim_base_index", (1, n_dims, 1), "int32"))
        out.append((f"vector_quantizer.fsqs.{g}.num_levels", (1, n_dims, 1), "int32"))

    dec = config["audio_decoder"]
    base = dec["base_channels"]
    rates = dec["up_sample_rates"]
    snake = dec["activation"] == "half_snake"
    conv("audio_decoder.pre_conv", base, dec["input_dim"], dec["in_kernel_size"])
    if snake:
        for i in range(len(rates)):
            alpha(f"audio_decoder.activations.{i}", base >> i)
    for i, rate in enumerate(rates):
        c_in, c_out = base >> i, base >> (i + 1)
        groups = c_out if dec["n_groups_equal_to_out_channels"] else 1
        # nanocodec.md §2.4: a ConvTranspose1d weight is (C_in, C_out / groups, k)
        conv(f"audio_decoder.up_sample_conv_layers.{i}", c_out, c_out // groups, 2 * rate, c_in)
    for i in range(len(rates)):
        res_layer(
            "audio_decoder",
            i,
            base >> (i + 1),
            dec["resblock_kernel_sizes"],
            dec["resblock_dilation_sizes"],
            snake,
        )
    last = base >> len(rates)
    if snake:
        alpha("audio_decoder.post_activation", last)
    conv("audio_decoder.post_conv", 1, last, dec["out_kernel_size"])
    return out


def tensor_triples(state):
    return [(name, tuple(a.shape), numpy_dtype_name(a)) for name, a in state.items()]


# --- a numpy decoder (nanocodec.md §2), float64 --------------------------------------------------


def fold_weight_norm(state, prefix):
    # nanocodec.md §2.4: W = v · g / ‖v‖, norm over all dims but 0, no epsilon
    g = state[f"{prefix}.conv.parametrizations.weight.original0"].astype(np.float64)
    v = state[f"{prefix}.conv.parametrizations.weight.original1"].astype(np.float64)
    norm = np.sqrt((v**2).reshape(v.shape[0], -1).sum(axis=1)).reshape(-1, 1, 1)
    return v * (g / norm), state[f"{prefix}.conv.bias"].astype(np.float64)


def causal_conv(x, weight, bias, dilation=1):
    # nanocodec.md §2.3: y[o,t] = b[o] + Σ W[o,c,m] · x[c, t − (k−1−m)·d], zeros on the left
    c_out, c_in, k = weight.shape
    steps = x.shape[1]
    padded = np.pad(x, ((0, 0), ((k - 1) * dilation, 0)))
    columns = np.stack([padded[:, m * dilation : m * dilation + steps] for m in range(k)], axis=1)
    return weight.reshape(c_out, c_in * k) @ columns.reshape(c_in * k, steps) + bias[:, None]


def half_snake(x, alpha):
    # nanocodec.md §2.3: Snake on the first C // 2 channels, LeakyReLU(0.01) on the rest
    n = x.shape[0] // 2
    a = alpha.reshape(-1)[:, None].astype(np.float64)
    snake = x[:n] + (1.0 / (a + 1e-9)) * np.sin(a * x[:n]) ** 2
    rest = x[n:]
    return np.concatenate([snake, np.where(rest > 0, rest, 0.01 * rest)])


def grouped_transposed_conv(x, weight, bias, stride):
    # nanocodec.md §2.3: groups = C_out, kernel 2s, keep raw samples [0, T·s)
    c_in, steps = x.shape
    c_out = c_in // 2
    taps = (x[:, :, None] * weight[:, 0, None, :]).reshape(c_out, 2, steps, 2 * stride).sum(axis=1)
    raw = np.zeros((c_out, (steps + 1) * stride))
    raw[:, : steps * stride] += taps[:, :, :stride].reshape(c_out, -1)
    raw[:, stride:] += taps[:, :, stride:].reshape(c_out, -1)
    return raw[:, : steps * stride] + bias[:, None]


def fsq_decode(tokens, levels):
    # nanocodec.md §4: k_d = (index // base_d) mod L_d, value = (k_d − L//2) / (L//2)
    bases = np.cumprod([1] + list(levels[:-1]))
    latent = []
    for row in tokens:
        for base, level in zip(bases, levels):
            k = (row // base) % level
            latent.append((k - level // 2) / (level // 2))
    return np.array(latent, dtype=np.float64)


def decode(state, config, tokens):
    dec = config["audio_decoder"]
    kernels = dec["resblock_kernel_sizes"]
    dilations = dec["resblock_dilation_sizes"]
    x = fsq_decode(tokens, config["vector_quantizer"]["num_levels_per_group"])
    x = causal_conv(x, *fold_weight_norm(state, "audio_decoder.pre_conv"))
    for i, rate in enumerate(dec["up_sample_rates"]):
        x = half_snake(x, state[f"audio_decoder.activations.{i}.activation.snake_act.alpha"])
        x = grouped_transposed_conv(
            x, *fold_weight_norm(state, f"audio_decoder.up_sample_conv_layers.{i}"), rate
        )
        branches = []
        for j in range(len(kernels)):
            h = x
            for m, dilation in enumerate(dilations):
                block = f"audio_decoder.res_layers.{i}.res_blocks.{j}.res_blocks.{m}"
                r = half_snake(h, state[f"{block}.input_activation.activation.snake_act.alpha"])
                r = causal_conv(r, *fold_weight_norm(state, f"{block}.input_conv"), dilation)
                r = half_snake(r, state[f"{block}.skip_activation.activation.snake_act.alpha"])
                r = causal_conv(r, *fold_weight_norm(state, f"{block}.skip_conv"))
                h = h + r
            branches.append(h)
        x = sum(branches) / len(branches)
    x = half_snake(x, state["audio_decoder.post_activation.activation.snake_act.alpha"])
    x = causal_conv(x, *fold_weight_norm(state, "audio_decoder.post_conv"))[0]
    return np.clip(x, -1.0, 1.0)


def assert_plausible_audio(audio, frames):
    assert audio.shape == (1024 * frames,)
    assert np.all(np.isfinite(audio))
    rms = float(np.sqrt(np.mean(audio**2)))
    assert 0.03 < rms < 0.6, rms
    assert np.mean(np.abs(audio) >= 0.999) < 0.01, "output mostly clamped"
    # every frame moves: the weights do not collapse the signal
    assert np.all(audio.reshape(frames, 1024).std(axis=1) > 0.01)


# --- pickle bytes as torch.save writes them ----------------------------------------------------


@contextlib.contextmanager
def stand_in_torch():
    """Module objects named torch / torch._utils holding the globals torch.save pickles, so that
    Python's own pickler can write the reference bytes where torch is not installed."""
    assert "torch" not in sys.modules
    torch_module = types.ModuleType("torch")
    utils_module = types.ModuleType("torch._utils")

    def rebuild(*args):
        raise AssertionError("never called")

    rebuild.__module__ = "torch._utils"
    rebuild.__name__ = rebuild.__qualname__ = "_rebuild_tensor_v2"
    utils_module._rebuild_tensor_v2 = rebuild
    torch_module._utils = utils_module
    for name in STORAGE_DTYPES:
        cls = type(name, (), {"__module__": "torch"})
        setattr(torch_module, name, cls)
    sys.modules["torch"] = torch_module
    sys.modules["torch._utils"] = utils_module
    try:
        yield torch_module
    finally:
        del sys.modules["torch._utils"]
        del sys.modules["torch"]


def reference_data_pkl(triples):
    """data.pkl as torch.save(OrderedDict of contiguous CPU tensors) writes it: protocol 2,
    storages as persistent ids ('storage', torch.<T>Storage, key, 'cpu', numel)."""
    location = "cpu"
    class_names = {"float32": "FloatStorage", "int32": "IntStorage"}

    with stand_in_torch() as fake_torch:

        class Storage:
            def __init__(self, storage_class, numel):
                self.storage_class = storage_class
                self.numel = numel

        class Tensor:
            def __init__(self, storage, shape):
                self.storage = storage
                self.shape = shape

            def __reduce_ex__(self, protocol):
                args = (
                    self.storage,
                    0,
                    tuple(self.shape),
                    _contiguous_strides(self.shape),
                    False,
                    collections.OrderedDict(),
                )
                return (fake_torch._utils._rebuild_tensor_v2, args)

        class TorchPickler(pickle.Pickler):
            def __init__(self, file):
                super().__init__(file, protocol=2)
                self.keys = {}

            def persistent_id(self, obj):
                if isinstance(obj, Storage):
                    key = self.keys.setdefault(id(obj), str(len(self.keys)))
                    return ("storage", obj.storage_class, key, location, obj.numel)
                return None

        state = collections.OrderedDict()
        for name, shape, dtype in triples:
            storage_class = getattr(fake_torch, class_names[dtype])
            state[name] = Tensor(Storage(storage_class, math.prod(shape)), shape)
        buffer = io.BytesIO()
        TorchPickler(buffer).dump(state)
        return buffer.getvalue()


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("codec")


@pytest.fixture(scope="module")
def published_nemo(workdir):
    path = generate(workdir / "nanocodec.nemo", "nanocodec-22khz", 7, "nemo")
    unpacked = workdir / "nanocodec-unpacked"
    unpacked.mkdir()
    nemo = Nemo(path, unpacked)
    yield path, nemo
    nemo.ckpt.close()


@pytest.fixture(scope="module")
def published_safetensors(workdir):
    return read_safetensors(
        generate(workdir / "nanocodec.safetensors", "nanocodec-22khz", 7, "safetensors")
    )


@pytest.fixture(scope="module")
def tiny_nemo(workdir):
    path = generate(workdir / "tiny.nemo", "tiny", 1, "nemo")
    unpacked = workdir / "tiny-unpacked"
    unpacked.mkdir()
    nemo = Nemo(path, unpacked)
    yield path, nemo
    nemo.ckpt.close()


# --- tests -------------------------------------------------------------------------------------


def test_appendix_a_list_is_complete():
    entries = load_tensor_list()
    assert len(entries) == 694
    assert len({name for name, _, _ in entries}) == 694
    counts = collections.Counter(name.split(".")[0] for name, _, _ in entries)
    assert counts == {"audio_encoder": 291, "vector_quantizer": 16, "audio_decoder": 387}
    # nanocodec.md §1: parameter counts, weight-norm g and v counted separately
    params = collections.Counter()
    for name, shape, _ in entries:
        params[name.split(".")[0]] += math.prod(shape)
    assert params["audio_encoder"] == 31_019_224
    assert params["audio_decoder"] == 31_581_690


def test_published_tensors_match_appendix_a(published_nemo):
    _, nemo = published_nemo
    triples = tensor_triples(nemo.ckpt.state)
    codec = [t for t in triples if t[0].startswith(CODEC_PREFIXES)]
    assert codec == load_tensor_list()
    # the codec comes first, then training-only tensors readers must skip
    assert triples[: len(codec)] == codec
    extras = triples[len(codec) :]
    assert extras and all(name.startswith(EXTRA_PREFIXES) for name, _, _ in extras)
    assert {name.split(".")[0] for name, _, _ in extras} == {
        "discriminator",
        "mel_loss_fn",
        "stft_loss_fn",
    }
    # the same list follows from the yaml by NeMo's naming rules
    assert expected_tensors(nemo.config) == codec


def test_published_config_yaml(published_nemo):
    _, nemo = published_nemo
    config = nemo.config
    assert config["target"] == "nemo.collections.tts.models.audio_codec.AudioCodecModel"
    assert config["sample_rate"] == 22050
    assert config["samples_per_frame"] == 1024
    modules = "nemo.collections.tts.modules.audio_codec_modules."
    assert config["audio_encoder"] == {
        "_target_": modules + "HiFiGANEncoder",
        "encoded_dim": 32,
        "down_sample_rates": [2, 2, 4, 8, 8],
        "base_channels": 24,
        "in_kernel_size": 7,
        "out_kernel_size": 7,
        "resblock_kernel_sizes": [3, 7, 11],
        "resblock_dilation_sizes": [1, 3, 5],
        "activation": "lrelu",
        "pad_mode": "replicate",
    }
    assert config["vector_quantizer"] == {
        "_target_": modules + "GroupFiniteScalarQuantizer",
        "num_groups": 8,
        "num_levels_per_group": [8, 7, 6, 6],
    }
    assert config["audio_decoder"] == {
        "_target_": modules + "CausalHiFiGANDecoder",
        "input_dim": 32,
        "up_sample_rates": [8, 8, 4, 2, 2],
        "base_channels": 864,
        "in_kernel_size": 7,
        "out_kernel_size": 3,
        "resblock_kernel_sizes": [3, 7, 11],
        "resblock_dilation_sizes": [1, 3, 5],
        "activation": "half_snake",
        "output_activation": "clamp",
        "pad_mode": "zeros",
        "n_groups_equal_to_out_channels": True,
    }
    # simple block style: mappings, flow lists of numbers, plain scalars
    for line in nemo.yaml_text.splitlines():
        assert re.fullmatch(r"( {2})?[A-Za-z_]+: ?([-A-Za-z0-9_.]+|\[[0-9, ]+\])?", line), line


def test_nemo_archive_layout(published_nemo):
    path, nemo = published_nemo
    # nanocodec.md §5: tarfile "w:" with arcname "." — the folder itself, then its files
    assert [(m.name, m.type) for m in nemo.members] == [
        (".", tarfile.DIRTYPE),
        ("./model_config.yaml", tarfile.REGTYPE),
        ("./model_weights.ckpt", tarfile.REGTYPE),
    ]
    raw = Path(path).read_bytes()[:512]
    assert raw[257:265] == b"ustar\x0000"
    assert Path(path).stat().st_size % 10240 == 0
    with open(path, "rb") as f:
        assert f.read(2) != b"\x1f\x8b", "the archive must not be compressed"


def test_ckpt_zip_records(published_nemo):
    path, nemo = published_nemo
    archive = nemo.ckpt.zip
    assert nemo.ckpt.root == "model_weights"
    assert archive.testzip() is None  # every CRC-32 is right
    infos = archive.infolist()
    n = len(nemo.ckpt.state)
    names = [i.filename for i in infos]
    assert names == (
        [
            "model_weights/data.pkl",
            "model_weights/.format_version",
            "model_weights/.storage_alignment",
            "model_weights/byteorder",
        ]
        + [f"model_weights/data/{k}" for k in range(n)]
        + ["model_weights/version", "model_weights/.data/serialization_id"]
    )
    assert archive.read("model_weights/byteorder") == b"little"
    assert archive.read("model_weights/version") == b"3\n"
    assert archive.read("model_weights/.format_version") == b"1"
    assert archive.read("model_weights/.storage_alignment") == b"64"
    assert all(i.compress_type == zipfile.ZIP_STORED for i in infos)
    # storages are referenced in order, one per tensor, sized numel × element size
    assert [key for key, _, _ in nemo.ckpt.storages] == [str(k) for k in range(n)]

    # torch aligns every record's data to 64 bytes through the local header's "FB" extra field;
    # the zip sits at a 512-byte boundary in the tar, so the storages stay aligned there too
    ckpt_bytes = Path(nemo.ckpt.path).read_bytes()
    assert nemo.ckpt_offset % 512 == 0
    for info in infos:
        offset = info.header_offset
        assert ckpt_bytes[offset : offset + 4] == b"PK\x03\x04"
        name_len, extra_len = struct.unpack("<HH", ckpt_bytes[offset + 26 : offset + 30])
        extra = ckpt_bytes[offset + 30 + name_len : offset + 30 + name_len + extra_len]
        assert extra[:2] == b"FB"
        data_start = offset + 30 + name_len + extra_len
        assert data_start % 64 == 0, info.filename
        assert ckpt_bytes[data_start : data_start + info.file_size] == archive.read(info)
    # torch.save always ends with a zip64 end-of-central-directory record and locator
    assert ckpt_bytes[-22:-18] == b"PK\x05\x06"
    assert ckpt_bytes[-42:-38] == b"PK\x06\x07"
    assert ckpt_bytes[-98:-94] == b"PK\x06\x06"


def test_data_pkl_is_what_torch_save_writes(tiny_nemo):
    _, nemo = tiny_nemo
    triples = tensor_triples(nemo.ckpt.state)
    if torch is not None:
        state = torch.load(nemo.ckpt.path, map_location="cpu", weights_only=True)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        with zipfile.ZipFile(buffer) as saved:
            expected = saved.read("archive/data.pkl")
    else:
        expected = reference_data_pkl(triples)
    assert nemo.ckpt.data_pkl == expected


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_load_weights_only(published_nemo):
    _, nemo = published_nemo
    state = torch.load(nemo.ckpt.path, map_location="cpu", weights_only=True)
    assert isinstance(state, collections.OrderedDict)
    assert list(state) == list(nemo.ckpt.state)
    for name, tensor in state.items():
        assert np.array_equal(tensor.numpy(), nemo.ckpt.state[name]), name


def test_fsq_buffers(published_nemo):
    _, nemo = published_nemo
    state = nemo.ckpt.state
    for g in range(8):
        # nanocodec.md §4
        base = state[f"vector_quantizer.fsqs.{g}.dim_base_index"]
        levels = state[f"vector_quantizer.fsqs.{g}.num_levels"]
        assert base.dtype == np.int32 and base.shape == (1, 4, 1)
        assert base.reshape(-1).tolist() == [1, 8, 56, 336]
        assert levels.reshape(-1).tolist() == [8, 7, 6, 6]


def test_weight_statistics(published_nemo):
    state = published_nemo[1].ckpt.state
    for name, value in state.items():
        if not name.startswith(CODEC_PREFIXES) or value.dtype != np.float32:
            continue
        assert np.all(np.isfinite(value)), name
        if name.endswith("original0"):
            assert np.all(value > 0), name
        elif name.endswith(".alpha"):
            assert np.all((value > 0.5) & (value < 1.5)), name
        elif name.endswith(".bias"):
            assert np.abs(value).max() < 0.2, name
        elif name.endswith("original1") and value.size > 100:
            assert 0.8 < value.std() < 1.2, name


def test_safetensors_export_matches_nemo(published_nemo, published_safetensors):
    _, nemo = published_nemo
    tensors, metadata, order = published_safetensors
    codec = [n for n in nemo.ckpt.state if n.startswith(CODEC_PREFIXES)]
    assert set(tensors) == set(codec)
    assert len(order) == 694
    for name in codec:
        a, b = tensors[name], nemo.ckpt.state[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name
    assert metadata["format"] == "nemo-codec"
    assert metadata["model_config.yaml"] == nemo.yaml_text


def test_same_seed_same_bytes_other_seed_other_weights(workdir):
    first = generate(workdir / "a.nemo", "tiny", 42, "nemo").read_bytes()
    second = generate(workdir / "b.nemo", "tiny", 42, "nemo").read_bytes()
    assert first == second
    st_first = generate(workdir / "a.safetensors", "tiny", 42, "safetensors").read_bytes()
    st_second = generate(workdir / "b.safetensors", "tiny", 42, "safetensors").read_bytes()
    assert st_first == st_second

    other_dir = workdir / "other"
    other_dir.mkdir()
    generate(other_dir / "c.nemo", "tiny", 43, "nemo")
    this_dir = workdir / "a-unpacked"
    this_dir.mkdir()
    this = Nemo(workdir / "a.nemo", this_dir)
    other = Nemo(other_dir / "c.nemo", other_dir)
    try:
        assert tensor_triples(this.ckpt.state) == tensor_triples(other.ckpt.state)
        for name, value in this.ckpt.state.items():
            if value.dtype == np.int32 or name.endswith(".window"):
                assert np.array_equal(value, other.ckpt.state[name]), name
            else:
                assert not np.array_equal(value, other.ckpt.state[name]), name
    finally:
        this.ckpt.close()
        other.ckpt.close()


def test_tiny_preset(tiny_nemo, workdir):
    _, nemo = tiny_nemo
    config = nemo.config
    assert config["audio_encoder"]["base_channels"] == 4
    assert config["audio_decoder"]["base_channels"] == 64
    # same FSQ geometry and hop as the published codec
    assert config["vector_quantizer"]["num_groups"] == 8
    assert config["vector_quantizer"]["num_levels_per_group"] == [8, 7, 6, 6]
    assert math.prod(config["audio_decoder"]["up_sample_rates"]) == 1024
    assert math.prod(config["audio_encoder"]["down_sample_rates"]) == 1024
    triples = tensor_triples(nemo.ckpt.state)
    codec = [t for t in triples if t[0].startswith(CODEC_PREFIXES)]
    assert codec == expected_tensors(config)
    # same names as the published codec, only narrower
    assert [name for name, _, _ in codec] == [name for name, _, _ in load_tensor_list()]

    tensors, metadata, _ = read_safetensors(
        generate(workdir / "tiny.safetensors", "tiny", 1, "safetensors")
    )
    assert yaml.safe_load(metadata["model_config.yaml"]) == config
    for name, _, _ in codec:
        assert tensors[name].tobytes() == nemo.ckpt.state[name].tobytes(), name


def test_tiny_decoder_output_is_bounded_audio(tiny_nemo):
    _, nemo = tiny_nemo
    rng = np.random.default_rng(3)
    frames = 8
    tokens = rng.integers(0, 2016, size=(8, frames))
    audio = decode(nemo.ckpt.state, nemo.config, tokens)
    assert_plausible_audio(audio, frames)
    other = decode(nemo.ckpt.state, nemo.config, rng.integers(0, 2016, size=(8, frames)))
    assert np.abs(audio - other).max() > 0.05, "the output must depend on the codes"


def test_published_decoder_output_is_bounded_audio(published_nemo):
    _, nemo = published_nemo
    # one frame: 2.4 GFLOP in float64 (nanocodec.md §7.1)
    tokens = np.random.default_rng(5).integers(0, 2016, size=(8, 1))
    assert_plausible_audio(decode(nemo.ckpt.state, nemo.config, tokens), 1)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "huge", "--format", "nemo"], "huge"),
        (["--preset", "tiny", "--format", "zip"], "zip"),
    ],
)
def test_bad_arguments_fail(workdir, args, message):
    require_generator()
    out = workdir / "bad.nemo"
    result = subprocess.run(
        [str(GENERATOR), "--codec-only", "--seed", "1", *args, str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert message in result.stderr
    assert not out.exists()
    assert not list(workdir.glob("bad.nemo.*")), "the temporary file must be removed"


# --- the C API of gepard-codec-config.h, through ctypes ----------------------------------------

MAX_STAGES, MAX_KERNELS, MAX_DILATIONS, MAX_FSQ_DIMS, MAX_DIMS = 8, 4, 4, 8, 8
GEPARD_FORMAT_ERROR_UNSUPPORTED, GEPARD_FORMAT_ERROR_SHAPE = 2, 4


class EncoderConfig(ctypes.Structure):
    _fields_ = [
        ("base_channels", ctypes.c_int),
        ("n_stages", ctypes.c_int),
        ("down_sample_rates", ctypes.c_int * MAX_STAGES),
        ("in_kernel_size", ctypes.c_int),
        ("out_kernel_size", ctypes.c_int),
        ("n_resblock_kernel_sizes", ctypes.c_int),
        ("resblock_kernel_sizes", ctypes.c_int * MAX_KERNELS),
        ("n_resblock_dilation_sizes", ctypes.c_int),
        ("resblock_dilation_sizes", ctypes.c_int * MAX_DILATIONS),
        ("activation", ctypes.c_int),
        ("pad_mode", ctypes.c_int),
    ]


class DecoderConfig(ctypes.Structure):
    _fields_ = [
        ("base_channels", ctypes.c_int),
        ("n_stages", ctypes.c_int),
        ("up_sample_rates", ctypes.c_int * MAX_STAGES),
        ("in_kernel_size", ctypes.c_int),
        ("out_kernel_size", ctypes.c_int),
        ("n_resblock_kernel_sizes", ctypes.c_int),
        ("resblock_kernel_sizes", ctypes.c_int * MAX_KERNELS),
        ("n_resblock_dilation_sizes", ctypes.c_int),
        ("resblock_dilation_sizes", ctypes.c_int * MAX_DILATIONS),
        ("activation", ctypes.c_int),
        ("output_activation", ctypes.c_int),
        ("pad_mode", ctypes.c_int),
        ("n_groups_equal_to_out_channels", ctypes.c_int),
    ]


class CodecConfig(ctypes.Structure):
    _fields_ = [
        ("sample_rate", ctypes.c_int),
        ("samples_per_frame", ctypes.c_int),
        ("latent_dim", ctypes.c_int),
        ("fsq_groups", ctypes.c_int),
        ("fsq_n_dims", ctypes.c_int),
        ("fsq_levels", ctypes.c_int * MAX_FSQ_DIMS),
        ("fsq_eps", ctypes.c_double),
        ("encoder", EncoderConfig),
        ("decoder", DecoderConfig),
    ]


class TensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("n_dims", ctypes.c_uint),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("n_elements", ctypes.c_uint64),
        ("part", ctypes.c_int),
        ("layer", ctypes.c_int),
        ("param", ctypes.c_int),
        ("stage", ctypes.c_int),
        ("branch", ctypes.c_int),
        ("block", ctypes.c_int),
        ("transposed", ctypes.c_int),
        ("in_channels", ctypes.c_int),
        ("out_channels", ctypes.c_int),
        ("kernel_size", ctypes.c_int),
        ("stride", ctypes.c_int),
        ("dilation", ctypes.c_int),
        ("groups", ctypes.c_int),
    ]


class GError(ctypes.Structure):
    _fields_ = [("domain", ctypes.c_uint32), ("code", ctypes.c_int), ("message", ctypes.c_char_p)]


TENSOR_FUNC = ctypes.CFUNCTYPE(None, ctypes.POINTER(TensorInfo), ctypes.c_void_p)
DTYPE_NAMES = {2: "float32", 4: "int32"}  # GEPARD_DTYPE_F32, GEPARD_DTYPE_I32


@pytest.fixture(scope="module")
def libgepard():
    path = BUILD_DIR / "gepard-core" / "libgepard.so"
    if not path.exists():
        pytest.skip(f"{path} is not built")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as error:
        pytest.skip(f"{path} does not load: {error}")
    glib = ctypes.CDLL("libglib-2.0.so.0")
    lib.gepard_codec_config_validate.restype = ctypes.c_int
    lib.gepard_codec_config_validate.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.POINTER(GError)),
    ]
    lib.gepard_codec_config_init_preset.restype = ctypes.c_int
    lib.gepard_codec_config_init_preset.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.POINTER(GError)),
    ]
    lib.gepard_codec_config_foreach_tensor.argtypes = [
        ctypes.c_void_p,
        TENSOR_FUNC,
        ctypes.c_void_p,
    ]
    lib.gepard_codec_config_to_yaml.restype = ctypes.c_void_p
    lib.gepard_codec_config_to_yaml.argtypes = [ctypes.c_void_p]
    lib.gepard_codec_config_get_codebook_size.restype = ctypes.c_int
    lib.gepard_codec_config_get_codebook_size.argtypes = [ctypes.c_void_p]
    glib.g_free.argtypes = [ctypes.c_void_p]
    glib.g_error_free.argtypes = [ctypes.POINTER(GError)]
    return lib, glib


def new_config(libgepard, preset):
    lib, glib = libgepard
    # room to spare, so that a header grown past these mirrors fails the field checks, not memory
    buffer = ctypes.create_string_buffer(ctypes.sizeof(CodecConfig) + 4096)
    error = ctypes.POINTER(GError)()
    assert lib.gepard_codec_config_init_preset(buffer, preset.encode(), ctypes.byref(error))
    return CodecConfig.from_buffer(buffer), buffer


def validate(libgepard, buffer):
    """None when valid, else (code, message)."""
    lib, glib = libgepard
    error = ctypes.POINTER(GError)()
    ok = lib.gepard_codec_config_validate(buffer, ctypes.byref(error))
    if ok:
        assert not error
        return None
    assert error, "a failure must set the GError"
    result = (error.contents.code, error.contents.message.decode())
    glib.g_error_free(error)
    return result


def enumerate_tensors(libgepard, buffer):
    lib, _ = libgepard
    infos = []

    def collect(info, user_data):
        i = info.contents
        infos.append(
            {
                "name": i.name.decode(),
                "shape": tuple(i.shape[: i.n_dims]),
                "dtype": DTYPE_NAMES[i.dtype],
                "n_elements": i.n_elements,
                "layer": i.layer,
                "param": i.param,
                "transposed": bool(i.transposed),
                "conv": (
                    i.in_channels,
                    i.out_channels,
                    i.kernel_size,
                    i.stride,
                    i.dilation,
                    i.groups,
                ),
            }
        )

    lib.gepard_codec_config_foreach_tensor(buffer, TENSOR_FUNC(collect), None)
    return infos


def test_config_presets(libgepard):
    lib, glib = libgepard
    config, buffer = new_config(libgepard, "nanocodec-22khz")
    assert (config.sample_rate, config.samples_per_frame, config.latent_dim) == (22050, 1024, 32)
    assert (config.fsq_groups, list(config.fsq_levels[: config.fsq_n_dims])) == (8, [8, 7, 6, 6])
    assert config.fsq_eps == 1e-3
    assert config.encoder.base_channels == 24 and config.decoder.base_channels == 864
    assert list(config.encoder.down_sample_rates[:5]) == [2, 2, 4, 8, 8]
    assert list(config.decoder.up_sample_rates[:5]) == [8, 8, 4, 2, 2]
    assert (config.decoder.in_kernel_size, config.decoder.out_kernel_size) == (7, 3)
    assert lib.gepard_codec_config_get_codebook_size(buffer) == 2016
    assert validate(libgepard, buffer) is None

    tiny, tiny_buffer = new_config(libgepard, "tiny")
    assert (tiny.encoder.base_channels, tiny.decoder.base_channels) == (4, 64)
    assert validate(libgepard, tiny_buffer) is None

    error = ctypes.POINTER(GError)()
    assert not lib.gepard_codec_config_init_preset(buffer, b"huge", ctypes.byref(error))
    assert error.contents.code == GEPARD_FORMAT_ERROR_UNSUPPORTED
    glib.g_error_free(error)


def test_enumeration_reproduces_appendix_a(libgepard):
    _, buffer = new_config(libgepard, "nanocodec-22khz")
    infos = enumerate_tensors(libgepard, buffer)
    assert [(i["name"], i["shape"], i["dtype"]) for i in infos] == load_tensor_list()
    assert all(i["n_elements"] == math.prod(i["shape"]) for i in infos)
    # conv geometry rides along: e.g. stage 0's transposed conv (nanocodec.md §2.3)
    up0 = [i for i in infos if i["name"].startswith("audio_decoder.up_sample_conv_layers.0.")]
    assert all(i["transposed"] for i in up0)
    assert up0[0]["conv"] == (864, 432, 16, 8, 1, 432)
    down4 = [i for i in infos if i["name"].startswith("audio_encoder.down_sample_conv_layers.4.")]
    assert down4[0]["conv"] == (384, 768, 16, 8, 1, 1)
    res = [
        i
        for i in infos
        if i["name"].startswith("audio_decoder.res_layers.4.res_blocks.2.res_blocks.2.input_conv")
    ]
    assert res[0]["conv"] == (27, 27, 11, 1, 5, 1)


def test_yaml_from_the_library(libgepard):
    lib, glib = libgepard
    _, buffer = new_config(libgepard, "nanocodec-22khz")
    pointer = lib.gepard_codec_config_to_yaml(buffer)
    text = ctypes.string_at(pointer).decode()
    glib.g_free(pointer)
    config = yaml.safe_load(text)
    assert expected_tensors(config) == load_tensor_list()


def _set(path, value):
    """A mutation of a CodecConfig: `path` like "decoder.up_sample_rates.4" or "latent_dim"."""

    def mutate(config):
        *parents, last = path.split(".")
        target = config
        for part in parents:
            target = target[int(part)] if part.isdigit() else getattr(target, part)
        if last.isdigit():
            target[int(last)] = value
        else:
            setattr(target, last, value)

    return mutate


@pytest.mark.parametrize(
    "mutations, code, words",
    [
        ([_set("decoder.up_sample_rates.4", 4)], GEPARD_FORMAT_ERROR_SHAPE, "samples_per_frame"),
        ([_set("encoder.down_sample_rates.0", 4)], GEPARD_FORMAT_ERROR_SHAPE, "samples_per_frame"),
        (
            [_set("encoder.down_sample_rates.0", 1), _set("encoder.down_sample_rates.1", 4)],
            GEPARD_FORMAT_ERROR_SHAPE,
            "rate 1",
        ),
        ([_set("decoder.base_channels", 866)], GEPARD_FORMAT_ERROR_SHAPE, "halved"),
        ([_set("decoder.base_channels", 32)], GEPARD_FORMAT_ERROR_SHAPE, "half_snake"),
        ([_set("latent_dim", 24)], GEPARD_FORMAT_ERROR_SHAPE, "latent"),
        ([_set("fsq_levels.2", 1)], GEPARD_FORMAT_ERROR_SHAPE, "level"),
        ([_set("encoder.in_kernel_size", 6)], GEPARD_FORMAT_ERROR_SHAPE, "in_kernel_size"),
        (
            [_set("encoder.resblock_kernel_sizes.1", 8)],
            GEPARD_FORMAT_ERROR_SHAPE,
            "residual kernel",
        ),
        ([_set("encoder.n_stages", 0)], GEPARD_FORMAT_ERROR_SHAPE, "stages"),
        ([_set("encoder.activation", 1)], GEPARD_FORMAT_ERROR_UNSUPPORTED, "lrelu"),
        ([_set("sample_rate", 0)], GEPARD_FORMAT_ERROR_SHAPE, "sample_rate"),
    ],
)
def test_validate_rejects_inconsistent_configs(libgepard, mutations, code, words):
    config, buffer = new_config(libgepard, "nanocodec-22khz")
    for mutate in mutations:
        mutate(config)
    result = validate(libgepard, buffer)
    assert result is not None, "an inconsistent config must not validate"
    assert result[0] == code, result
    assert words in result[1], result
