"""Damaged GGUF files: a fixed-seed fuzzer over the reader, and one regression test per known damage.

Every damaged copy of a small real GGUF file (written here, tests/gguf_files.py) either loads or
fails with one short line (ModelError or ValueError) naming the file: never another exception,
never a traceback, and never memory beyond the file's size. `models inspect` gives the verdict of
the same checks that loading makes.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_files import write_model_gguf
from specwise.errors import ModelError
from specwise.gguf.file import read_header
from specwise.gguf.describe import inspect_gguf
from specwise.gguf.model import load_gguf_model

CASES = 300
MAX_MESSAGE = 600
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _layout(data: bytes) -> dict:
    """Where each field of a GGUF file's header lies: {"kv": [(key, key_at, type_at, value_at)],
    "tensors": [(name, name_at, n_dims_at, dims_at, type_at, offset_at)]} (byte offsets)."""
    at = 24
    kv = []
    tensor_count, kv_count = struct.unpack_from("<QQ", data, 8)

    def skip(kind: int, at: int) -> int:
        if kind in _FIXED:
            return at + _FIXED[kind]
        if kind == 8:
            return at + 8 + struct.unpack_from("<Q", data, at)[0]
        element, count = struct.unpack_from("<IQ", data, at)
        at += 12
        for _ in range(count):
            at = skip(element, at)
        return at

    for _ in range(kv_count):
        (length,) = struct.unpack_from("<Q", data, at)
        key = data[at + 8:at + 8 + length].decode()
        type_at = at + 8 + length
        (kind,) = struct.unpack_from("<I", data, type_at)
        kv.append((key, at, type_at, type_at + 4))
        at = skip(kind, type_at + 4)
    tensors = []
    for _ in range(tensor_count):
        (length,) = struct.unpack_from("<Q", data, at)
        name = data[at + 8:at + 8 + length].decode()
        n_dims_at = at + 8 + length
        (n_dims,) = struct.unpack_from("<I", data, n_dims_at)
        type_at = n_dims_at + 4 + 8 * n_dims
        tensors.append((name, at, n_dims_at, n_dims_at + 4, type_at, type_at + 4))
        at = type_at + 12
    return {"kv": kv, "tensors": tensors}


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> tuple[bytes, dict]:
    path = write_model_gguf(tmp_path_factory.mktemp("fuzz") / "model.gguf", "llama", layers=2, hidden=64,
                            types={"ffn_down": "Q4_0"})
    data = path.read_bytes()
    return data, _layout(data)


def _put(data: bytearray, at: int, fmt: str, value: int) -> None:
    struct.pack_into("<" + fmt, data, at, value & ((1 << (8 * struct.calcsize(fmt))) - 1))


_SIZES = (0, 1, 2, 3, 31, 33, 64, 1537, 1 << 31, 1 << 32, 1 << 40, 1 << 62, (1 << 64) - 1)


def _mutate(rng: random.Random, source: bytes, layout: dict) -> tuple[str, bytes]:
    """One damaged copy of `source` and what was done to it."""
    data = bytearray(source)
    kind = rng.choice(["header", "key", "value_type", "value", "string_length", "dims", "n_dims", "tensor_type",
                       "offset", "name", "name_length", "truncate", "bytes"])
    kvs, tensors = layout["kv"], layout["tensors"]
    if kind == "header":
        at, fmt = rng.choice([(4, "I"), (8, "Q"), (16, "Q")])
        value = rng.choice([0, 1, 2, 3, 1000, 1 << 32, 1 << 62, (1 << 64) - 1]
                           + [struct.unpack_from("<" + fmt, data, at)[0] + d for d in (-1, 1)])
        _put(data, at, fmt, value)
        return f"header field at {at} = {value}", bytes(data)
    if kind in ("key", "value_type", "value", "string_length"):
        key, key_at, type_at, value_at = rng.choice(kvs)
        if kind == "key":
            _put(data, key_at, "Q", rng.choice(_SIZES))
        elif kind == "value_type":
            _put(data, type_at, "I", rng.choice([0, 4, 5, 6, 7, 8, 9, 10, 12, 13, 100, 1 << 31]))
        elif kind == "string_length":
            _put(data, value_at + (12 if struct.unpack_from("<I", data, type_at)[0] == 9 else 0), "Q",
                 rng.choice(_SIZES))
        else:
            _put(data, value_at, "I", rng.choice([0, 1, 3, 7, 1000, 1 << 31, (1 << 32) - 1, rng.randrange(1 << 32)]))
        return f"{kind} of {key}", bytes(data)
    if kind == "truncate":
        keep = rng.randrange(len(data))
        return f"truncated to {keep}", bytes(data[:keep])
    if kind == "bytes":
        end = tensors[-1][5] + 8
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(end)] = rng.randrange(256)
        return "random header bytes", bytes(data)
    name, name_at, n_dims_at, dims_at, type_at, offset_at = rng.choice(tensors)
    if kind == "dims":
        (n_dims,) = struct.unpack_from("<I", data, n_dims_at)
        _put(data, dims_at + 8 * rng.randrange(n_dims), "Q", rng.choice(_SIZES))
    elif kind == "n_dims":
        _put(data, n_dims_at, "I", rng.choice([0, 1, 2, 3, 4, 5, 9, 1 << 31]))
    elif kind == "tensor_type":
        _put(data, type_at, "I", rng.choice([0, 1, 2, 3, 6, 8, 10, 12, 14, 16, 23, 30, 39, 1000]))
    elif kind == "offset":
        other = rng.choice(tensors)
        value = rng.choice([0, 1, 32, 1 << 40, (1 << 64) - 32, struct.unpack_from("<Q", data, other[5])[0],
                            rng.randrange(len(data))])
        _put(data, offset_at, "Q", value)
    elif kind == "name":  # another tensor's name of the same length: a duplicate
        twins = [t for t in tensors if len(t[0]) == len(name) and t[0] != name]
        if twins:
            data[name_at + 8:name_at + 8 + len(name)] = twins[0][0].encode()
    else:
        _put(data, name_at, "Q", rng.choice(_SIZES))
    return f"{kind} of tensor {name}", bytes(data)


def _check_message(error: BaseException, what: str) -> None:
    message = str(error)
    assert "\n" not in message and len(message) < MAX_MESSAGE, f"{what}: {message[:2000]!r}"
    assert message, what


def _load(path: Path, what: str) -> str:
    """'loads' or 'refused', asserting a refusal is one short line of the user's error types."""
    try:
        inspect_gguf(path)
        load_gguf_model(path)
    except (ModelError, ValueError) as error:
        _check_message(error, what)
        return "refused"
    return "loads"


