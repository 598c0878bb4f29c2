"""Gepard's safetensors reader and writer against the reference implementation (Python safetensors).

Files written by safetensors.numpy.save_file are read by C (through the safetensors-roundtrip CLI),
and files written by the C writer are read back by Python. The C writer is expected to reproduce
the reference's bytes exactly when it copies a reference file.
"""

import codecs
import hashlib
import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

safetensors = pytest.importorskip("safetensors")
from safetensors import deserialize, safe_open  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

try:
    import ml_dtypes
except ImportError:  # bf16 files are then composed by hand
    ml_dtypes = None

SOURCE_DIR = Path(os.environ.get("GEPARD_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BUILD_DIR = Path(os.environ.get("GEPARD_BUILD_DIR", SOURCE_DIR / "build"))
TOOL = BUILD_DIR / "tests" / "safetensors-roundtrip"

NUMPY_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "U8": np.uint8,
}
ALL_DTYPES = ["BF16", *NUMPY_DTYPES]


@pytest.fixture(scope="module")
def tool():
    if not TOOL.is_file():
        pytest.fail(f"{TOOL} is missing: build it with `ninja -C {BUILD_DIR} tests/safetensors-roundtrip`")
    return TOOL


def run_tool(tool, *args, check=True):
    return subprocess.run([str(tool), *map(str, args)], capture_output=True, check=check, timeout=60)


def unescape(field: bytes) -> str:
    """Inverse of the CLI's g_strescape (C escapes, UTF-8 kept as is)."""
    return codecs.escape_decode(field)[0].decode("utf-8")


def dump(tool, path):
    """[(name, dtype, shape, sha256)] in file order, and the metadata dict."""
    out = run_tool(tool, "dump", path).stdout
    tensors, metadata = [], {}
    for line in out.split(b"\n"):
        if not line:
            continue
        kind, *fields = line.split(b"\t")
        if kind == b"tensor":
            name, dtype, shape, digest = fields
            tensors.append((unescape(name), dtype.decode(), json.loads(shape), digest.decode()))
        elif kind == b"metadata":
            key, value = fields
            metadata[unescape(key)] = unescape(value)
        else:
            raise AssertionError(f"unexpected dump line {line!r}")
    return tensors, metadata


def le_bytes(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def bf16_bits(values) -> np.ndarray:
    """float32 values to bfloat16 bit patterns (round to nearest even), as uint16."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    rounded[nan] = (bits[nan] >> 16) | 0x40  # keep NaNs NaN
    return rounded.astype(np.uint16)


class Tensor:
    """A tensor to write: its safetensors dtype, shape and little-endian bytes."""

    def __init__(self, dtype, shape, data: bytes):
        self.dtype, self.shape, self.data = dtype, list(shape), data

    def numpy(self):
        if self.dtype == "BF16":
            bits = np.frombuffer(self.data, dtype="<u2").reshape(self.shape)
            return bits.view(ml_dtypes.bfloat16) if ml_dtypes else bits
        return np.frombuffer(self.data, dtype=np.dtype(NUMPY_DTYPES[self.dtype]).newbyteorder("<")).reshape(
            self.shape
        )


def make_values(dtype, shape, rng):
    count = int(np.prod(shape, dtype=np.int64))
    if dtype in ("F32", "F16", "BF16"):
        values = rng.standard_normal(count).astype(np.float32) * 100
        special = np.array([np.inf, -np.inf, np.nan, -0.0, 1e-40, 6e-8, 65504.0, -1.5], np.float32)
        values[: min(count, len(special))] = special[: min(count, len(special))]
        if dtype == "BF16":
            return Tensor(dtype, shape, le_bytes(bf16_bits(values)))
        return Tensor(dtype, shape, le_bytes(values.astype(NUMPY_DTYPES[dtype])))
    info = np.iinfo(NUMPY_DTYPES[dtype])
    values = rng.integers(info.min, info.max, size=count, dtype=NUMPY_DTYPES[dtype], endpoint=True)
    if count >= 2:
        values[0], values[1] = info.min, info.max
    return Tensor(dtype, shape, le_bytes(values))


def write_raw(path, tensors, metadata=None):
    """The format by hand, laid out as the reference lays it out; for bf16 without ml_dtypes."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, tensor in tensors.items():
        header[name] = {"dtype": tensor.dtype, "shape": tensor.shape,
                        "data_offsets": [offset, offset + len(tensor.data)]}
        offset += len(tensor.data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t.data for t in tensors.values()))


def write_reference(path, tensors, metadata=None):
    """Writes through safetensors.numpy.save_file whenever numpy can hold every dtype."""
    if any(t.dtype == "BF16" for t in tensors.values()) and ml_dtypes is None:
        write_raw(path, tensors, metadata)
    else:
        save_file({name: t.numpy() for name, t in tensors.items()}, str(path), metadata=metadata)


def read_reference(path):
    """name → Tensor, as the reference reads the file."""
    with open(path, "rb") as f:
        entries = deserialize(f.read())
    return {name: Tensor(info["dtype"], info["shape"], bytes(info["data"])) for name, info in entries}


def file_order(path):
    """Tensor names sorted by data offset, from the raw header."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return [name for name, _ in sorted(header.items(), key=lambda item: item[1]["data_offsets"])]


def sample_tensors(dtypes, seed):
    rng = np.random.default_rng(seed)
    tensors = {}
    for dtype in dtypes:
        key = dtype.lower()
        tensors[f"{key}.matrix"] = make_values(dtype, (3, 5), rng)
        tensors[f"{key}.scalar"] = make_values(dtype, (), rng)
        tensors[f"{key}.empty"] = make_values(dtype, (0, 4), rng)
        tensors[f"{key}.odd"] = make_values(dtype, (7,), rng)
        tensors[f"{key}.deep"] = make_values(dtype, (2, 1, 3, 1, 2), rng)
    return tensors


def assert_same_tensors(actual, expected):
    assert sorted(actual) == sorted(expected)
    for name, tensor in expected.items():
        got = actual[name]
        assert (got.dtype, got.shape) == (tensor.dtype, tensor.shape), name
        assert got.data == tensor.data, name


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_c_reads_reference_file(tool, tmp_path, dtype):
    tensors = sample_tensors([dtype], seed=ALL_DTYPES.index(dtype))
    metadata = {"format": "np", "dtype": dtype}
    path = tmp_path / f"{dtype}.safetensors"
    write_reference(path, tensors, metadata)

    dumped, dumped_metadata = dump(tool, path)

    assert [name for name, *_ in dumped] == file_order(path)
    for name, got_dtype, shape, digest in dumped:
        tensor = tensors[name]
        assert got_dtype == tensor.dtype
        assert shape == tensor.shape
        assert digest == hashlib.sha256(tensor.data).hexdigest(), name
    assert dumped_metadata == metadata


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reference_reads_c_file(tool, tmp_path, dtype):
    tensors = sample_tensors([dtype], seed=10 + ALL_DTYPES.index(dtype))
    source, copy = tmp_path / "reference.safetensors", tmp_path / "copy.safetensors"
    write_reference(source, tensors, {"format": "np"})

    run_tool(tool, "copy", source, copy)

    assert_same_tensors(read_reference(copy), tensors)
    with safe_open(str(copy), "np") as f:
        assert f.metadata() == {"format": "np"}
    if dtype in NUMPY_DTYPES:
        loaded = load_file(str(copy))
        for name, tensor in tensors.items():
            np.testing.assert_array_equal(loaded[name], tensor.numpy(), err_msg=name)
    # the C writer lays the file out exactly as the reference does
    assert copy.read_bytes() == source.read_bytes()


def test_mixed_file_round_trip(tool, tmp_path):
    tensors = sample_tensors(ALL_DTYPES, seed=99)
    metadata = {"format": "pt", "note": "all dtypes", "ünïcode": "välue ✓"}
    source, copy, again = (tmp_path / n for n in ("mixed.safetensors", "copy.safetensors", "again.safetensors"))
    write_reference(source, tensors, metadata)

    run_tool(tool, "copy", source, copy)
    run_tool(tool, "copy", copy, again)

    assert copy.read_bytes() == source.read_bytes()
    assert again.read_bytes() == source.read_bytes()
    assert_same_tensors(read_reference(copy), tensors)
    with safe_open(str(copy), "np") as f:
        assert f.metadata() == metadata


def test_escaped_names_and_metadata(tool, tmp_path):
    """Names and metadata that need JSON escapes survive both directions unchanged."""
    odd = ["a b", "ü/ñ", 'q"uote', "back\\slash", "tab\tname", "new\nline", "ctl\x01\x1f\x7f", "emoji 😀", ""]
    rng = np.random.default_rng(5)
    tensors = {name: make_values("F32", (2,), rng) for name in odd}
    metadata = {name or "empty": f"value of {name!r}\r\x08\x0c" for name in odd}
    source, copy = tmp_path / "odd.safetensors", tmp_path / "copy.safetensors"
    write_reference(source, tensors, metadata)

    dumped, dumped_metadata = dump(tool, source)
    assert sorted(name for name, *_ in dumped) == sorted(odd)
    assert dumped_metadata == metadata

    run_tool(tool, "copy", source, copy)
    assert_same_tensors(read_reference(copy), tensors)
    with safe_open(str(copy), "np") as f:
        assert f.metadata() == metadata
    assert copy.read_bytes() == source.read_bytes()


def to_f32(tool, tmp_path, path, name):
    out = tmp_path / f"{name}.f32"
    run_tool(tool, "to-f32", path, name, out)
    return np.fromfile(out, dtype="<f4")


def assert_same_floats(actual, expected):
    assert actual.shape == expected.shape
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan)
    np.testing.assert_array_equal(np.signbit(actual[nan]), np.signbit(expected[nan]))
    np.testing.assert_array_equal(actual[~nan].view(np.uint32), expected[~nan].view(np.uint32))


def test_f16_conversion_matches_numpy(tool, tmp_path):
    bits = np.arange(65536, dtype=np.uint16)
    path = tmp_path / "f16.safetensors"
    save_file({"all": bits.view(np.float16)}, str(path))

    assert_same_floats(to_f32(tool, tmp_path, path, "all"), bits.view(np.float16).astype(np.float32))


def test_bf16_conversion_matches_reference(tool, tmp_path):
    bits = np.arange(65536, dtype=np.uint16)
    path = tmp_path / "bf16.safetensors"
    write_reference(path, {"all": Tensor("BF16", [65536], le_bytes(bits))})

    converted = to_f32(tool, tmp_path, path, "all")

    # bfloat16 is the top half of a float32, NaN payloads included
    np.testing.assert_array_equal(converted.view(np.uint32), bits.astype(np.uint32) << 16)
    if ml_dtypes is not None:
        assert_same_floats(converted, bits.view(ml_dtypes.bfloat16).astype(np.float32))


def test_c_rejects_damaged_reference_file(tool, tmp_path):
    path = tmp_path / "damaged.safetensors"
    save_file({"w": np.arange(4, dtype=np.float32)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-1])  # the last tensor now ends beyond the buffer

    result = run_tool(tool, "dump", path, check=False)

    assert result.returncode == 1
    assert str(path).encode() in result.stderr
    assert b"beyond" in result.stderr
