"""`specwise bench project`: the pass model's fit, its check against the measured counts, and its errors."""

from __future__ import annotations

import json

import pytest

from specwise.bench import projection
from specwise.bench.projection import Bandwidth, Measured, PassModel
from specwise.cli import main

NS = (1, 2, 3, 4, 5, 8, 16)
GB = 1e9


def synthetic(model: PassModel, counts=(1, 2)) -> list[Measured]:
    return [Measured(c, {n: model.seconds(n, c) for n in NS}, model.bandwidth(c)) for c in counts]


def known(overhead=0.012, row=0.070, extra=0.009, bandwidths=((1, 18 * GB), (2, 30 * GB))) -> PassModel:
    return PassModel(overhead, row, extra, 0.98 * GB, Bandwidth(bandwidths, max(b for _, b in bandwidths)))


@pytest.mark.parametrize("row", [0.070, 0.045, 0.020])  # compute-bound at both counts; at one thread only; at neither
def test_fit_recovers_known_parameters(row):
    truth = known(row=row)
    fitted = projection.fit(synthetic(truth), truth.pass_bytes)
    assert fitted.overhead == pytest.approx(truth.overhead, rel=1e-9)
    assert fitted.extra_row_seconds == pytest.approx(truth.extra_row_seconds, rel=1e-9)
    floor_1 = truth.pass_bytes / (18 * GB)
    if row > floor_1:  # hidden under the memory time at every count, A is not told by T(1)
        assert fitted.row_seconds == pytest.approx(row, rel=1e-9)
    for cores in (1, 2, 4, 8, 16):
        for n in NS:
            assert fitted.seconds(n, cores) == pytest.approx(truth.seconds(n, cores), rel=1e-9)


def test_fit_recovers_parameters_from_three_counts():
    truth = known(bandwidths=((1, 18 * GB), (2, 30 * GB), (4, 40 * GB)))
    fitted = projection.fit(synthetic(truth, (1, 2, 4)), truth.pass_bytes)
    assert (fitted.overhead, fitted.row_seconds, fitted.extra_row_seconds) == pytest.approx(
        (truth.overhead, truth.row_seconds, truth.extra_row_seconds), rel=1e-9)


def test_fit_keeps_the_fixed_cost_nonnegative():
    """T(1) halving exactly with the second core leaves no fixed cost; slightly more than halving
    (noise) must not give a negative one."""
    tables = [Measured(1, {1: 0.100, 2: 0.110}, 10 * GB), Measured(2, {1: 0.049, 2: 0.054}, 20 * GB)]
    fitted = projection.fit(tables, 0.5 * GB)
    assert fitted.overhead >= 0
    assert fitted.seconds(1, 2) == pytest.approx(0.049, rel=0.03)


# A table shaped like the gguf target's on a 2-core AVX-512 machine, its numbers made up with noise in them
# (not values of the model: the fit must cope with T(n) that is not quite linear), and T(16) off the line
# as where the kernel changes route past 8 rows: the fit keeps to n <= 8.
MEASURED_LIKE = [
    Measured(1, {1: 0.0846, 2: 0.0969, 3: 0.1052, 4: 0.1160, 5: 0.1231, 8: 0.1522, 16: 0.2927}, 17.5 * GB),
    Measured(2, {1: 0.0502, 2: 0.0561, 3: 0.0604, 4: 0.0652, 5: 0.0681, 8: 0.0846, 16: 0.1592}, 30.3 * GB),
]