def test_fuzzed_files_load_or_fail_in_one_line(original, tmp_path):
    source, layout = original
    rng = random.Random(20261205)
    outcomes: dict[str, int] = {}
    path = tmp_path / "damaged.gguf"
    for case in range(CASES):
        what, data = _mutate(rng, source, layout)
        path.write_bytes(data)
        try:
            outcome = _load(path, f"case {case} ({what})")
        except (ModelError, ValueError):
            raise
        except Exception as error:  # noqa: BLE001 - the point of the test
            raise AssertionError(f"case {case} ({what}): {type(error).__name__}: {str(error)[:300]}") from error
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("refused", 0) > CASES // 2, outcomes


# --- one regression test per damage found in the field ---------------------------------------------------


def _damaged(original, tmp_path: Path, change) -> Path:
    source, layout = original
    data = bytearray(source)
    change(data, layout)
    path = tmp_path / "damaged.gguf"
    path.write_bytes(bytes(data))
    return path


def _tensor(layout: dict, name: str) -> tuple:
    return next(t for t in layout["tensors"] if t[0] == name)


def _value_at(layout: dict, key: str) -> int:
    return next(entry[3] for entry in layout["kv"] if entry[0] == key)


def _refused(path: Path, *fragments: str) -> str:
    with pytest.raises((ModelError, ValueError)) as caught:
        inspect_gguf(path)
        load_gguf_model(path)
    message = str(caught.value)
    _check_message(caught.value, "regression")
    assert path.name in message or str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def _not_runnable(path: Path, *fragments: str) -> None:
    """inspect says 'no' with the reason, and loading refuses with the same reason."""
    report = inspect_gguf(path)
    assert not report.runs_as_stored
    assert any(all(f in problem for f in fragments) for problem in report.problems), report.problems
    _refused(path, *fragments)


