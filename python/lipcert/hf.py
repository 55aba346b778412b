"""HuggingFace models: capture their centres and certify every attention layer from text.

    from transformers import AutoModel, AutoTokenizer
    model = AutoModel.from_pretrained(folder).eval()
    inputs = AutoTokenizer.from_pretrained(folder)(texts, padding=True, return_tensors="pt")
    caps = lipcert.hf.capture(model, **inputs)        # per block: .layer, .centres (padding removed)

and from the command line (or lipcert.hf.run from Python):

    lipcert hf MODEL_DIR --text "..." [--text ...] [--layers all|0,2] --relative-radii 0.001,0.01 \\
        --out DIR [--time-limit S] [--norm 2|inf] [--attention-only] [--audit]
    python -m lipcert.hf ...                          (the same)

It tokenizes each text with the folder's own tokenizer (AutoTokenizer), runs the model once per
text (AutoModel, offline: nothing is downloaded), certifies every selected attention layer
around each text's centre at each relative radius (lipcert.certify) and writes under DIR:

    report.md                 one row per (layer, text, radius): certified upper, witnessed
                              lower, gap, status, seconds (also printed)
    report.html               the core's report of all the certificates (lipcert.report)
    results.json              the rows, the model, the texts and their tokens
    certificates/layer{L}_text{T}_r{R}.json   each certificate (lipcert.certificate/1)
    audit/                    with --audit: layer{L}.safetensors (each layer as lipcert reads it),
                              centres.safetensors (float64 tensors layer{L}_text{T}) and
                              audit.toml for `lipcert audit audit/audit.toml --out audit/run`

Bad input (a folder without config.json or weights, an architecture lipcert does not support,
an empty text, a layer out of range, a bad radius) is one line on stderr naming what is wrong,
exit status 2, and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


class InputError(ValueError):
    """A bad argument of lipcert hf (exit status 2, nothing written)."""


def capture(model, attention_only: bool = False, **inputs):
    """lipcert.capture for a HuggingFace model and the tokenizer's (or processor's) output:
    capture(model, **tokenizer(texts, padding=True, return_tensors="pt")). The attention_mask
    removes padding from the centres."""
    from .capture import capture as _capture

    if not inputs:
        raise ValueError("inputs: give the model's inputs as keywords (input_ids=..., attention_mask=...)")
    return _capture(model, attention_only=attention_only, **dict(inputs))


# --------------------------------------------------------------------------------------
# Loading a folder


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a folder, never the hub
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except Exception:
        pass


def load(model_dir: str):
    """(model, tokenizer) of a HuggingFace folder, offline, in eval mode. InputError when the
    folder lacks config.json, weights or a tokenizer, or transformers cannot read it."""
    if not os.path.isdir(model_dir):
        raise InputError(f"{model_dir}: not a folder (expected a HuggingFace model folder)")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise InputError(f"{model_dir}: no config.json (not a HuggingFace model folder)")
    if not any(os.path.isfile(os.path.join(model_dir, f)) for f in _WEIGHT_FILES):
        raise InputError(f"{model_dir}: no weights (expected one of {', '.join(_WEIGHT_FILES)})")
    _quiet_transformers()
    try:
        from transformers import AutoConfig, AutoModel, AutoTokenizer
    except ImportError as e:
        raise InputError(f"transformers is not installed ({e}); pip install 'lipcert[hf]'") from None
    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:
        raise InputError(f"{model_dir}/config.json: {_one_line(e)}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:
        raise InputError(f"{model_dir}: no tokenizer transformers can load for model_type "
                         f"'{getattr(config, 'model_type', '?')}' ({_one_line(e)}); lipcert hf takes text") from None
    if tokenizer is None or isinstance(tokenizer, bool):
        raise InputError(f"{model_dir}: no tokenizer (lipcert hf takes text)")
    try:
        model = AutoModel.from_pretrained(model_dir, local_files_only=True, config=config)
    except Exception as e:
        raise InputError(f"{model_dir}: cannot load the model ({_one_line(e)})") from None
    model.eval()
    return model, tokenizer


def _one_line(e: BaseException) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= 300 else s[:297] + "..."


# --------------------------------------------------------------------------------------
# The run


def _parse_layers(text: str, count: int) -> List[int]:
    if text.strip() == "all":
        return list(range(count))
    out: List[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            i = int(part)
        except ValueError:
            raise InputError(f"--layers: '{part}' is not a layer index (expected all or e.g. 0,2)") from None
        if not 0 <= i < count:
            raise InputError(f"--layers: layer {i} is out of range (the model has {count} attention layers, "
                             f"0..{count - 1})")
        if i not in out:
            out.append(i)
    if not out:
        raise InputError("--layers: empty")
    return out


def _checked_texts(texts):
    """The texts as a list; InputError naming the --text that is missing or empty."""
    texts = list(texts)
    if not texts:
        raise InputError("--text: give at least one text")
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise InputError(f"--text {i + 1}: empty text")
    return texts


def _parse_radii(text) -> List[float]:
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    out: List[float] = []
    for part in items:
        try:
            r = float(str(part).strip())
        except ValueError:
            raise InputError(f"--relative-radii: '{part}' is not a number") from None
        if not math.isfinite(r) or r < 0:
            raise InputError(f"--relative-radii: {part} is not a finite number >= 0")
        out.append(r)
    if not out:
        raise InputError("--relative-radii: empty")
    return out


def _radius_tag(r: float) -> str:
    return f"{r:g}"


def run(model_dir: str, texts: Sequence[str], relative_radii=(0.001, 0.01), layers="all", out: Optional[str] = None,
        time_limit: float = 10.0, norm=2, attention_only: bool = False, audit: bool = False, threads: int = 0,
        seed: int = 1, budget: Optional[float] = None, max_tokens: Optional[int] = None, log=None,
        command: str = "") -> Dict:
    """lipcert hf as a function: returns the results dict (also written to out/results.json when
    out is given). Raises InputError on bad input before anything is written."""
    import lipcert

    say = log or (lambda s: None)
    texts = _checked_texts(texts)
    radii = _parse_radii(relative_radii)
    if not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit) and time_limit > 0):
        raise InputError(f"--time-limit: {time_limit} is not a positive number of seconds")
    if str(norm) not in ("2", "inf"):
        raise InputError(f"--norm: '{norm}' is not 2 or inf")
    norm = 2 if str(norm) == "2" else "inf"
    if out is not None and os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"--out: {out} exists and is not a folder")
    if out is not None and not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise InputError(f"--out: the folder above {out} does not exist")

    t0 = time.perf_counter()
    model, tokenizer = load(model_dir)
    from .capture import capture as _capture, find_blocks
    from .torch_layers import UnsupportedModuleError

    try:
        blocks = find_blocks(model, attention_only)
    except UnsupportedModuleError as e:
        raise InputError(f"{model_dir}: unsupported architecture: {_one_line(e)}") from None
    if not blocks:
        raise InputError(f"{model_dir}: unsupported architecture: {type(model).__name__} (model_type "
                         f"'{getattr(model.config, 'model_type', '?')}') has no attention block lipcert recognises")
    selected = _parse_layers(str(layers) if not isinstance(layers, (list, tuple)) else ",".join(map(str, layers)),
                             len(blocks))
    limit = max_tokens or getattr(tokenizer, "model_max_length", None)
    if not isinstance(limit, int) or limit > 100000:
        limit = getattr(model.config, "max_position_embeddings", 512)
    tokens: List[List[str]] = []
    per_text = []
    for i, t in enumerate(texts):
        enc = tokenizer(t, return_tensors="pt", truncation=True, max_length=limit)
        ids = enc["input_ids"][0].tolist()
        if not ids:
            raise InputError(f"--text {i + 1}: the tokenizer gives no token")
        tokens.append(tokenizer.convert_ids_to_tokens(ids))
        try:
            caps = _capture(model, attention_only=attention_only, **dict(enc))
        except UnsupportedModuleError as e:
            raise InputError(f"{model_dir}: unsupported architecture: {_one_line(e)}") from None
        per_text.append(caps)
    load_s = time.perf_counter() - t0
    spec0 = per_text[0][0].spec
    say(f"lipcert hf: {type(model).__name__} from {model_dir}: {len(blocks)} attention layers "
        f"({spec0.family}, {spec0.structure}{', causal' if spec0.causal else ''}, H = {spec0.heads}), "
        f"{len(texts)} texts ({', '.join(str(len(t)) for t in tokens)} tokens); loaded and captured in {load_s:.1f} s")

    # Everything is valid: from here on files are written.
    if out is not None:
        os.makedirs(os.path.join(out, "certificates"), exist_ok=True)
    rows = []
    cert_paths = []
    for li in selected:
        for ti, caps in enumerate(per_text):
            c = caps[li]
            x0 = c.centres[0]
            for r in radii:
                kw = dict(relative_radius=r, norm=norm, time_limit=time_limit, threads=threads, seed=seed,
                          progress=False)
                if budget is not None:
                    kw["budget"] = budget
                t1 = time.perf_counter()
                cert = lipcert.certify(c.layer, x0, centre_name=f"text{ti}", **kw) \
                    if _accepts(lipcert.certify, "centre_name") else lipcert.certify(c.layer, x0, **kw)
                secs = time.perf_counter() - t1
                row = dict(layer=li, block=c.name, text=ti, tokens=int(x0.shape[0]), relative_radius=r, norm=str(norm),
                           upper_bound=_num(cert.upper_bound), lower_bound=_num(cert.lower_bound), gap=_num(cert.gap),
                           status=getattr(cert, "status", ""), seconds=round(secs, 3))
                if out is not None:
                    p = os.path.join(out, "certificates", f"layer{li}_text{ti}_r{_radius_tag(r)}.json")
                    if hasattr(cert, "save"):
                        cert.save(p)
                    else:
                        with open(p, "w") as f:
                            f.write(cert.to_json() + "\n")
                    row["certificate"] = os.path.relpath(p, out)
                    cert_paths.append(p)
                rows.append(row)
                say(f"  layer {li} text {ti} (N={x0.shape[0]}) radius {r:g}: upper {row['upper_bound']:.6g} "
                    f"lower {row['lower_bound']:.6g} gap {row['gap']:.4g} ({row['status']}, {secs:.1f} s)")
    total_s = time.perf_counter() - t0
    first = per_text[0][selected[0]]
    result = dict(
        schema="lipcert.hf/1",
        model=dict(path=os.path.abspath(model_dir), model_class=type(model).__name__,
                   model_type=getattr(model.config, "model_type", ""), attention_layers=len(blocks),
                   blocks=[dict(layer=i, name=n, family=s.family, structure=s.structure, heads=s.heads, causal=s.causal)
                           for i, (n, s) in enumerate(blocks)]),
        texts=[dict(text=t, tokens=tok) for t, tok in zip(texts, tokens)],
        settings=dict(layers=selected, relative_radii=radii, norm=str(norm), time_limit=time_limit,
                      attention_only=attention_only, threads=threads, seed=seed, budget=budget,
                      hidden_dtype=per_text[0].dtype),
        rows=rows, seconds=dict(load_and_capture=round(load_s, 3), total=round(total_s, 3)),
        command=command,
    )
    if out is not None:
        with open(os.path.join(out, "report.md"), "w") as f:
            f.write(markdown_report(result))
        if hasattr(lipcert, "report") and cert_paths:
            try:
                lipcert.report(cert_paths, html=os.path.join(out, "report.html"),
                               title=f"lipcert hf: {os.path.basename(os.path.normpath(model_dir))}")
            except Exception as e:  # the table above is the report; the HTML is a view of the same certificates
                say(f"lipcert hf: report.html not written ({_one_line(e)})")
        if audit:
            result["audit"] = write_audit(out, per_text, selected, radii, norm, time_limit, attention_only, model_dir)
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return result


def _accepts(fn, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _num(v) -> float:
    return float(v) if v is not None else float("inf")


def markdown_report(result: Dict) -> str:
    m = result["model"]
    s = result["settings"]
    lines = [f"# lipcert hf: {os.path.basename(m['path'])}", "",
             f"{m['model_class']} (model_type {m['model_type']}), {m['attention_layers']} attention layers; "
             f"norm {s['norm']}, ball sets of relative radius {', '.join(f'{r:g}' for r in s['relative_radii'])} "
             f"around each text's hidden states, {s['time_limit']:g} s per certificate"
             f"{', attention alone' if s['attention_only'] else ''}.", ""]
    for i, t in enumerate(result["texts"]):
        lines.append(f"- text {i} ({len(t['tokens'])} tokens): {t['text']}")
    lines += ["", "| layer | block | structure | text | N | radius | certified upper | witnessed lower | gap | status | s |",
              "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    blocks = {b["layer"]: b for b in m["blocks"]}
    for r in result["rows"]:
        b = blocks[r["layer"]]
        st = {"post_ln": "LN(X + MHA(X))", "pre_ln": "X + MHA(LN(X))", "bare": "MHA(X)"}[b["structure"]]
        st += ", causal" if b["causal"] else ""
        lines.append(f"| {r['layer']} | {r['block']} | {st} | {r['text']} | {r['tokens']} | {r['relative_radius']:g} | "
                     f"{r['upper_bound']:.6g} | {r['lower_bound']:.6g} | {r['gap']:.4g} | {r['status']} | "
                     f"{r['seconds']:.1f} |")
    sec = result["seconds"]
    lines += ["", f"Loaded and captured in {sec['load_and_capture']:.1f} s; {sec['total']:.1f} s in all."]
    if result.get("command"):
        lines += ["", "    " + result["command"]]
    return "\n".join(lines) + "\n"


def write_audit(out: str, per_text, selected: List[int], radii: List[float], norm, time_limit: float,
                attention_only: bool, model_dir: str) -> Dict:
    """out/audit/: each selected layer as a checkpoint lipcert reads (Layer.save), the centres
    (float64, layer{L}_text{T}) and audit.toml, which `lipcert audit` runs and resumes."""
    from safetensors.numpy import save_file

    d = os.path.join(out, "audit")
    os.makedirs(d, exist_ok=True)
    tensors = {}
    for li in selected:
        for ti, caps in enumerate(per_text):
            tensors[f"layer{li}_text{ti}"] = np.ascontiguousarray(caps[li].centres[0], dtype=np.float64)
    save_file(tensors, os.path.join(d, "centres.safetensors"),
              metadata={"source": os.path.basename(os.path.normpath(model_dir)),
                        "what": "hidden states entering each attention layer (lipcert hf --audit)"})
    pct = [f'"{100 * r:g}%"' for r in radii]
    lines = [f"# lipcert hf --audit: {os.path.basename(os.path.normpath(model_dir))}, the hidden states of "
             f"{len(per_text)} texts entering each selected attention layer.",
             "#   lipcert audit audit.toml --out run        (a rerun resumes)", "",
             "[defaults]", 'sets = ["ball"]', f"radii = [{', '.join(pct)}]",
             f"norms = [{norm if norm == 2 else chr(34) + 'inf' + chr(34)}]",
             # The checkpoints are the certified map itself (its LayerNorm included or not), so
             # attention_only is false here even for an --attention-only run.
             "attention_only = [false]", f"time_limit = {time_limit:g}", ""]
    for li in selected:
        layer = per_text[0][li].layer
        name = f"layer{li}.safetensors"
        layer.save(os.path.join(d, name))
        lines += ["[[checkpoint]]", f'name = "layer{li}"', f'path = "{name}"', 'preset = "native"',
                  f'centres = {{ file = "centres.safetensors", tensors = ["layer{li}_text*"] }}',
                  f"# {per_text[0][li].name} ({per_text[0][li].spec.structure})", ""]
    with open(os.path.join(d, "audit.toml"), "w") as f:
        f.write("\n".join(lines))
    return dict(folder=os.path.relpath(d, out), file="audit/audit.toml", centres="audit/centres.safetensors")


def save_centres(model_dir: str, texts: Sequence[str], path: str, lengths: Optional[Sequence[int]] = None,
                 log=None) -> Dict[str, np.ndarray]:
    """Writes the hidden states entering every attention layer as float64 safetensors, no
    certification: the centres for `lipcert certify --center FILE:NAME` and audit files.

    The model runs in float64. Without lengths: tensors layer{L}_text{T}, each text whole. With
    lengths: each text truncated by its tokenizer to exactly N tokens (special tokens included),
    tensors layer{L}_n{N} (one text) or layer{L}_text{T}_n{N}; a text shorter than N is an
    InputError. Returns the tensors."""
    from safetensors.numpy import save_file

    from .capture import capture as _capture
    from .torch_layers import UnsupportedModuleError

    say = log or (lambda s: None)
    texts = _checked_texts(texts)
    if lengths is not None:
        lengths = [int(n) for n in lengths]
        if not lengths or any(n < 1 for n in lengths):
            raise InputError(f"--lengths: expected positive token counts, got {lengths}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise InputError(f"--centres: the folder of {path} does not exist")
    model, tokenizer = load(model_dir)
    model = model.double()
    tensors: Dict[str, np.ndarray] = {}
    for ti, t in enumerate(texts):
        for n in (lengths or [None]):
            enc = tokenizer(t, return_tensors="pt", truncation=n is not None, max_length=n)
            got = enc["input_ids"].shape[1]
            if n is not None and got != n:
                raise InputError(f"--text {ti + 1}: {got} tokens, fewer than --lengths {n}")
            try:
                caps = _capture(model, **dict(enc))
            except UnsupportedModuleError as e:
                raise InputError(f"{model_dir}: unsupported architecture: {_one_line(e)}") from None
            for c in caps:
                name = f"layer{c.index}"
                name += f"_n{n}" if n is not None and len(texts) == 1 else (
                    f"_text{ti}_n{n}" if n is not None else f"_text{ti}")
                tensors[name] = np.ascontiguousarray(c.centres[0], dtype=np.float64)
    save_file(tensors, path, metadata={"source": os.path.basename(os.path.normpath(model_dir)),
                                       "what": "hidden states entering each attention layer (lipcert.hf, float64)"})
    say(f"lipcert hf: wrote {path} ({len(tensors)} tensors)")
    return tensors


# --------------------------------------------------------------------------------------
# Command line


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the usage too)
        sys.stderr.write(f"lipcert hf: {message}\n")
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="lipcert hf", description="Certify every attention layer of a HuggingFace model folder "
                "around the hidden states of the given texts.")
    p.add_argument("model_dir", metavar="MODEL_DIR", help="a HuggingFace folder (config.json, weights, tokenizer)")
    p.add_argument("--text", action="append", required=True, help="a text (repeat for several)")
    p.add_argument("--layers", default="all", help="all (default) or attention layer indices, e.g. 0,2")
    p.add_argument("--relative-radii", default="0.001,0.01",
                   help="ball radii as fractions of ||X0||_F, comma-separated (default 0.001,0.01)")
    p.add_argument("--out", help="output folder (created; required unless --centres)")
    p.add_argument("--time-limit", type=float, default=10.0, help="seconds per certificate (default 10)")
    p.add_argument("--norm", default="2", help="2 (default) or inf")
    p.add_argument("--attention-only", action="store_true", help="MHA alone, without the sublayer's LayerNorm")
    p.add_argument("--audit", action="store_true", help="also write audit/ (centres, layers, audit.toml)")
    p.add_argument("--threads", type=int, default=0, help="threads per certificate (0: all cores)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget", type=float, default=None, help="a work budget instead of time (deterministic)")
    p.add_argument("--max-tokens", type=int, default=None, help="truncate each text to this many tokens")
    p.add_argument("--centres", metavar="FILE", help="only write the centres (float64 safetensors, tensors "
                   "layer{L}_text{T}, or layer{L}_n{N} with --lengths and one text) and stop")
    p.add_argument("--lengths", help="with --centres: truncate each text to each of these token counts, e.g. 8,16,32")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = _parser().parse_args(argv)
    log = (lambda s: None) if a.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    if a.centres is not None:
        try:
            lengths = None if a.lengths is None else [int(x) for x in a.lengths.split(",")]
        except ValueError:
            sys.stderr.write(f"lipcert hf: --lengths: '{a.lengths}' is not a list of token counts\n")
            return 2
        try:
            save_centres(a.model_dir, a.text, a.centres, lengths, log=log)
        except InputError as e:
            sys.stderr.write(f"lipcert hf: {e}\n")
            return 2
        return 0
    if a.out is None:
        sys.stderr.write("lipcert hf: --out: required (the report's folder)\n")
        return 2
    if a.lengths is not None:
        sys.stderr.write("lipcert hf: --lengths: only with --centres\n")
        return 2
    try:
        result = run(a.model_dir, a.text, relative_radii=a.relative_radii, layers=a.layers, out=a.out,
                     time_limit=a.time_limit, norm=a.norm, attention_only=a.attention_only, audit=a.audit,
                     threads=a.threads, seed=a.seed, budget=a.budget, max_tokens=a.max_tokens, log=log,
                     command="lipcert hf " + " ".join(shlex.quote(x) for x in (sys.argv[1:] if argv is None else argv)))
    except InputError as e:
        sys.stderr.write(f"lipcert hf: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("lipcert hf: interrupted\n")
        return 130
    if not a.quiet:
        print(markdown_report(result), end="")
    print(f"lipcert hf: wrote {a.out}/report.md" + (", report.html" if os.path.exists(os.path.join(a.out, "report.html"))
                                                    else "") + (", audit/" if a.audit else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
