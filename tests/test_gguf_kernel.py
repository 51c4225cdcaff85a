"""The GGUF block-quantized linear kernel against gguf's own dequantizer, on every kernel path.

Two references for y = x @ W.T, W = gguf.quants.dequantize(bytes) in float64:
- exact integer math: the kernel quantizes each activation row to int8 per block (q = round(x * 127 /
  amax), scale amax / 127, per 256 values for the K-quants and IQ4_XS, per 32 for the other types). With
  the same x̂ = q * scale replicated here, the only difference left is float32 rounding: the kernel adds
  one or two float terms per block (at most 64 here, each rounded once, plus the int -> float conversion
  of its integer sum), so |y - W @ x̂| <= 2^-16 * (|W| @ |x̂|), which leaves a 4x margin over 64 * 2^-24
  for the Q4_K min terms that are summed apart from the scale terms. For the other types with a min
  (Q4_1, Q5_1, Q2_K, Q5_K) the scale and min terms are rounded apart and may cancel in W, so the bound
  takes |scale part| + |min part| of each weight for |W| (both parts from gguf's dequantizer, of the
  blocks with the other part's float scale zeroed);
- the activation quantization itself: each |x_i - x̂_i| <= amax_b / 254 (half a step), so
  |y - W @ x| <= sum_b amax_b / 254 * ||W_b||_1 (Hölder per block), plus the rounding bound above.

Block bytes are random in every field (extreme codes included) with sane fp16 scales, since gguf can
quantize only some of the types; those it can quantize are checked on its own blocks too.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from specwise.kernels import gguf as gk  # noqa: E402
from specwise.kernels.gguf import GGUFWeight, dequantize_rows, gguf_linear  # noqa: E402
from specwise.store.catalog import DEFAULT_DRAFTER, DEFAULT_TARGET, KNOWN_MODELS  # noqa: E402
from specwise.paths import gguf_dir  # noqa: E402

TYPES = (T.Q4_K, T.Q6_K, T.Q5_0, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_1, T.IQ4_NL, T.Q2_K, T.Q3_K, T.Q5_K, T.IQ4_XS)
# Types whose weights are scale * value + min: (offset of the scale's fp16 in a block, of the min's).
MIN_FIELDS = {T.Q4_1: (0, 2), T.Q5_1: (0, 2), T.Q5_K: (0, 2), T.Q2_K: (80, 82)}


def _path_or_skip(paths: list[str], path: str) -> str:
    if path not in paths:
        pytest.skip(f"this CPU cannot run the {path} path")
    return path


ALL_PATHS = pytest.mark.parametrize("path", gk.PATHS)


def random_blocks(qtype: T, out_features: int, in_features: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes for every field (extreme quants included) with sane fp16 scales."""
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n = out_features * in_features // block_values
    raw = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)

    def f16(lo: float, hi: float) -> np.ndarray:
        return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)

    if qtype in (T.Q4_K, T.Q5_K):
        raw[:, 0:2], raw[:, 2:4] = f16(1e-3, 1e-2), f16(1e-3, 1e-2)  # d, dmin
    elif qtype == T.Q2_K:
        raw[:, 80:82], raw[:, 82:84] = f16(1e-3, 1e-2), f16(1e-3, 1e-2)
    elif qtype == T.Q6_K:
        raw[:, 208:210] = f16(-1e-3, 1e-3)
    elif qtype == T.Q3_K:
        raw[:, 108:110] = f16(-1e-2, 1e-2)
    elif qtype in (T.Q4_1, T.Q5_1):
        raw[:, 0:2], raw[:, 2:4] = f16(-1e-2, 1e-2), f16(-0.1, 0.1)  # d, m
    elif qtype in (T.IQ4_NL, T.IQ4_XS):
        raw[:, 0:2] = f16(-1e-3, 1e-3)
    else:
        raw[:, 0:2] = f16(-1e-2, 1e-2)
    return raw.reshape(out_features, -1)