def test_an_odd_dimension(original, tmp_path):
    def change(data, layout):
        _put(data, _tensor(layout, "blk.0.ffn_gate.weight")[3] + 8, "Q", 129)
    _refused(_damaged(original, tmp_path, change), "blk.0.ffn_gate.weight")


def test_a_zero_dimension(original, tmp_path):
    def change(data, layout):
        _put(data, _tensor(layout, "blk.0.attn_q.weight")[3] + 8, "Q", 0)
    _refused(_damaged(original, tmp_path, change), "blk.0.attn_q.weight", "dimensions")


@pytest.mark.parametrize("key", ["llama.attention.head_count", "llama.attention.head_count_kv"])
def test_zero_heads(original, tmp_path, key):
    path = _damaged(original, tmp_path, lambda data, layout: _put(data, _value_at(layout, key), "I", 0))
    _not_runnable(path, key, "positive")


@pytest.mark.parametrize("layers", [0, 1, 1000])
def test_a_layer_count_the_tensors_do_not_match(original, tmp_path, layers):
    path = _damaged(original, tmp_path,
                    lambda data, layout: _put(data, _value_at(layout, "llama.block_count"), "I", layers))
    _not_runnable(path, "llama.block_count")


def test_a_bos_token_past_the_vocabulary(original, tmp_path):
    path = _damaged(original, tmp_path,
                    lambda data, layout: _put(data, _value_at(layout, "tokenizer.ggml.bos_token_id"), "I", 99999))
    _not_runnable(path, "tokenizer.ggml.bos_token_id", "vocabulary")


def test_deeply_nested_arrays(tmp_path):
    path = tmp_path / "nested.gguf"
    depth = 20_000
    key = b"x.nested"
    body = struct.pack("<Q", len(key)) + key + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * depth
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + body + struct.pack("<IQ", 0, 0))
    _refused(path, "nests arrays")


def test_a_misaligned_header_names_no_megabytes(original, tmp_path):
    def change(data, layout):  # 2 dimensions read as 1: the walk reads a dimension as the next name's length
        _put(data, _tensor(layout, "blk.0.attn_q.weight")[2], "I", 1)
    message = _refused(_damaged(original, tmp_path, change))
    assert len(message) < MAX_MESSAGE


def test_overlapping_tensors_are_refused_before_reading(original, tmp_path):
    def change(data, layout):
        first = struct.unpack_from("<Q", data, layout["tensors"][0][5])[0]
        for tensor in layout["tensors"]:
            _put(data, tensor[5], "Q", first)
    _refused(_damaged(original, tmp_path, change), "overlap")


def test_a_truncated_file(original, tmp_path):
    path = tmp_path / "damaged.gguf"
    path.write_bytes(original[0][:-500])
    _refused(path, "cut short")


def test_an_offset_of_2_to_the_40(original, tmp_path):
    def change(data, layout):
        _put(data, _tensor(layout, "blk.1.ffn_up.weight")[5], "Q", 1 << 40)
    _refused(_damaged(original, tmp_path, change), "blk.1.ffn_up.weight", "cut short")


def test_a_dimension_of_2_to_the_62(original, tmp_path):
    def change(data, layout):
        _put(data, _tensor(layout, "token_embd.weight")[3] + 8, "Q", 1 << 62)
    _refused(_damaged(original, tmp_path, change), "token_embd.weight")


def test_a_duplicate_tensor_name(original, tmp_path):
    def change(data, layout):
        name_at = _tensor(layout, "blk.0.attn_k.weight")[1]
        data[name_at + 8:name_at + 8 + len("blk.0.attn_k.weight")] = b"blk.0.attn_q.weight"
    _refused(_damaged(original, tmp_path, change), "blk.0.attn_q.weight", "twice")


def test_a_directory_named_like_a_gguf_file(tmp_path):
    directory = tmp_path / "x.gguf"
    directory.mkdir()
    _refused(directory, "is a directory")
    with pytest.raises(ModelError, match="is a directory"):
        from specwise.store.commands import cmd_models_inspect

        cmd_models_inspect(str(directory))


def test_a_vector_retyped_to_a_block_type(original, tmp_path):
    def change(data, layout):
        _put(data, _tensor(layout, "blk.0.attn_norm.weight")[4], "I", 2)  # F32 -> Q4_0
    _not_runnable(_damaged(original, tmp_path, change), "blk.0.attn_norm.weight", "Q4_0")


