"""lipcert.certify / search / report / sweep on small layers: sound bounds, the Certificate
object, bad arguments, two threads, and Ctrl-C."""

import json
import math
import signal
import threading

import numpy as np
import pytest

import lipcert
from conftest import random_layer_args, reference_forward, scale


def jacobian_norm(p, x, h=1e-6):
    """||J(x)||_2 of the numpy reference by central differences (row-major flattening)."""
    n, d = x.shape
    cols = []
    for c in range(n * d):
        e = np.zeros(n * d)
        e[c] = h
        e = e.reshape(n, d)
        cols.append(((reference_forward(p, x + e) - reference_forward(p, x - e)) / (2 * h)).ravel())
    return np.linalg.norm(np.array(cols).T, 2)


@pytest.mark.parametrize("sublayer", [None, "pre", "post"])
def test_certified_bound_dominates_the_jacobian_norm(rng, sublayer):
    checked = 0
    for trial in range(2 * scale()):
        p = random_layer_args(rng, kind="dot" if trial % 2 == 0 else "l2", d=4, heads=2, dk=2, sublayer=sublayer)
        layer = lipcert.Layer.from_arrays(**p)
        x0 = rng.standard_normal((3, 4))
        c = lipcert.certify(layer, x0, radius=0.05, time_limit=2, threads=1, progress=False)
        assert math.isfinite(c.upper_bound) and c.upper_bound >= c.lower_bound > 0
        # Every point of the ball has ||J|| <= upper; the centre is one.
        assert c.upper_bound >= jacobian_norm(p, x0) * (1 - 1e-6)
        # The witness lies in the ball and its value is at least the lower bound.
        w = c.witness
        assert w.x.shape == (3, 4) and w.v.shape == (3, 4)
        assert np.linalg.norm(w.x - x0) <= 0.05 * (1 + 1e-9)
        assert w.value >= c.lower_bound * (1 - 1e-12)
        checked += 1
    assert checked == 2 * scale()


def test_certificate_object(rng, tmp_path):
    p = random_layer_args(rng, kind="dot", d=4, heads=2, dk=2, sublayer="pre", dtype=np.float32)
    layer = lipcert.Layer.from_arrays(**p, source="toy")
    x0 = rng.standard_normal((3, 4)).astype(np.float32)
    c = lipcert.certify(layer, x0, relative_radius=0.01, time_limit=3, threads=1, progress=False, centre_name="toy-x0")
    doc = json.loads(c.to_json())
    assert doc["schema"] == "lipcert.certificate/1"
    assert doc["upper_bound"] == c.upper_bound and doc["lower_bound"] == c.lower_bound
    assert doc["model"]["path"] == "toy" and doc["model"]["sha256"] == layer.sha256
    assert doc["set"]["centre"] == "toy-x0" and doc["set"]["tokens"] == 3
    assert doc["set"]["radius"] == pytest.approx(0.01 * np.linalg.norm(x0.astype(np.float64)))
    assert c.status in ("tolerance_reached", "time_limit", "engines_exhausted")
    assert c.gap == pytest.approx(c.upper_bound / c.lower_bound)
    # The conversions are recorded in the certificate's notes.
    assert any("x0: float32 -> float64" in n for n in c.notes)
    assert any("wq: float32 -> float64" in n for n in c.notes)
    names = [e["name"] for e in c.engines]
    assert c.winner in names and len(names) >= 3
    assert min(e["upper_bound"] for e in c.engines) == pytest.approx(c.upper_bound)
    assert c.terms and all(v >= 0 for _, v in c.terms)
    assert c.probabilistic is not None and c.probabilistic["certified"] is False
    assert c.provenance["model"]["sha256"] == layer.sha256
    line = str(c)
    assert "\n" not in line and f"{c.upper_bound:.6g}" in line and f"{c.lower_bound:.6g}" in line
    assert "certified upper" in c.summary()
    html = c._repr_html_()
    assert "<table>" in html and f"{c.upper_bound:.6g}" in html
    saved = c.save(tmp_path / "cert.json")
    assert open(saved).read() == c.to_json(2) + "\n"


def test_x0_from_a_file_as_the_cli_reads_it(zoo, zoo_layer, tmp_path):
    spec = f"{zoo}/dot-layer0-centres.safetensors:x1"
    x0 = lipcert.load_centre(spec, zoo_layer)
    assert x0.shape == (32, 64)
    npy = str(tmp_path / "x1.npy")
    lipcert._core.write_npy(npy, x0[:8])
    c = lipcert.certify(zoo_layer, npy, radius=0, time_limit=20, tolerance=0.5, progress=False, probabilistic=False)
    assert c.set["centre"] == npy and c.set["tokens"] == 8
    assert c.upper_bound >= c.lower_bound > 0


