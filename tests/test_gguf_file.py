"""The GGUF header reader (gguf/file.py) against the `gguf` package's own reader and writer:
the same tensor table for files holding every kind of metadata value, and a clear error for a
file that is not GGUF, of another version, or cut short."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from specwise.gguf.file import GGML_TYPES, GGUFFormatError, read_header, tensor_bytes, type_name
from specwise.gguf.model import load_gguf_model
from specwise.testing import write_tiny_gguf_model


def _table(path):
    return [(e.name, e.ggml_type, e.shape, e.data_offset) for e in read_header(path).tensors]


def _reference_table(path):
    return [(t.name, int(t.tensor_type), tuple(int(d) for d in t.shape), int(t.data_offset))
            for t in gguf.GGUFReader(path).tensors]


def _write(path, alignment: int | None = None) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_uint8("test.u8", 7)
    writer.add_int16("test.i16", -3)
    writer.add_float64("test.f64", 0.25)
    writer.add_bool("test.flag", True)
    writer.add_string("test.name", "späť")
    writer.add_array("test.tokens", ["a", "", "long token " * 20, "<|im_end|>"])
    writer.add_array("test.scores", [0.5, -1.0, 2.0])
    writer.add_array("test.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    writer.add_tensor("a.weight", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("b.weight", rng.standard_normal(7).astype(np.float16))
    writer.add_tensor("c.weight", rng.integers(0, 255, (4, 34), dtype=np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("alignment", [None, 64, 1024])
def test_the_tensor_table_is_the_gguf_packages(tmp_path, alignment):
    path = tmp_path / "x.gguf"
    _write(path, alignment)
    assert _table(path) == _reference_table(path)
    header = read_header(path)
    assert header.version == 3
    assert header.data_offset % (alignment or 32) == 0
    assert header.metadata["general.architecture"] == "llama"
    assert header.metadata["test.name"] == "späť"
    assert header.metadata["test.i16"] == -3 and header.metadata["test.flag"] is True
    assert header.metadata["test.tokens"] == 4  # arrays are walked past: their length only
    assert header.metadata["test.nested"] == 2


def test_a_model_file_reads_the_same_table_and_loads(tmp_path):
    path, model_dir = write_tiny_gguf_model(tmp_path, seed=0)
    assert _table(path) == _reference_table(path)
    load_gguf_model(path, model_dir)  # the weights land where the model expects them (test_gguf_model checks values)


def test_a_file_that_is_not_gguf_is_named(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}" + bytes(64))
    with pytest.raises(GGUFFormatError, match="model.safetensors is not a GGUF file"):
        read_header(path)
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF")
    with pytest.raises(GGUFFormatError, match="too short to be a GGUF file"):
        read_header(tmp_path / "tiny.gguf")
    with pytest.raises(GGUFFormatError, match="cannot open the GGUF file"):
        read_header(tmp_path / "missing.gguf")


def test_another_version_is_named(tmp_path):
    path = tmp_path / "x.gguf"
    _write(path)
    data = bytearray(path.read_bytes())
    data[4:8] = (7).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFFormatError, match="GGUF version 7 is not supported"):
        read_header(path)


@pytest.mark.parametrize("keep", [40, 200, 400])
def test_a_header_cut_short_is_named(tmp_path, keep):
    path = tmp_path / "x.gguf"
    _write(path)
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(GGUFFormatError, match="cut short|past the end"):
        read_header(path)


def test_tensor_data_cut_short_is_named(tmp_path):
    path, model_dir = write_tiny_gguf_model(tmp_path, seed=0)
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(GGUFFormatError, match="is cut short .*prepare it again"):
        load_gguf_model(path, model_dir)


def test_type_names_and_sizes_are_ggmls():
    for ggml_type, (name, block_values, block_bytes) in GGML_TYPES.items():
        qtype = gguf.GGMLQuantizationType(ggml_type)
        assert (name, (block_values, block_bytes)) == (qtype.name, gguf.GGML_QUANT_SIZES[qtype])
    iq2_xs = int(gguf.GGMLQuantizationType.IQ2_XS)  # a type specwise does not read: gguf's table sizes it
    assert (type_name(iq2_xs), tensor_bytes(iq2_xs, (512, 3))) == ("IQ2_XS", 6 * 74)
    assert tensor_bytes(12, (256, 4)) == 4 * 144 and tensor_bytes(0, (7, 2)) == 56
    assert (type_name(999), tensor_bytes(999, (32,))) == ("ggml type 999", None)