def test_a_valid_file_loads_as_before(original, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(original[0])
    assert inspect_gguf(path).runs_as_stored
    assert len(read_header(path).tensors) == len(original[1]["tensors"])
    load_gguf_model(path)


# --- through the CLI: exit 2, one line, bounded memory ----------------------------------------------------


_PEAK = ("import resource, subprocess, sys\n"
         "status = subprocess.run(sys.argv[2:]).returncode\n"
         "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
         "sys.exit(status)")


def _run(args: list[str], tmp_path: Path) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr, peak RSS in bytes) of a command, started from a small Python process
    (a child forked from this one would count this process's memory as its own)."""
    peak = tmp_path / "peak.txt"
    done = subprocess.run([sys.executable, "-S", "-c", _PEAK, str(peak), *args], capture_output=True, text=True,
                          env={**os.environ, "SPECWISE_DEBUG": "0"})
    return done.returncode, done.stdout, done.stderr, int(peak.read_text()) * 1024


def _big_file(tmp_path: Path) -> Path:
    """A model whose embedding is some 20 MB (F32), so that reading it shows in the peak RSS."""
    return write_model_gguf(tmp_path / "big.gguf", "llama", layers=1, hidden=64, padding=80_000,
                            types={"token_embd": "F32"})


def test_the_cli_refuses_damaged_files_in_one_line_within_the_file_size(original, tmp_path):
    big = _big_file(tmp_path)
    inspect = [sys.executable, "-m", "specwise.cli", "models", "inspect"]
    status, _, err, baseline = _run(inspect + [str(big)], tmp_path)
    assert status == 0, err
    size = big.stat().st_size
    source, layout = original
    rng = random.Random(7)
    cases = []
    for index in range(4):
        while True:
            what, data = _mutate(rng, source, layout)
            path = tmp_path / f"damaged{index}.gguf"
            path.write_bytes(data)
            if _load(path, what) == "refused":
                break
        cases.append((what, path))
    big_data = bytearray(big.read_bytes())
    big_layout = _layout(bytes(big_data))
    first = struct.unpack_from("<Q", big_data, big_layout["tensors"][0][5])[0]
    for tensor in big_layout["tensors"]:
        _put(big_data, tensor[5], "Q", first)
    overlapping = tmp_path / "overlapping.gguf"
    overlapping.write_bytes(bytes(big_data))
    cases.append(("overlapping", overlapping))
    worst = 0
    for what, path in cases:
        status, out, err, peak = _run(inspect + [str(path)], tmp_path)
        lines = err.strip().splitlines()
        assert status == 2, (what, status, err[-2000:])
        assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, (what, err[-2000:])
        assert len(lines[0]) < MAX_MESSAGE + 20, what
        assert peak <= baseline + 2 * path.stat().st_size, (what, peak, baseline)
        worst = max(worst, peak)
    # the loader itself (generate, serve, the Python API), on the overlapping file: refused before it reads
    load = [sys.executable, "-c", "import sys\nfrom specwise.gguf.model import load_gguf_model\n"
            "try:\n    load_gguf_model(sys.argv[1])\nexcept ValueError as e:\n    print(e, file=sys.stderr)\n"
            "    sys.exit(2)"]
    status, _, err, peak = _run(load + [str(overlapping)], tmp_path)
    assert status == 2 and "overlap" in err, err[-2000:]
    status, _, err, valid_peak = _run(load + [str(big)], tmp_path)
    assert status == 0, err[-2000:]
    assert peak <= valid_peak + (16 << 20), (peak, valid_peak)  # refused before any tensor is read
    print(f"file {size >> 20} MB; inspect peak {baseline >> 20} MB (valid), {worst >> 20} MB (damaged); "
          f"load peak {valid_peak >> 20} MB (valid), {peak >> 20} MB (overlapping)")


def test_the_tokenizer_alone_refuses_a_bos_token_past_the_vocabulary(original, tmp_path):
    from specwise.gguf.tokenizer import gguf_tokenizer

    path = _damaged(original, tmp_path,
                    lambda data, layout: _put(data, _value_at(layout, "tokenizer.ggml.bos_token_id"), "I", 99999))
    with pytest.raises(ModelError, match="damaged.gguf: tokenizer.ggml.bos_token_id"):
        gguf_tokenizer(path)