def test_projection_reproduces_the_measured_counts():
    model, rows = projection.project(MEASURED_LIKE, 0.98 * GB, cores=(4, 8, 16))
    for cores, gap in projection.fit_gaps(model, MEASURED_LIKE).items():
        assert gap <= projection.FIT_TOLERANCE, (cores, gap)
    measured = {r.cores: r for r in rows if r.source == "measured"}
    projected = {r.cores: r for r in rows if r.source == "projected"}
    assert sorted(measured) == [1, 2] and sorted(projected) == [1, 2, 4, 8, 16]
    for cores in (1, 2):  # T(1) exactly (two equations, two unknowns), the speedups within the tolerance
        assert projected[cores].t1 == pytest.approx(measured[cores].t1, rel=1e-9)
        for (alpha, _, want), (_, _, got) in zip(measured[cores].speedups, projected[cores].speedups):
            assert got == pytest.approx(want, rel=projection.FIT_TOLERANCE), (cores, alpha)
    # more cores: T(1) never below the memory floor, and the rows cheaper relative to a pass
    for cores in (4, 8, 16):
        assert projected[cores].t1 >= projected[cores].floor
        assert projected[cores].t5_ratio < projected[2].t5_ratio
        assert projected[cores].speedups[0][2] >= projected[2].speedups[0][2]


def test_speedup_is_the_cost_models():
    cost = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.4}
    k, speedup = projection.free_drafter_speedup(lambda n: cost.get(n, 0.1 * n + 1.0), 0.6, k_max=4)
    rates = {k: (1 - 0.6 ** (k + 1)) / 0.4 / cost[k + 1] for k in range(5)}
    assert k == max(rates, key=rates.get) and speedup == pytest.approx(rates[k] * cost[1])
    assert projection.free_drafter_speedup(lambda n: float(n), 0.35) == (0, 1.0)  # rows as dear as passes


def test_fit_keeps_to_the_rows_it_is_given():
    model, rows = projection.project(MEASURED_LIKE, 0.98 * GB, max_rows=8)
    assert all(k <= 7 for r in rows for _, k, _ in r.speedups)
    assert max(projection.fit_gaps(model, MEASURED_LIKE, max_rows=16).values()) > projection.FIT_TOLERANCE
    wide = projection.fit(MEASURED_LIKE, 0.98 * GB, max_rows=16)  # the jump at 16 pulls the line up
    assert wide.extra_row_seconds > 1.3 * model.extra_row_seconds
    with pytest.raises(ValueError, match="within the fitted rows"):
        projection.project(MEASURED_LIKE, 0.98 * GB, max_rows=8, k_max=8)


def test_bandwidth_through_points_then_capped():
    bandwidth = Bandwidth(((1, 18 * GB), (2, 30 * GB)), 60 * GB)
    assert bandwidth(1) == 18 * GB and bandwidth(2) == 30 * GB
    assert bandwidth(4) == pytest.approx(54 * GB)  # +12 GB/s a core, as the second core added
    assert bandwidth(16) == 60 * GB
    assert Bandwidth(((1, 18 * GB), (2, 30 * GB)), 30 * GB)(16) == 30 * GB  # the default: no more than measured
    with pytest.raises(ValueError, match="below the measured"):
        Bandwidth(((1, 18 * GB), (2, 30 * GB)), 20 * GB)


def test_one_thread_count_names_the_fix():
    with pytest.raises(ValueError, match=r"two thread counts.*--threads 1,2"):
        projection.fit(MEASURED_LIKE[1:], 0.98 * GB)


def result(threads: int, seconds: dict[int, float], bandwidth: float, **extra) -> dict:
    machine = {"cpu": "test", "cores": 2, "read_bandwidth_gb_s": bandwidth, "read_bandwidth_threads": threads}
    return {"model": "target", "runner": "lean", "dtype": "gguf", "threads": threads, "repeats": 1,
            "ns": sorted(seconds), "seconds": {"128": {str(n): s for n, s in seconds.items()}},
            "skipped_contexts": [], "pass_bytes": int(0.98 * GB), "machine": machine, **extra}


def write_cost(path, results: list[dict]):
    path.mkdir(parents=True, exist_ok=True)
    (path / "cost.json").write_text(json.dumps({"results": results}), encoding="utf-8")
    return path