def test_bad_arguments_name_the_argument(rng):
    layer = lipcert.Layer.from_arrays(**random_layer_args(rng, d=4, heads=1, dk=2))
    x0 = rng.standard_normal((3, 4))
    kw = dict(time_limit=1, progress=False)
    cases = [
        (ValueError, "x0", dict(x0=np.zeros((3, 5)), radius=0.1)),
        (ValueError, "x0", dict(x0=np.zeros(4), radius=0.1)),
        (ValueError, "x0", dict(x0=np.zeros((2, 3, 4)), radius=0.1)),
        (ValueError, "x0: holds NaN", dict(x0=np.where(np.eye(3, 4) > 0, np.nan, x0), radius=0.1)),
        (ValueError, "x0: holds NaN", dict(x0=np.where(np.eye(3, 4) > 0, np.inf, x0), radius=0.1)),
        (TypeError, "x0", dict(x0=np.zeros((3, 4), dtype=np.int32), radius=0.1)),
        (TypeError, "x0", dict(x0=None, radius=0.1)),
        (ValueError, "radius", dict(x0=x0)),
        (ValueError, "radius", dict(x0=x0, radius=0.1, relative_radius=0.1)),
        (ValueError, "radius", dict(x0=x0, radius=-0.1)),
        (ValueError, "relative_radius", dict(x0=x0, relative_radius=-1)),
        (ValueError, "radius", dict(x0=x0, radius=math.inf)),
        (TypeError, "radius", dict(x0=x0, radius="0.1")),
        (ValueError, "set", dict(x0=x0, radius=0.1, set="sphere")),
        (TypeError, "set", dict(x0=x0, radius=0.1, set=2)),
        (ValueError, "norm", dict(x0=x0, radius=0.1, norm=1)),
        (ValueError, "norm", dict(x0=x0, radius=0.1, norm="fro")),
        (ValueError, "time_limit", dict(x0=x0, radius=0.1, time_limit=0)),
        (ValueError, "threads", dict(x0=x0, radius=0.1, threads=-1)),
        (TypeError, "seed", dict(x0=x0, radius=0.1, seed=1.5)),
    ]
    for error, field, args in cases:
        with pytest.raises(error, match=field):
            lipcert.certify(layer, **{**kw, **args})
    with pytest.raises(TypeError, match="layer"):
        lipcert.certify("layer.safetensors", x0, radius=0.1, progress=False)
    with pytest.raises(ValueError, match="x0"):
        lipcert.search(layer, np.zeros((3, 5)), radius=0.1, progress=False)


def test_norms_and_sets(rng):
    layer = lipcert.Layer.from_arrays(**random_layer_args(rng, d=4, heads=1, dk=2))
    x0 = rng.standard_normal((3, 4))
    for norm in (2, "2", "inf", math.inf):
        for s in ("ball", "tokens", "box"):
            c = lipcert.certify(layer, x0, set=s, radius=0.02, norm=norm, time_limit=1, threads=1, progress=False,
                                probabilistic=False)
            assert c.set["kind"] == s and c.norm == ("inf" if norm in ("inf", math.inf) else "2")
            assert c.upper_bound >= c.lower_bound > 0


def test_search_alone(rng):
    p = random_layer_args(rng, d=4, heads=2, dk=2)
    layer = lipcert.Layer.from_arrays(**p)
    x0 = rng.standard_normal((3, 4))
    r = lipcert.search(layer, x0, radius=0.05, time_limit=1, threads=1, progress=False)
    c = lipcert.certify(layer, x0, radius=0.05, time_limit=3, threads=1, progress=False)
    assert 0 < r.lower_bound <= c.upper_bound
    assert np.linalg.norm(r.witness.x - x0) <= 0.05 * (1 + 1e-9)
    assert r.points_evaluated > 0 and "witnessed lower bound" in str(r)