def term_magnitudes(raw: np.ndarray, qtype: T, out_features: int, in_features: int) -> np.ndarray:
    """|scale part| + |min part| of every weight (float64), by gguf's dequantizer; |W| for types without a min."""
    def dense(blocks: np.ndarray) -> np.ndarray:
        return gguf.quants.dequantize(blocks, qtype).reshape(out_features, in_features).astype(np.float64)

    if qtype not in MIN_FIELDS:
        return np.abs(dense(raw))
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    parts = []
    for zeroed in MIN_FIELDS[qtype]:
        blocks = raw.reshape(-1, block_bytes).copy()
        blocks[:, zeroed:zeroed + 2] = 0  # fp16 zero: that part of every weight vanishes
        parts.append(np.abs(dense(blocks.reshape(raw.shape))))
    return parts[0] + parts[1]


def weight_of(raw: np.ndarray, qtype: T, out_features: int, in_features: int) -> tuple[GGUFWeight, np.ndarray]:
    w = GGUFWeight(torch.from_numpy(np.ascontiguousarray(raw)), int(qtype), (out_features, in_features))
    dense = gguf.quants.dequantize(raw, qtype).reshape(out_features, in_features).astype(np.float64)
    return w, dense


def quantized_activations(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's int8 activations, dequantized (x̂), and each value's block amax."""
    xb = x.astype(np.float32).reshape(x.shape[0], -1, block)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv)  # float32 product, rounded half to even, as the kernel does
    scale = (amax / np.float32(127)).astype(np.float32)
    return (q.astype(np.float64) * scale).reshape(x.shape), np.broadcast_to(amax, xb.shape).reshape(x.shape)


class Reference:
    """Both references and their bounds for rows x (see the module docstring); rows are independent.
    `magnitudes` (default |dense|) are the weights' magnitudes for the rounding bound."""

    def __init__(self, x: np.ndarray, dense: np.ndarray, block: int, magnitudes: np.ndarray | None = None) -> None:
        xq, amax = quantized_activations(x, block)
        self.exact_math, self.true = xq @ dense.T, x.astype(np.float64) @ dense.T
        magnitudes = np.abs(dense) if magnitudes is None else magnitudes
        self.rounding = 2.0**-16 * (np.abs(xq) @ magnitudes.T) + 1e-30
        self.quantization = (amax / 254 * 1.001) @ np.abs(dense).T + self.rounding

    def check(self, y: torch.Tensor) -> None:
        n, y = len(y), y.double().numpy()
        np.testing.assert_array_less(np.abs(y - self.exact_math[:n]), self.rounding[:n])
        np.testing.assert_array_less(np.abs(y - self.true[:n]), self.quantization[:n])


def activations(n: int, in_features: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((n, in_features)).astype(np.float32)
    x[0, 5] = 60.0  # an outlier, as real hidden states have
    if n > 2:
        x[2] = 0.0  # an all-zero row: scale 0
    return x


SHAPES = {  # (out_features, in_features): odd outputs; one and several blocks; an odd number of 32-blocks
    T.Q4_K: [(3, 256), (17, 512), (255, 1280)],
    T.Q6_K: [(3, 256), (17, 768), (255, 1280)],
    T.Q5_0: [(3, 32), (17, 96), (255, 544)],
    T.Q8_0: [(3, 32), (17, 96), (255, 544)],
}
for _qtype in TYPES:
    SHAPES.setdefault(_qtype, [(3, 256), (17, 768), (255, 1280)] if gguf.GGML_QUANT_SIZES[_qtype][0] == 256
                      else [(3, 32), (17, 96), (255, 544)])


def block_of(qtype: T) -> int:
    return gguf.GGML_QUANT_SIZES[qtype][0]


def reference_for(x: np.ndarray, raw: np.ndarray, qtype: T, out_features: int, in_features: int,
                  dense: np.ndarray) -> Reference:
    magnitudes = term_magnitudes(raw, qtype, out_features, in_features) if qtype in MIN_FIELDS else None
    return Reference(x, dense, block_of(qtype), magnitudes)


@ALL_PATHS
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matches_gguf_dequantize_for_1_to_32_rows(paths, path, qtype):
    path = _path_or_skip(paths, path)
    rng = np.random.default_rng(int(qtype))
    for out_features, in_features in SHAPES[qtype]:
        raw = random_blocks(qtype, out_features, in_features, rng)
        w, dense = weight_of(raw, qtype, out_features, in_features)
        x = activations(32, in_features, rng)
        reference = reference_for(x, raw, qtype, out_features, in_features, dense)
        for n in range(1, 33):
            y = gguf_linear(torch.from_numpy(x[:n]), w, path=path)
            assert y.shape == (n, out_features) and y.dtype == torch.float32
            reference.check(y)


@ALL_PATHS
@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_1], ids=lambda t: t.name)
def test_matches_gguf_on_weights_quantized_by_gguf(paths, path, qtype):
    path = _path_or_skip(paths, path)
    rng = np.random.default_rng(7)
    floats = rng.standard_normal((33, 160)).astype(np.float32) * 0.05
    raw = gguf.quants.quantize(floats, qtype)
    w, dense = weight_of(raw, qtype, 33, 160)
    x = activations(9, 160, rng)
    reference_for(x, raw, qtype, 33, 160, dense).check(gguf_linear(torch.from_numpy(x), w, path=path))


