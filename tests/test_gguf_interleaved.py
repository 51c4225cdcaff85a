"""Weights interleaved at load in 16-row groups (specwise/kernels/gguf_interleaved.h).

- the layout is what its header says: a plain NumPy statement of it gives the kernel's bytes, and the
  stored blocks come back exactly (`GGUFWeight.raw`);
- the interleaved tiles compute y = x @ W.T within the kernel's rounding bound (tests/test_gguf_kernel.py's
  reference) for 1-40 rows, on every path; where a path has tiles of the layout (AVX-512: every type;
  AVX2: all but Q5_K) bitwise the scalar path's (exact integer sums, the same float steps), elsewhere the
  groups are read back into stored blocks: bitwise the stored layout's results on that path;
- on every tile path (amx: the layout's AMX tiles from 7 rows (Q6_K), 8 (Q8_0) or 9 (Q4_K, IQ4_XS), the stored layout's
  from 16 or 20, reading the groups), a row's result is bitwise the same alone or among any number of
  rows, at any place in its call, over any thread split of the output rows (groups cut in the middle
  included);
- negative control on every tile path: a layout with one offset wrong (one row's dword of one chunk taken
  from its neighbour) fails the reference check;
- a model's layers interleave at load, fuse and score as before: a tiny GGUF model of K-quants gives
  bitwise the stored layout's logits, and a mixed one's rows are the same in one block or one at a time.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

from test_gguf_kernel import activations, random_blocks, reference_for, weight_of  # noqa: E402
from specwise.kernels import gguf as gk  # noqa: E402
from specwise.kernels.gguf import GGUFWeight, dequantize_rows, gguf_linear, interleave  # noqa: E402
from specwise.runners.gguf_layers import GGUFLinear  # noqa: E402

Q4K = int(T.Q4_K)
INTERLEAVED = [T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.Q8_0, T.Q4_0, T.Q5_0]
TYPES = pytest.mark.parametrize("qtype", INTERLEAVED, ids=lambda t: t.name)


# The layout per type, as docs and gguf_interleaved.h state it: the stored block's fields in layout order,
# each (offset in a stored block, bytes, unit): unit r of run u of a field is row r's unit u.
LAYOUT = {
    T.Q4_K: [(16, 128, 4), (0, 2, 2), (2, 2, 2), (4, 12, 4)],
    T.Q5_K: [(48, 128, 4), (16, 32, 4), (0, 2, 2), (2, 2, 2), (4, 12, 4)],
    T.Q6_K: [(0, 128, 4), (128, 64, 4), (192, 16, 1), (208, 2, 2)],
    T.IQ4_XS: [(8, 128, 4), (0, 2, 2), (2, 2, 2), (4, 4, 4)],
    T.Q8_0: [(2, 32, 4), (0, 2, 2)],
    T.Q4_0: [(2, 16, 4), (0, 2, 2)],
    T.Q5_0: [(6, 16, 4), (2, 4, 4), (0, 2, 2)],
}


def interleaved_numpy(raw: np.ndarray, qtype: T, rows: int, nb: int, wrong: bool = False) -> np.ndarray:
    """The layout, stated plainly with NumPy, per group of 16 rows and block b. `wrong`: dword 3 of the
    first field's run 5 (or last run) taken from row 4 (a layout bug)."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = raw.reshape(rows, nb, size)
    out = np.empty_like(blocks.reshape(rows // 16, 16 * nb * size))
    for g in range(rows // 16):
        parts = []
        for b in range(nb):
            blk = blocks[16 * g:16 * g + 16, b]  # [16, size]
            for i, (offset, length, unit) in enumerate(LAYOUT[qtype]):
                runs = blk[:, offset:offset + length].reshape(16, -1, unit).transpose(1, 0, 2).copy()
                if wrong and i == 0:
                    runs[min(5, len(runs) - 1), 3] = runs[min(5, len(runs) - 1), 4]
                parts.append(runs.ravel())
        out[g] = np.concatenate(parts)
    return out.reshape(rows, -1)


def interleaved_weight(raw: np.ndarray, rows: int, columns: int, qtype: T = T.Q4_K) -> GGUFWeight:
    return interleave(GGUFWeight(torch.from_numpy(raw.copy()), int(qtype), (rows, columns)))


@TYPES
def test_the_layout_is_the_documented_one_and_comes_back_exactly(qtype):
    rng = np.random.default_rng(1)
    rows, columns = 48, 768
    raw = random_blocks(qtype, rows, columns, rng)
    w = interleaved_weight(raw, rows, columns, qtype)
    assert w.interleaved and w.data.shape == raw.shape
    assert np.array_equal(w.data.numpy(), interleaved_numpy(raw, qtype, rows, columns // gguf.GGML_QUANT_SIZES[qtype][0]))
    assert np.array_equal(w.raw().data.numpy(), raw)
    assert not np.array_equal(interleaved_numpy(raw, qtype, rows, columns // gguf.GGML_QUANT_SIZES[qtype][0], wrong=True), w.data.numpy())


@TYPES
@pytest.mark.parametrize("path", gk.PATHS)
def test_interleaved_tiles_match_the_reference_for_1_to_40_rows(paths, path, qtype):
    if path not in paths:
        pytest.skip(f"this CPU cannot run the {path} path")
    rng = np.random.default_rng(2)
    for rows, columns in ((16, 256), (48, 512), (64, 1024)):
        raw = random_blocks(qtype, rows, columns, rng)
        stored, dense = weight_of(raw, qtype, rows, columns)
        w = interleaved_weight(raw, rows, columns, qtype)
        x = activations(40, columns, rng)
        reference = reference_for(x, raw, qtype, rows, columns, dense)
        for n in range(1, 41):
            y = gguf_linear(torch.from_numpy(x[:n]), w, path=path)
            reference.check(y)
            if gk.interleaved_tiles(int(qtype), path):  # the exact integer sums and the scalar path's float steps
                assert torch.equal(y, gguf_linear(torch.from_numpy(x[:n]), stored, path="scalar"))
            else:  # groups read back into stored blocks: the same tiles
                assert torch.equal(y, gguf_linear(torch.from_numpy(x[:n]), stored, path=path))


def needs_tiles(paths, path: str, qtype: T) -> None:
    if path not in paths:
        pytest.skip(f"this CPU cannot run the {path} path")
    if not gk.interleaved_tiles(int(qtype), path):
        pytest.skip(f"{qtype.name} has no {path} tiles of the interleaved layout")


TILE_PATHS = pytest.mark.parametrize("path", ["amx", "avx512", "avx2"])


@TYPES
@TILE_PATHS
def test_a_layout_bug_fails_the_reference(paths, path, qtype):
    needs_tiles(paths, path, qtype)
    rng = np.random.default_rng(3)
    rows, columns = 32, 512
    raw = random_blocks(qtype, rows, columns, rng)
    _, dense = weight_of(raw, qtype, rows, columns)
    bad = GGUFWeight(torch.from_numpy(interleaved_numpy(raw, qtype, rows, columns // gguf.GGML_QUANT_SIZES[qtype][0], wrong=True)), int(qtype),
                     (rows, columns), interleaved=True)
    x = activations(24, columns, rng)
    reference = reference_for(x, raw, qtype, rows, columns, dense)
    for n in (5, 24):  # the AVX-512 or AVX2 tiles; on amx the AMX tiles too
        reference.check(gguf_linear(torch.from_numpy(x[:n]), interleaved_weight(raw, rows, columns, qtype), path=path))
        with pytest.raises(AssertionError):
            reference.check(gguf_linear(torch.from_numpy(x[:n]), bad, path=path))


@TYPES
@TILE_PATHS
def test_a_row_never_depends_on_the_rows_beside_it_or_the_thread_split(paths, path, qtype):
    needs_tiles(paths, path, qtype)
    rng = np.random.default_rng(4)
    rows, columns = 80, 512
    w = interleaved_weight(random_blocks(qtype, rows, columns, rng), rows, columns, qtype)
    x = torch.from_numpy(activations(130, columns, rng))
    alone = torch.cat([gguf_linear(x[i:i + 1], w, path=path) for i in range(len(x))])
    for n in [*range(1, 18), 31, 63, 64, 65, 130]:  # tiles of 8, remainders, the 64-row chunk
        for start in (0, 3):
            together = gguf_linear(x[start:start + n], w, path=path)
            assert torch.equal(together, alone[start:start + n]), f"{n} rows from {start} differ"
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3):  # 80 rows over 3 threads: groups cut in the middle
            torch.set_num_threads(t)
            assert torch.equal(gguf_linear(x[:9], w, path=path), alone[:9]), f"{t} threads differ"
    finally:
        torch.set_num_threads(threads)


def test_embedding_rows_selection_and_concatenation_read_the_stored_values():
    rng = np.random.default_rng(5)
    rows, columns = 32, 256
    raw = random_blocks(T.Q4_K, rows, columns, rng)
    stored = GGUFWeight(torch.from_numpy(raw.copy()), Q4K, (rows, columns))
    w = interleaved_weight(raw, rows, columns)
    ids = torch.tensor([0, 5, 17, 31, 16])
    assert torch.equal(dequantize_rows(w, ids), dequantize_rows(stored, ids))
    picked = GGUFLinear(w).select_rows(ids)
    assert not picked.gguf_weight.interleaved
    assert np.array_equal(picked.gguf_weight.data.numpy(), raw[ids.numpy()])
    a, b = GGUFLinear(interleaved_weight(raw[:16], 16, columns)), GGUFLinear(interleaved_weight(raw[16:], 16, columns))
    both = GGUFLinear.concatenate([a, b])
    assert both.gguf_weight.interleaved and np.array_equal(both.gguf_weight.raw().data.numpy(), raw)
    with pytest.raises(ValueError, match="layout"):
        GGUFLinear.concatenate([a, GGUFLinear(GGUFWeight(torch.from_numpy(raw[16:].copy()), Q4K, (16, columns)))])


def test_only_the_types_with_tiles_in_whole_groups_interleave(monkeypatch):
    rng = np.random.default_rng(6)
    with pytest.raises(ValueError, match="interleaved"):
        GGUFWeight(torch.from_numpy(random_blocks(T.Q4_K, 20, 256, rng)), Q4K, (20, 256), interleaved=True)
    with pytest.raises(ValueError, match="interleaved"):
        GGUFWeight(torch.from_numpy(random_blocks(T.Q3_K, 16, 256, rng)), int(T.Q3_K), (16, 256), interleaved=True)
    monkeypatch.delenv("SPECWISE_INTERLEAVE", raising=False)  # by default not Q5_K, Q6_K
    assert gk.interleaves(Q4K, 32, "avx512") and gk.interleaves(int(T.Q8_0), 32, "avx512")
    assert not gk.interleaves(int(T.Q6_K), 32, "avx512") and not gk.interleaves(int(T.Q5_K), 32, "avx512")
    monkeypatch.setenv("SPECWISE_INTERLEAVE", "0")
    assert not gk.interleaves(Q4K, 32, "avx512")
    monkeypatch.setenv("SPECWISE_INTERLEAVE", "q6_k, IQ4_XS")
    assert gk.interleaved_types("avx512") == {int(T.Q6_K), int(T.IQ4_XS)} and not gk.interleaves(Q4K, 32, "avx512")
    assert gk.interleaved_types("avx2") == {int(T.IQ4_XS)}  # no AVX2 tiles of Q6_K's layout
    monkeypatch.setenv("SPECWISE_INTERLEAVE", "Q4_K,Q3_K")
    with pytest.raises(ValueError, match=r"Q3_K has no interleaved layout.*IQ4_XS"):
        gk.interleaves(Q4K, 32, "avx512")
    monkeypatch.setenv("SPECWISE_INTERLEAVE", "1")
    assert gk.interleaves(Q4K, 32, "avx512") and gk.interleaves(int(T.Q6_K), 32, "avx512")
    assert not gk.interleaves(Q4K, 20, "avx512") and gk.interleaves(int(T.Q6_K), 32, "amx")
    assert gk.interleaves(int(T.Q5_K), 32, "avx512") and gk.interleaves(Q4K, 32, "avx2")
    assert not gk.interleaves(int(T.Q6_K), 32, "avx2") and not gk.interleaves(Q4K, 32, "scalar")
    assert not gk.interleaves(int(T.Q3_K), 32, "avx512") and not gk.interleaves(int(T.IQ4_NL), 32, "avx512")
    assert set(gk.INTERLEAVABLE) == {int(t) for t in INTERLEAVED}
    monkeypatch.delenv("SPECWISE_INTERLEAVE")
    assert gk.interleaved_type_names("avx2") == ["IQ4_XS", "Q4_0", "Q8_0"] and gk.interleaved_type_names("amx") == ["IQ4_XS", "Q4_0", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]


@TYPES
def test_the_python_side_names_the_kernels_tiles(paths, qtype):
    for path in paths:
        assert gk.interleaved_tiles(int(qtype), path) == (int(qtype) in gk.INTERLEAVED_TILES.get(path, ())), path


@TILE_PATHS
def test_a_model_interleaves_at_load_and_scores_as_stored(paths, path, tmp_path, monkeypatch):
    """On AVX-512, K-quant layers give bitwise the stored layout's logits (their stored tiles are the scalar
    path's too). On both tile paths, the tiny model's own mix (Q5_0 and Q8_0 layers besides): every layer
    interleaved where the path has tiles of the layout, and its rows the same in one block or one at a time
    through the native pass."""
    if path not in paths:
        pytest.skip(f"this CPU cannot run the {path} path")
    from specwise.gguf.model import load_gguf_model
    from specwise.runners.lean import LeanRunner
    from specwise.testing import write_tiny_gguf_model

    monkeypatch.setenv("SPECWISE_GGUF_KERNEL", path)
    ids = list(range(3, 40))
    if path in ("amx", "avx512"):
        k_quants = {"attn_k": "Q4_K", "attn_output": "Q6_K", "ffn_up": "Q5_K"}
        file, model_dir = write_tiny_gguf_model(tmp_path / "k", seed=3, types=k_quants)
        logits = {}
        for setting in ("1", "0"):
            monkeypatch.setenv("SPECWISE_INTERLEAVE", setting)
            model = load_gguf_model(file, model_dir)
            layers = [m.gguf_weight.interleaved for m in model.modules() if isinstance(m, GGUFLinear)]
            assert any(layers) == (setting == "1")
            logits[setting] = LeanRunner(model).forward(ids)
        assert torch.equal(logits["1"], logits["0"])

    monkeypatch.setenv("SPECWISE_INTERLEAVE", "1")
    file, model_dir = write_tiny_gguf_model(tmp_path / "mix", seed=4)
    model = load_gguf_model(file, model_dir)
    layers = {name: m.gguf_weight for name, m in model.named_modules() if isinstance(m, GGUFLinear)}
    assert layers["lm_head"].out_features % 16 and not layers["lm_head"].interleaved  # rows not a multiple of 16
    tiles = gk.INTERLEAVED_TILES[path]
    assert all(w.interleaved == (w.ggml_type in tiles) for name, w in layers.items() if name != "lm_head")
    assert any(w.interleaved for w in layers.values())
    assert {"Q4_K", "Q5_0", "Q6_K", "Q8_0"} <= {w.type_name for w in layers.values()}
    runner = LeanRunner(model)
    block = runner.forward(ids)
    runner.reset()
    runner.forward(ids[:30])
    one_by_one = torch.cat([runner.forward(ids[i:i + 1]) for i in range(30, len(ids))])
    assert torch.equal(block[30:], one_by_one)
