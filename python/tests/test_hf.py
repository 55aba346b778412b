"""`lipcert hf` (python -m lipcert.hf) end to end: all-MiniLM-L6-v2 from its folder with two short
texts to a report and an audit folder; a tiny causal GPT-2 folder; bad input exits 2 with one
line naming what is wrong and writes nothing."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hf_models import jacobian_norm, minilm_dir, rel_err

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import lipcert  # noqa: E402

TEXTS = ["The quick brown fox jumps.", "Attention mixes tokens."]
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _cli(*args, timeout=600):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "lipcert.hf", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def _folder_with(tmp_path, name, model):
    """A HuggingFace folder: `model` saved (safetensors) and MiniLM's BERT tokenizer beside it."""
    d = tmp_path / name
    model.save_pretrained(d)
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(minilm_dir(), f), d / f)
    return d


def test_minilm_end_to_end(tmp_path, cli):
    folder = minilm_dir()
    out = tmp_path / "out"
    r = _cli(folder, "--text", TEXTS[0], "--text", TEXTS[1], "--layers", "5,0", "--relative-radii", "0,0.01",
             "--time-limit", "2", "--threads", "1", "--out", out, "--audit")
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["model"]["attention_layers"] == 6 and res["model"]["model_class"] == "BertModel"
    assert [len(t["tokens"]) for t in res["texts"]] == [8, 7]  # [CLS] ... [SEP]
    rows = res["rows"]
    assert len(rows) == 2 * 2 * 2  # layers x texts x radii
    for row in rows:
        assert np.isfinite(row["upper_bound"]) and row["upper_bound"] >= row["lower_bound"] > 0
        cert = json.loads((out / row["certificate"]).read_text())
        assert cert["upper_bound"] == row["upper_bound"]
        assert cert["set"]["tokens"] == len(res["texts"][row["text"]]["tokens"])
    # Each layer's bound grows with the radius, and at radius 0 it covers the autograd Jacobian
    # of the model's own attention block (float64) at the centre certified (the audit's copy).
    from safetensors.numpy import load_file
    from transformers import AutoModel, AutoTokenizer

    centres = load_file(str(out / "audit" / "centres.safetensors"))
    assert sorted(centres) == ["layer0_text0", "layer0_text1", "layer5_text0", "layer5_text1"]
    model = AutoModel.from_pretrained(folder).eval()  # float32, as lipcert hf ran it
    enc = AutoTokenizer.from_pretrained(folder)(TEXTS[1], return_tensors="pt")
    caps = lipcert.hf.capture(model, **enc)
    assert caps.dtype == "float32"
    np.testing.assert_allclose(centres["layer5_text1"], caps[5].centres[0], rtol=1e-6, atol=1e-6)
    att = model.double().encoder.layer[5].attention
    x0 = torch.from_numpy(centres["layer5_text1"])
    jac = jacobian_norm(lambda x: att(x.unsqueeze(0))[0][0], x0)
    at0 = [r for r in rows if r["layer"] == 5 and r["text"] == 1 and r["relative_radius"] == 0][0]
    at1 = [r for r in rows if r["layer"] == 5 and r["text"] == 1 and r["relative_radius"] == 0.01][0]
    assert at0["upper_bound"] >= jac >= at0["lower_bound"] * (1 - 1e-9)
    assert at1["upper_bound"] >= at0["upper_bound"]
    md = (out / "report.md").read_text()
    assert md.count("\n| 5 | encoder.layer.5.attention | LN(X + MHA(X))") == 4
    assert "report.md" in r.stderr
    # The audit folder: each layer as lipcert reads it.
    saved = lipcert.Layer.from_checkpoint(str(out / "audit" / "layer5.safetensors"))
    assert rel_err(saved.forward(x0.numpy()), caps[5].layer.forward(x0.numpy())) < 1e-15
    toml = (out / "audit" / "audit.toml").read_text()
    assert 'radii = ["0%", "1%"]' in toml and toml.count("[[checkpoint]]") == 2
    # The lipcert CLI (the wheel's, conftest.py) validates the audit file, loading every layer
    # and centre, and lists its jobs.
    a = subprocess.run([cli, "audit", str(out / "audit" / "audit.toml"), "--dry-run"], capture_output=True,
                       text=True, timeout=300)
    assert a.returncode == 0, a.stderr + a.stdout
    assert a.stdout.count('"preset":"native"') == 2 * 2 * 2


