"""The same job gives the same certificate bits through Python and through `lipcert certify`."""

import json
import re
import subprocess

import pytest

import lipcert
from lipcert import _core

TIMING = ("seconds", "elapsed_s", "time_model")  # wall-clock readings and the machine probe


def without_timing(doc):
    """The certificate minus wall-clock readings (which differ run to run): the seconds
    fields, and durations in notes ("the variation took 0.22 s")."""
    if isinstance(doc, dict):
        return {k: without_timing(v) for k, v in doc.items() if k not in TIMING}
    if isinstance(doc, list):
        return [without_timing(v) for v in doc]
    if isinstance(doc, str):
        return re.sub(r"[0-9.e+-]+ s\b", "T s", doc)
    return doc


def run_cli(cli, tmp_path, args):
    out = tmp_path / "cli.json"
    proc = subprocess.run([cli, "certify", *args, "--quiet", "--json", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def compare(cli_doc, cert):
    py_doc = cert.to_dict()
    # Bit for bit: JSON numbers are written with round-trip precision.
    assert cli_doc["upper_bound"] == cert.upper_bound
    assert cli_doc["lower_bound"] == cert.lower_bound
    assert cli_doc["upper_bound"] is not None and cli_doc["upper_bound"] >= cli_doc["lower_bound"] > 0
    assert without_timing(cli_doc) == without_timing(py_doc)


@pytest.mark.parametrize("model,centre", [("dot-layer0", "x0"), ("l2-layer1", "x2")])
def test_python_and_cli_certify_the_zoo_alike(cli, zoo, tmp_path, model, centre):
    # Radius 0 with a loose tolerance: the run ends at the first stage that meets it, so it
    # does not depend on the clock.
    path = str(zoo / f"{model}.safetensors")
    layer = lipcert.Layer.from_checkpoint(path)
    # The first 8 tokens (a causal layer's outputs at them do not depend on the rest).
    spec = str(tmp_path / "x0.npy")
    _core.write_npy(spec, lipcert.load_centre(f"{zoo}/{model}-centres.safetensors:{centre}", layer)[:8])
    cli_doc = run_cli(cli, tmp_path, ["--model", path, "--center", spec, "--radius", "0", "--tolerance", "0.5",
                                      "--time-limit", "120", "--threads", "1", "--seed", "7", "--no-probabilistic"])
    cert = lipcert.certify(layer, spec, radius=0, tolerance=0.5, time_limit=120, threads=1, seed=7,
                           probabilistic=False, progress=False)
    compare(cli_doc, cert)


@pytest.mark.parametrize("model,centre", [("dot-layer1", "x1"), ("l2-layer0", "x3")])
def test_python_and_cli_agree_on_a_budgeted_run(cli, zoo, tmp_path, model, centre):
    # A work budget instead of the clock, on a set (the search and branch and bound run).
    path = str(zoo / f"{model}.safetensors")
    layer = lipcert.Layer.from_checkpoint(path)
    spec = str(tmp_path / "x.npy")
    _core.write_npy(spec, lipcert.load_centre(f"{zoo}/{model}-centres.safetensors:{centre}", layer)[:6])
    cli_doc = run_cli(cli, tmp_path, ["--model", path, "--center", spec, "--relative-radius", "0.01", "--budget",
                                      "4,1", "--threads", "1", "--seed", "3"])
    cert = lipcert.certify(layer, spec, relative_radius=0.01, budget=(4, 1), threads=1, seed=3, progress=False)
    assert cert.status in ("work_budget", "tolerance_reached")
    compare(cli_doc, cert)