def test_select_reads_the_bench_cost_output(tmp_path):
    drafter = {**result(1, {1: 0.03, 2: 0.035}, 17.5), "model": "drafter"}
    out = write_cost(tmp_path / "cost", [result(t.threads, t.seconds, t.bandwidth / GB) for t in MEASURED_LIKE]
                     + [drafter, {**result(2, {1: 0.05}, 30.3), "runner": "llama.cpp"}])
    tables, pass_bytes, model, context = projection.select(projection.read_results([out]))
    assert (model, context, pass_bytes) == ("target", 128, int(0.98 * GB))
    assert tables == MEASURED_LIKE


def test_select_errors_name_the_fix(tmp_path):
    one = projection.read_results([write_cost(tmp_path / "one", [result(2, {1: 0.05, 2: 0.056}, 30.3)])])
    tables, pass_bytes, _, _ = projection.select(one)
    with pytest.raises(ValueError, match="--threads 1,2"):
        projection.fit(tables, pass_bytes)
    older = [result(1, {1: 0.08}, 30.3), result(2, {1: 0.05}, 30.3)]
    for record in older:  # one figure, measured once after every count
        del record["machine"]["read_bandwidth_threads"]
    with pytest.raises(ValueError, match="no read bandwidth measured at 1 threads.*--threads 1,2"):
        projection.select(older)
    with pytest.raises(ValueError, match="pass_bytes.*--threads 1,2"):
        projection.select([{k: v for k, v in result(t, {1: 0.05}, 30.3).items() if k != "pass_bytes"}
                           for t in (1, 2)])
    with pytest.raises(ValueError, match="holds no cost.json"):
        projection.read_results([tmp_path])


def test_bench_project_cli(tmp_path, capsys):
    out = write_cost(tmp_path / "cost", [result(t.threads, t.seconds, t.bandwidth / GB) for t in MEASURED_LIKE])
    assert main(["bench", "project", str(out), "--cores", "4,8", "--bandwidth", "60", "--out", str(tmp_path / "p")]) == 0
    text = capsys.readouterr().out
    assert text.startswith("A projection, not a measurement") and "| 8 | projected |" in text
    assert (tmp_path / "p" / "projection.md").read_text() == text
    saved = json.loads((tmp_path / "p" / "projection.json").read_text())
    assert saved["fit"]["bandwidth_saturation_b_s"] == 60 * GB
    assert [(r["cores"], r["source"]) for r in saved["rows"]][-1] == (8, "projected")
    assert main(["bench", "project", str(write_cost(tmp_path / "one", [result(2, {1: 0.05, 2: 0.056}, 30.3)]))]) != 0
    assert "--threads 1,2" in capsys.readouterr().err


def test_pass_bytes_counts_what_a_pass_reads(tmp_path):
    from gguf_files import write_model_gguf

    from specwise.gguf.file import pass_bytes, read_header

    for tied in (True, False):
        path = write_model_gguf(tmp_path / f"m{tied}.gguf", tied=tied)
        header = read_header(path)
        total = path.stat().st_size - header.data_offset
        embedding = next(t for t in header.tensors if t.name == "token_embd.weight")
        after = min((t.data_offset for t in header.tensors if t.data_offset > embedding.data_offset),
                    default=path.stat().st_size)
        assert pass_bytes(path) == (total if tied else total - (after - embedding.data_offset))


def test_bench_cost_records_the_bytes_a_pass_reads(tmp_path):
    import dataclasses

    from specwise.bench.cost import RunnerPasses
    from specwise.gguf.file import pass_bytes
    from specwise.testing import tiny_gguf_loaded, write_tiny_gguf_model

    path, _ = write_tiny_gguf_model(tmp_path / "file")
    loaded = dataclasses.replace(tiny_gguf_loaded(tmp_path / "model"), path=path)  # as load_model gives it
    assert RunnerPasses(loaded, "lean").describe()["pass_bytes"] == pass_bytes(path) > 0
    assert "pass_bytes" not in RunnerPasses(tiny_gguf_loaded(tmp_path / "dir"), "lean").describe()  # no file