def test_gpt2_folder_causal_pre_ln(tmp_path):
    T = transformers
    torch.manual_seed(0)
    g = T.GPT2Model(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=30522, n_positions=64)).eval()
    folder = _folder_with(tmp_path, "gpt2", g)
    res = lipcert.hf.run(str(folder), ["short text", "another short text here"], relative_radii=[0.01],
                         layers="1", time_limit=2, threads=1)
    assert [b["structure"] for b in res["model"]["blocks"]] == ["pre_ln", "pre_ln"]
    assert all(b["causal"] for b in res["model"]["blocks"])
    assert len(res["rows"]) == 2 and all(r["layer"] == 1 for r in res["rows"])
    assert all(r["upper_bound"] >= r["lower_bound"] > 0 for r in res["rows"])


def _bad(tmp_path, *args):
    out = tmp_path / "never"
    r = _cli(*args, "--out", out)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert not out.exists()
    return lines[0]


def test_bad_input_exit_2_nothing_written(tmp_path):
    folder = minilm_dir()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no config.json" in _bad(tmp_path, empty, "--text", "hello")
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    shutil.copy(os.path.join(folder, "config.json"), no_weights / "config.json")
    assert "no weights" in _bad(tmp_path, no_weights, "--text", "hello")
    assert "not a folder" in _bad(tmp_path, tmp_path / "missing", "--text", "hello")
    assert "--text 2: empty" in _bad(tmp_path, folder, "--text", "hello", "--text", "  ")
    assert "layer 6 is out of range (the model has 6 attention layers" in \
        _bad(tmp_path, folder, "--text", "hello", "--layers", "0,6")
    assert "--relative-radii" in _bad(tmp_path, folder, "--text", "hello", "--relative-radii", "-0.1")
    assert "--text" in _bad(tmp_path, folder)
    T = transformers
    albert = T.AlbertModel(T.AlbertConfig(embedding_size=16, hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=4, intermediate_size=37, vocab_size=30522)).eval()
    msg = _bad(tmp_path, _folder_with(tmp_path, "albert", albert), "--text", "hello")
    assert "unsupported architecture" in msg and "AlbertModel" in msg
    rel = T.BertModel(T.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
                                   vocab_size=30522, position_embedding_type="relative_key")).eval()
    msg = _bad(tmp_path, _folder_with(tmp_path, "relative", rel), "--text", "hello")
    assert "unsupported architecture" in msg and "BertSelfAttention" in msg and "relative_key" in msg


def test_console_script_is_the_same_command(tmp_path):
    import sysconfig

    exe = os.path.join(sysconfig.get_path("scripts"), "lipcert-hf")
    if not os.path.isfile(exe):
        pytest.skip("lipcert-hf is not installed beside this Python (pip install .)")
    r = subprocess.run([exe, str(tmp_path / "missing"), "--text", "hello", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip() == f"lipcert hf: {tmp_path / 'missing'}: not a folder " \
        "(expected a HuggingFace model folder)"
    assert not (tmp_path / "out").exists()


def test_cli_with_an_interpreter_without_the_package_exits_2(tmp_path, cli):
    # An interpreter that cannot import lipcert: this Python without its site-packages.
    python = tmp_path / "python-without-lipcert"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    python.chmod(0o755)
    r = subprocess.run([cli, "hf", str(tmp_path), "--text", "hello", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "LIPCERT_PYTHON": str(python)})
    assert r.returncode == 2, r.stderr
    assert str(python) in r.stderr or sys.executable in r.stderr
    assert "cannot import lipcert.hf" in r.stderr and "pip install '.[hf]'" in r.stderr
    assert not (tmp_path / "out").exists()