@ALL_PATHS
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_a_row_never_depends_on_the_other_rows(paths, path, qtype):
    path = _path_or_skip(paths, path)
    rng = np.random.default_rng(11)
    in_features = 512 if block_of(qtype) == 256 else 96
    w, _ = weight_of(random_blocks(qtype, 19, in_features, rng), qtype, 19, in_features)
    x = torch.from_numpy(activations(130, in_features, rng))
    alone = torch.cat([gguf_linear(x[i:i + 1], w, path=path) for i in range(len(x))])
    for n in [*range(1, 33), 33, 63, 64, 65, 100, 130]:  # tiles, remainders, the 64-row chunk boundary
        together = gguf_linear(x[:n], w, path=path)
        for i in range(n):
            assert torch.equal(together[i], alone[i]), f"{path} {qtype.name}: row {i} of {n} differs"


@ALL_PATHS
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [5, 11, 13, 17])  # 5: Q4_K / Q5_K two weight rows a tile; 17: the AMX tiles too
def test_an_output_row_never_depends_on_its_neighbours_or_the_thread_split(paths, path, qtype, rows):
    """The SIMD tiles take several output rows a step (the 32-value types eight, lanes = output rows; Q4_0's
    AVX-512 panel, from 12 activation rows, sixteen; Q4_K and Q5_K's AVX-512 tiles two for 2-8 activation
    rows): a row's result must not depend on which rows share its
    step, the tail of a range included. Dropping the first s rows moves every other row to another place in
    its group; 1 and 2 threads split the range."""
    path = _path_or_skip(paths, path)
    rng = np.random.default_rng(13)
    in_features = 512 if block_of(qtype) == 256 else 96
    raw = random_blocks(qtype, 27, in_features, rng)
    x = torch.from_numpy(activations(rows, in_features, rng))
    whole = gguf_linear(x, weight_of(raw, qtype, 27, in_features)[0], path=path)
    for s in range(1, 18):
        part = gguf_linear(x, weight_of(raw[s:], qtype, 27 - s, in_features)[0], path=path)
        assert torch.equal(part, whole[:, s:]), f"{path} {qtype.name}: rows {s}.. differ without the first {s}"
    for n in (1, 9):
        part = gguf_linear(x, weight_of(raw[:n], qtype, n, in_features)[0], path=path)
        assert torch.equal(part, whole[:, :n]), f"{path} {qtype.name}: a range of {n} rows differs"
    w = weight_of(raw, qtype, 27, in_features)[0]
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            assert torch.equal(gguf_linear(x, w, path=path), whole), f"{path} {qtype.name}: {t} threads differ"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_path_quantizes_activations_identically(paths, qtype):
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    in_features = 3 * block
    x = activations(6, in_features, np.random.default_rng(19))
    x[1] *= 1e-3
    x[3, 1] = np.nan
    x[4, :block] = 0.0  # a block of zeros: scale 0
    raw = {path: gk.gguf_kernel_module().quantize_activations(torch.from_numpy(x), int(qtype), in_features, path)
           for path in paths}
    for path in paths:
        assert torch.equal(raw[path], raw["scalar"]), f"{path} quantizes differently"
    # The layout (gguf_activations.h): 256-value types: 576-byte blocks, q at 0, d at 304, q again at 320
    # with its 16-byte units transposed as a 4x4 matrix; 32-value types: 192-byte pairs of blocks, q at 0,
    # the two corrections -offset * sum(q) at 64 and 96 (offset 16 for Q5_0, 128 for the others: Q4_1 and
    # Q5_1 read their sums of q from it), the two d at 128 and 160.
    data = raw["scalar"].numpy()
    if block == 256:
        blocks = data.reshape(6, -1, 576)
        q, d = blocks[..., :256].view(np.int8), blocks[..., 304:308].copy().view(np.float32)[..., 0]
        transposed = blocks[..., 320:].view(np.int8).reshape(6, -1, 4, 4, 16).swapaxes(2, 3)
        assert np.array_equal(transposed.reshape(q.shape), q)
    else:
        pairs = data.reshape(6, -1, 192)
        q = pairs[..., :64].view(np.int8).reshape(6, -1, 32)[:, :in_features // 32]
        d = np.stack([pairs[..., 128:132], pairs[..., 160:164]], axis=2).copy().view(np.float32)
        d = d.reshape(6, -1)[:, :in_features // 32]
        corr = np.stack([pairs[..., 64:68], pairs[..., 96:100]], axis=2).copy().view(np.int32)
        corr = corr.reshape(6, -1)[:, :in_features // 32]
        offset = 16 if qtype == T.Q5_0 else 128
        assert np.array_equal(corr, -offset * q.astype(np.int32).sum(axis=-1))
    xb = x.reshape(6, -1, block)
    amax = np.abs(xb).max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    finite = np.isfinite(xb).all(axis=-1)
    assert np.array_equal(q[finite], np.rint(xb * inv[..., None])[finite].astype(np.int8))
    assert np.array_equal(d[finite], (amax / np.float32(127))[finite])
    assert np.isnan(d[~finite]).all() and (q[~finite] == 0).all()


def test_results_do_not_depend_on_the_thread_count(paths):
    rng = np.random.default_rng(3)
    w, _ = weight_of(random_blocks(T.Q4_K, 255, 512, rng), T.Q4_K, 255, 512)
    x = torch.from_numpy(activations(7, 512, rng))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gguf_linear(x, w)
        torch.set_num_threads(2)
        two = gguf_linear(x, w)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_bias_dtypes_and_shapes(paths):
    rng = np.random.default_rng(5)
    w, _ = weight_of(random_blocks(T.Q6_K, 17, 256, rng), T.Q6_K, 17, 256)
    x = torch.from_numpy(activations(6, 256, rng))
    bias = torch.randn(17)
    plain = gguf_linear(x, w)
    assert torch.equal(gguf_linear(x, w, bias), plain + bias)
    assert torch.equal(gguf_linear(x.view(2, 3, 256), w, bias), (plain + bias).view(2, 3, 17))
    xb = x.bfloat16()
    yb = gguf_linear(xb, w, bias)
    assert yb.dtype == torch.bfloat16
    assert torch.equal(yb, (gguf_linear(xb.float(), w) + bias).bfloat16())
    assert gguf_linear(torch.empty(0, 256), w).shape == (0, 17)


def test_non_finite_inputs_give_nan_rows(paths):
    rng = np.random.default_rng(6)
    w, _ = weight_of(random_blocks(T.Q4_K, 5, 256, rng), T.Q4_K, 5, 256)
    x = torch.randn(3, 256)
    x[1, 7] = float("inf")
    y = gguf_linear(x, w)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_rows_is_bit_identical_to_gguf(paths, qtype):
    rng = np.random.default_rng(13)
    in_features = 512 if block_of(qtype) == 256 else 96
    raw = random_blocks(qtype, 23, in_features, rng)
    w, _ = weight_of(raw, qtype, 23, in_features)
    ids = torch.tensor([[4, 0], [22, 4]])
    rows = dequantize_rows(w, ids)
    assert rows.shape == (2, 2, in_features) and rows.dtype == torch.float32
    expected = gguf.quants.dequantize(raw[ids.reshape(-1).numpy()], qtype).reshape(2, 2, in_features)
    assert np.array_equal(rows.numpy(), expected)
    with pytest.raises(RuntimeError, match="out of range"):
        dequantize_rows(w, torch.tensor([23]))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_bf16_is_gguf_rounded_to_bfloat16(paths, qtype):
    rng = np.random.default_rng(17)
    in_features = 512 if block_of(qtype) == 256 else 96
    raw = random_blocks(qtype, 37, in_features, rng)
    w, dense = weight_of(raw, qtype, 37, in_features)
    got = gk.dequantize_bf16(w)
    assert got.dtype == torch.bfloat16 and got.shape == (37, in_features)
    want = torch.from_numpy(dense).to(torch.bfloat16)
    assert torch.equal(got, want)
    assert torch.equal(gk.dequantize_bf16(w, simd=False), want)  # the portable loop, on every CPU
    assert torch.equal(gk.dequantize_bf16(w, (5, 21)), want[5:21])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_many_rows_route_through_bfloat16_within_tolerance(paths, qtype, monkeypatch):
    """A long prompt on a native-bfloat16 CPU multiplies a temporary bfloat16 copy (prefill only needs
    tolerance); forced here so that every CPU checks it."""
    monkeypatch.setattr(gk, "many_rows_route", lambda: gk.PREFILL_ROWS)
    rng = np.random.default_rng(19)
    out_features, in_features = SHAPES[qtype][-1]
    w, dense = weight_of(random_blocks(qtype, out_features, in_features, rng), qtype, out_features, in_features)
    x = activations(gk.PREFILL_ROWS, in_features, rng)
    bias = torch.from_numpy(rng.standard_normal(out_features).astype(np.float32))
    assert torch.equal(gguf_linear(torch.from_numpy(x), w, bias), gguf_linear(torch.from_numpy(x), w, bias,
                                                                            path=gk.kernel_path()))  # not asked
    with gk.prefill():
        routed = gguf_linear(torch.from_numpy(x), w, bias)
    exact = torch.from_numpy(x.astype(np.float64) @ dense.T.astype(np.float64)).float() + bias
    assert routed.shape == exact.shape and routed.dtype == torch.bfloat16  # the caller's ops promote it
    assert ((routed.float() - exact).norm() / exact.norm()) < 0.01  # bfloat16 rounding of x, weights, output
    monkeypatch.setattr(gk, "_SLAB_BYTES", 16 * 2 * in_features)  # slabs of 16 rows: the same function
    with gk.prefill():
        slabs = gguf_linear(torch.from_numpy(x), w, bias).float()
    assert ((slabs - exact).norm() / exact.norm()) < 0.01
    with gk.prefill():  # fewer rows: the kernel, as always
        kernel = gguf_linear(torch.from_numpy(x[:gk.PREFILL_ROWS - 1]), w, bias)
    assert torch.equal(kernel, gguf_linear(torch.from_numpy(x[:gk.PREFILL_ROWS - 1]), w, bias, path=gk.kernel_path()))


@pytest.mark.parametrize("qtype", [T.IQ2_XXS, T.IQ3_S, T.IQ1_M, T.TQ1_0, T.TQ2_0, T.MXFP4], ids=lambda t: t.name)
def test_other_block_types_are_refused_by_name(paths, qtype):
    values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    with pytest.raises(ValueError, match=rf"{qtype.name} weights are not supported .*supported: Q4_0, Q4_1"):
        GGUFWeight(torch.zeros(2, block_bytes, dtype=torch.uint8), int(qtype), (2, values))
    with pytest.raises(RuntimeError, match="not supported"):  # the compiled kernel checks as well
        gk.gguf_kernel_module().gguf_linear(torch.zeros(1, values), torch.zeros(2, block_bytes, dtype=torch.uint8),
                                            int(qtype), 2, values, None, "scalar")


def test_unsupported_types_and_wrong_shapes_are_clear_errors(paths):
    with pytest.raises(ValueError, match="IQ2_XXS"):
        GGUFWeight(torch.zeros(2, 66, dtype=torch.uint8), int(T.IQ2_XXS), (2, 256))
    assert GGUFWeight(torch.zeros(2, 18, dtype=torch.uint8), int(T.Q4_0), (2, 32)).type_name == "Q4_0"
    with pytest.raises(ValueError, match="F32"):
        GGUFWeight(torch.zeros(2, 128, dtype=torch.uint8), int(T.F32), (2, 32))
    with pytest.raises(ValueError, match="multiple of 256"):
        GGUFWeight(torch.zeros(2, 144, dtype=torch.uint8), int(T.Q4_K), (2, 128))
    with pytest.raises(ValueError, match=r"shape \(2, 144\)"):
        GGUFWeight(torch.zeros(2, 145, dtype=torch.uint8), int(T.Q4_K), (2, 256))
    with pytest.raises(ValueError, match="uint8"):
        GGUFWeight(torch.zeros(2, 144, dtype=torch.int8), int(T.Q4_K), (2, 256))
    w = GGUFWeight(torch.zeros(2, 144, dtype=torch.uint8), int(T.Q4_K), (2, 256))
    with pytest.raises(ValueError, match="expects 256"):
        gguf_linear(torch.zeros(1, 255), w)
    with pytest.raises(ValueError, match="bias"):
        gguf_linear(torch.zeros(1, 256), w, torch.zeros(3))
    with pytest.raises(ValueError, match="unknown GGUF kernel path"):
        gguf_linear(torch.zeros(1, 256), w, path="neon")


def test_environment_variable_forces_a_path(kernel_path):  # the fixture (tests/conftest.py) sets it
    assert gk.kernel_path() == kernel_path
    rng = np.random.default_rng(17)
    w, _ = weight_of(random_blocks(T.Q5_0, 17, 96, rng), T.Q5_0, 17, 96)
    x = torch.from_numpy(activations(5, 96, rng))
    assert torch.equal(gguf_linear(x, w), gguf_linear(x, w, path=kernel_path))


def test_forcing_a_path_the_cpu_lacks_falls_back_with_a_warning(paths, monkeypatch, caplog):
    monkeypatch.setattr(gk, "available_paths", lambda: ["scalar"])
    monkeypatch.setenv("SPECWISE_GGUF_KERNEL", "avx512")
    with caplog.at_level(logging.WARNING, logger="specwise"):
        assert gk.kernel_path() == "scalar"
    assert "cannot run the avx512" in caplog.text
    monkeypatch.setenv("SPECWISE_GGUF_KERNEL", "")
    assert gk.kernel_path() == "scalar"


@pytest.fixture(scope="module")
def readers():
    """One GGUFReader per known model's prepared file (parsing one takes seconds)."""
    opened: dict[str, object] = {}

    def reader(model: str):
        file = gguf_dir() / KNOWN_MODELS[model].gguf_name
        if not file.exists():
            pytest.skip(f"{file} is absent (specwise models prepare {model})")
        if model not in opened:
            opened[model] = gguf.GGUFReader(file)
        return opened[model]

    return reader


@pytest.mark.real_models
@pytest.mark.parametrize("model, name", [
    (DEFAULT_TARGET, "blk.0.attn_q.weight"),   # Q4_K
    (DEFAULT_TARGET, "blk.0.ffn_down.weight"),  # Q6_K
    (DEFAULT_DRAFTER, "blk.0.attn_q.weight"),  # Q5_0
    (DEFAULT_DRAFTER, "blk.0.attn_v.weight"),  # Q8_0
])
def test_real_gguf_tensors(paths, readers, model, name):
    tensor = next(t for t in readers(model).tensors if t.name == name)
    w = GGUFWeight.from_reader_tensor(tensor)
    raw = np.asarray(tensor.data)
    dense = gguf.quants.dequantize(raw, tensor.tensor_type).reshape(w.shape).astype(np.float64)
    x = np.random.default_rng(0).standard_normal((8, w.in_features)).astype(np.float32)
    reference = reference_for(x, raw.reshape(w.out_features, -1), T(tensor.tensor_type), w.out_features,
                              w.in_features, dense)
    for path in paths:
        reference.check(gguf_linear(torch.from_numpy(x), w, path=path))
    assert np.array_equal(dequantize_rows(w, torch.tensor([0, w.out_features - 1])).numpy(), dense[[0, -1]])
    mapped = GGUFWeight.from_reader_tensor(tensor, copy=False)
    assert torch.equal(gguf_linear(torch.from_numpy(x), mapped), gguf_linear(torch.from_numpy(x), w))


@pytest.mark.real_models
def test_real_token_embedding_rows(paths, readers):
    tensor = next(t for t in readers(DEFAULT_TARGET).tensors if t.name == "token_embd.weight")
    w = GGUFWeight.from_reader_tensor(tensor, copy=False)
    assert w.type_name == "Q4_K" and w.shape == (151936, 1536)
    ids = torch.tensor([0, 9707, 151935])
    expected = gguf.quants.dequantize(np.asarray(tensor.data)[ids.numpy()], tensor.tensor_type)
    assert np.array_equal(dequantize_rows(w, ids).numpy(), expected)


def test_a_build_killed_midway_does_not_block_later_loads(paths: list[str], tmp_path: Path) -> None:
    """PyTorch's build lock file, left behind by a build that was killed, is cleared by the next load
    (before, every later load waited for it forever). On a copy of the built kernel in a home of the
    test's own, so that the shared build is never touched."""
    import os
    import shutil
    import subprocess
    import sys

    built = Path(gk.gguf_kernel_module().__file__).parent
    home = tmp_path / "home"
    build_dir = home / "kernels" / built.name
    shutil.copytree(built, build_dir)  # modification times kept: the build is up to date, not redone
    (build_dir / "lock").touch()  # what a killed build leaves
    load = "from specwise.kernels.gguf import gguf_kernel_module; print(gguf_kernel_module().__file__)"
    done = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=300,
                          env=os.environ | {"SPECWISE_HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == build_dir  # the copy was loaded
    assert not (build_dir / "lock").exists()


def test_intel_builds_prefetch_far_ahead_and_each_flag_set_has_a_build_of_its_own(monkeypatch, tmp_path):
    """The far L2 prefetch (gguf_blocks.h) is compiled in on Intel CPUs only, where it was measured; and the
    build folder depends on the flags, so that a cache shared by an Intel and an AMD machine keeps both."""
    import torch.utils.cpp_extension

    from specwise.kernels import build, cpu

    flags_seen: list[list[str]] = []
    monkeypatch.setattr(gk, "build_kernel", lambda source, what, flags, extra_sources=(): flags_seen.append(flags))
    for vendor, far in (("GenuineIntel", True), ("AuthenticAMD", False), ("", False)):
        monkeypatch.setattr(cpu, "cpu_vendor", lambda vendor=vendor: vendor)
        gk._build()
        assert ("-DSPECWISE_FAR_PREFETCH" in flags_seen[-1]) == far, vendor
    folders: list[str] = []
    monkeypatch.setenv("SPECWISE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.utils.cpp_extension, "load", lambda **options: folders.append(options["build_directory"]))
    for flags in (["-O3"], ["-O3", "-DSPECWISE_FAR_PREFETCH"], ["-O3"]):
        build.build_kernel(gk._SOURCE, "GGUF kernel", flags, extra_sources=gk._EXTRA_SOURCES)
    assert folders[0] == folders[2] != folders[1]


# The decoder pass's attention (gguf_pass.cpp, attend_batch): query heads in batches that share their kv
# head's entries, read a chunk of 32 entries at a time for all of them.

ATTENTION_CASES = [  # (head_dim, entries each query sees, softcap)
    (128, [1, 7, 33, 64, 100], 0.0),
    (136, [40, 2, 97], 0.0),  # head_dim % 16 == 8: the 512-bit sums leave the last 8 lanes to 256-bit ones
    (64, [65, 31, 32, 3, 90, 90], 30.0),
    (80, [16, 17, 5, 48], 0.0),  # five registers of query: 16 keys at a time, the last block part full
    (256, [9, 40], 0.0),  # too wide to hold in registers beside 16 keys' sums: two keys a register
]


def _attention_case(d: int, counts: list[int], seed: int):
    g = torch.Generator().manual_seed(seed)
    slots = max(counts) + 20
    queries, keys, values = (torch.randn(n, d, generator=g) * 2 for n in (len(counts), slots, slots))
    # Ascending slots with gaps (a tree's or a sliding window's), each query its own.
    rows = [sorted(torch.randperm(slots, generator=g)[:c].tolist()) for c in counts]
    return queries, keys, values, rows


def _reference_attention(queries, keys, values, rows, scale: float, softcap: float) -> torch.Tensor:
    out = []
    for q, r in zip(queries.double(), rows):
        scores = keys.double()[r] @ q * scale
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        out.append(torch.softmax(scores, 0) @ values.double()[r])
    return torch.stack(out)


@pytest.mark.parametrize("d, counts, softcap", ATTENTION_CASES)
def test_the_pass_attention_is_softmax_attention_over_each_querys_entries(d, counts, softcap):
    kernel = gk.gguf_kernel_module()
    queries, keys, values, rows = _attention_case(d, counts, seed=d)
    scale = d ** -0.5
    got = kernel.attend(queries, keys, values, rows, scale, softcap, False)
    want = _reference_attention(queries, keys, values, rows, scale, softcap)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d, counts, softcap", ATTENTION_CASES)
def test_the_512_bit_attention_sums_have_the_bits_of_the_256_bit_ones(d, counts, softcap):
    """The AVX-512 paths' attention (two keys a register, 16 lanes of value sums) does each lane's
    operations in the AVX2 order: a pass gives the same bits on either, alone or batched."""
    kernel = gk.gguf_kernel_module()
    if "avx512" not in gk.available_paths():
        pytest.skip("this CPU has no AVX-512")
    queries, keys, values, rows = _attention_case(d, counts, seed=d + 1)
    narrow = kernel.attend(queries, keys, values, rows, d ** -0.5, softcap, False)
    wide = kernel.attend(queries, keys, values, rows, d ** -0.5, softcap, True)
    assert torch.equal(wide, narrow)
    for i in range(len(rows)):  # and each query alone gives its bits in the batch
        alone = kernel.attend(queries[i:i + 1], keys, values, rows[i:i + 1], d ** -0.5, softcap, True)
        assert torch.equal(alone[0], wide[i])


@pytest.mark.parametrize("activation", [0, 1])
def test_the_512_bit_activations_have_the_bits_of_the_256_bit_ones(activation):
    kernel = gk.gguf_kernel_module()
    if "avx512" not in gk.available_paths():
        pytest.skip("this CPU has no AVX-512")
    g = torch.Generator().manual_seed(activation)
    for n in (8, 16, 72, 8960):  # 8 and 72: the last 8 values by the 256-bit kernel
        gate, up = torch.randn(n, generator=g) * 6, torch.randn(n, generator=g)
        gate[:4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # the exponent's clamps, and zeros
        narrow = kernel.activate(gate, up, activation, False)
        assert torch.equal(kernel.activate(gate, up, activation, True), narrow)
        want = (torch.nn.functional.silu(gate.double()) if activation == 0 else
                torch.nn.functional.gelu(gate.double(), approximate="tanh")) * up.double()
        assert torch.allclose(narrow.double(), want, rtol=1e-5, atol=1e-6)