def test_two_threads_give_the_same_results_as_one_after_the_other(zoo, zoo_layer):
    # Deterministic settings: radius 0 with a loose tolerance ends at the first stage that
    # meets it, before any time check matters.
    x0 = lipcert.load_centre(f"{zoo}/dot-layer0-centres.safetensors:x2", zoo_layer)[:8]
    x1 = lipcert.load_centre(f"{zoo}/dot-layer0-centres.safetensors:x3", zoo_layer)[:8]
    kw = dict(radius=0, time_limit=120, tolerance=0.5, threads=1, progress=False, probabilistic=False)
    serial = [lipcert.certify(zoo_layer, x, **kw) for x in (x0, x1)]
    results = [None, None]

    def work(i, x):
        results[i] = lipcert.certify(zoo_layer, x, **kw)

    threads = [threading.Thread(target=work, args=(i, x)) for i, x in enumerate((x0, x1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(serial, results):
        assert b is not None
        assert (a.upper_bound, a.lower_bound) == (b.upper_bound, b.lower_bound)
        np.testing.assert_array_equal(a.witness.x, b.witness.x)
    assert serial[0].upper_bound != serial[1].upper_bound  # two different jobs were compared


def test_budgeted_runs_repeat_bit_for_bit_on_any_thread_count(rng):
    p = random_layer_args(rng, kind="dot", d=6, heads=2, dk=3, sublayer="pre")
    layer = lipcert.Layer.from_arrays(**p)
    x0 = rng.standard_normal((4, 6))
    runs = [lipcert.certify(layer, x0, relative_radius=0.05, budget=(30, 1), threads=t, progress=False)
            for t in (1, 2, 1)]
    for c in runs:
        assert c.status in ("work_budget", "tolerance_reached", "engines_exhausted")
        assert (c.upper_bound, c.lower_bound) == (runs[0].upper_bound, runs[0].lower_bound)
        assert c.probabilistic == runs[0].probabilistic  # its seed is fixed under a budget too
    assert runs[0].upper_bound >= runs[0].lower_bound > 0
    with pytest.raises(ValueError, match="budget"):
        lipcert.certify(layer, x0, radius=0.1, budget=0, progress=False)
    with pytest.raises(ValueError, match="budget"):
        lipcert.certify(layer, x0, radius=0.1, budget=(1, 2, 3), progress=False)


@pytest.fixture
def ctrl_c():
    """Python's own SIGINT handler for the test: a shell that starts a job in the background
    without job control starts it with SIGINT ignored, and Python then installs no handler,
    so a raised SIGINT would never reach lipcert."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_returns_a_sound_certificate(zoo, zoo_layer, ctrl_c):
    x0 = lipcert.load_centre(f"{zoo}/dot-layer0-centres.safetensors:x0", zoo_layer)
    timer = threading.Timer(4.0, signal.raise_signal, args=(signal.SIGINT,))
    timer.start()
    try:
        c = lipcert.certify(zoo_layer, x0, relative_radius=0.01, time_limit=60, threads=1, tolerance=0,
                            progress=False)
    finally:
        timer.cancel()
    assert c.interrupted and c.status == "interrupted"
    assert c.elapsed_s < 30
    # Sound whenever it is stopped: a finite certified upper bound above the witnessed lower.
    assert math.isfinite(c.upper_bound) and c.upper_bound >= c.lower_bound >= 0


def test_report_renders_certificates(rng, tmp_path):
    layer = lipcert.Layer.from_arrays(**random_layer_args(rng, d=4, heads=1, dk=2))
    x0 = rng.standard_normal((3, 4))
    c = lipcert.certify(layer, x0, radius=0.01, time_limit=1, threads=1, progress=False)
    saved = c.save(tmp_path / "c.json")
    html = lipcert.report([saved, c], html=tmp_path / "r.html", markdown=tmp_path / "r.md", title="two")
    assert html.startswith("<!DOCTYPE html>") or "<html" in html
    assert (tmp_path / "r.html").read_text() == html and (tmp_path / "r.md").exists()
    with pytest.raises(ValueError, match="nope.json"):
        lipcert.report([tmp_path / "nope.json"])


def test_sweep_of_a_layer(rng, tmp_path):
    layer = lipcert.Layer.from_arrays(**random_layer_args(rng, d=4, heads=1, dk=2))
    x0 = rng.standard_normal((3, 4))
    out = lipcert.sweep(layer, x0, relative_radii=[0, 0.01], time_limit_per_point=1, threads=1,
                        out=tmp_path / "sweep", progress=False)
    assert out["total"] == 2 and out["computed"] == 2
    doc = json.loads(open(out["json"]).read())
    assert doc["schema"] == "lipcert.sweep/1" and len(doc["points"]) == 2
    again = lipcert.sweep(layer, x0, relative_radii=[0, 0.01], time_limit_per_point=1, threads=1,
                          out=tmp_path / "sweep", progress=False)
    assert again["resumed"] == 2 and again["computed"] == 0


def test_ctrl_c_ends_a_search_with_its_witness_so_far(rng, ctrl_c):
    p = random_layer_args(rng, kind="dot", d=8, heads=2, dk=4)
    layer = lipcert.Layer.from_arrays(**p)
    x0 = rng.standard_normal((6, 8))
    timer = threading.Timer(2.0, signal.raise_signal, args=(signal.SIGINT,))
    timer.start()
    try:
        r = lipcert.search(layer, x0, radius=0.1, time_limit=60, threads=1, progress=False)
    finally:
        timer.cancel()
    assert r.interrupted and r.elapsed_s < 30
    assert r.lower_bound > 0 and np.linalg.norm(r.witness.x - x0) <= 0.1 * (1 + 1e-9)
