"""lipcert.certify, search, sweep and report: the CLI's subcommands as functions.

Each builds the request the CLI builds (certify/pipeline.h: PrepareJob, the same option
structs, the same validation) and calls the same C++ functions, so the same job with the
same seed and work budget gives the same certificate bits through Python and through
`lipcert certify`.
"""

import os
import shlex
import sys

from . import _arrays
from . import _core
from .certificate import Certificate, SearchResult
from .layer import Layer
from .progress import run_in_worker

_SETS = ("ball", "tokens", "box")


def _settings(layer, x0, set, radius, relative_radius, norm, time_limit, threads, seed, budget, tolerance,
              probabilistic, probabilistic_seed, centre_name):
    """Checks every argument (TypeError / ValueError naming it) and returns (centre, settings)."""
    if not isinstance(layer, Layer):
        raise TypeError(f"layer: expected a lipcert.Layer, got {type(layer).__name__}")
    conversions = list(layer.conversions)
    if isinstance(x0, (str, os.PathLike)):  # FILE.npy or FILE.safetensors[:TENSOR], read as the CLI reads it
        spec = os.fspath(x0)
        centre = _core.load_centre(spec, 0, layer.d_model)
        if centre_name is None:
            centre_name = spec
    elif not (hasattr(x0, "ndim") and x0.ndim == 3):
        centre = _arrays.as_float64("x0", x0, 2, conversions)
    else:  # (1, N, D), as a batch of one
        if x0.shape[0] != 1:
            raise ValueError(f"x0: expected (N, D) or (1, N, D), got shape {tuple(x0.shape)}")
        centre = _arrays.as_float64("x0", x0[0], 2, conversions)
    if centre.shape[1] != layer.d_model:
        raise ValueError(f"x0: expected (N, {layer.d_model}) for this layer (D = {layer.d_model}), "
                         f"got shape {centre.shape}")
    s = _core.RunSettings()
    s.set = _arrays.choice("set", set, _SETS)
    s.norm = _arrays.norm_name(norm)
    if (radius is None) == (relative_radius is None):
        raise ValueError("radius: give exactly one of radius and relative_radius")
    if radius is not None:
        s.radius = _arrays.real("radius", radius, minimum=0)
    else:
        s.relative_radius = _arrays.real("relative_radius", relative_radius, minimum=0)
    s.time_limit = _arrays.real("time_limit", time_limit, minimum=0, strictly=True)
    s.threads = _arrays.integer("threads", threads, minimum=0)
    s.seed = _arrays.integer("seed", seed, minimum=0)
    s.tolerance = _arrays.real("tolerance", tolerance, minimum=0)
    s.budget = _arrays.budget_text(budget)
    s.probabilistic = bool(probabilistic)
    s.probabilistic_seed = _arrays.integer("probabilistic_seed", probabilistic_seed, minimum=0)
    if centre_name is None:
        centre_name = "array"
    elif not isinstance(centre_name, str):
        raise TypeError("centre_name: expected a str")
    s.centre_name = centre_name
    s.notes = [f"converted to float64: {c}" for c in conversions]
    return centre, s


def load_centre(spec, layer, tokens=0):
    """A centre X0 as `lipcert certify --center SPEC` reads it: "zero" (with tokens),
    FILE.npy, or FILE.safetensors[:TENSOR]; checked (N, D) for `layer` and finite."""
    if not isinstance(layer, Layer):
        raise TypeError(f"layer: expected a lipcert.Layer, got {type(layer).__name__}")
    return _core.load_centre(os.fspath(spec), _arrays.integer("tokens", tokens, minimum=0), layer.d_model)


def certify(layer, x0, set="ball", radius=None, relative_radius=None, norm=2, time_limit=30, threads=0, seed=1,
            budget=None, progress=True, *, tolerance=0.01, probabilistic=True, probabilistic_seed=0,
            centre_name=None):
    """Certifies the local Lipschitz constant of `layer` over a set around x0.

    layer: a lipcert.Layer. x0: the centre, (N, D) (numpy or torch, any float dtype), or a
    file as the CLI's --center reads it (FILE.npy, FILE.safetensors[:TENSOR]).
    set: "ball" (||X - X0||_F <= R), "tokens" (every token within R) or "box" (|X - X0|_max <= R).
    radius: R, or relative_radius: R as a fraction of ||X0||_F (exactly one).
    norm: 2 (Frobenius in, Frobenius out: the spectral norm of J) or "inf".
    time_limit: seconds for the whole run; threads: 0 for all cores; seed: the search's.
    budget: bound the run by work instead of the clock: STEPS (branch-and-bound pieces) or
    (STEPS, ROUNDS) (and lower-bound search rounds, default 2), as `lipcert certify --budget
    STEPS[,ROUNDS]`; the certificate is then the same bits on any machine and thread count,
    and the same as the CLI's. time_limit is not read. tolerance: stop once upper <= (1 +
    tolerance) lower. probabilistic: add the probabilistic (not certified) bound, its random
    start from probabilistic_seed (0: drawn from the OS, recorded). centre_name: how the
    certificate names the centre (default "array").
    progress: a progress bar (tqdm when installed, else one stderr line); False: silent.

    Ctrl-C stops the run and returns its best certificate so far (sound; .interrupted set).
    Returns a lipcert.Certificate.
    """
    centre, s = _settings(layer, x0, set, radius, relative_radius, norm, time_limit, threads, seed, budget, tolerance,
                          probabilistic, probabilistic_seed, centre_name)
    run = _core.Run(layer._core, centre, s)

    def poll():
        n, upper, lower, _ = run.progress()
        return f"upper {upper:.6g}  lower {lower:.6g}" if n else "bounding"

    def on_interrupt():  # every stage ends at its next check; the certificate so far comes back
        run.request_stop()
        return True, run.latest()

    core, interrupted = run_in_worker(run.certify, progress=progress, label="lipcert certify",
                                      total_s=run.time_limit, poll=poll, on_interrupt=on_interrupt)
    return Certificate(core, interrupted=interrupted)


def search(layer, x0, set="ball", radius=None, relative_radius=None, norm=2, time_limit=10, threads=0, seed=1,
           progress=True, *, centre_name=None):
    """The witnessed lower bound alone, with the whole time limit (`lipcert search`).

    Arguments as for certify. Returns a lipcert.SearchResult (lower_bound, witness).
    """
    centre, s = _settings(layer, x0, set, radius, relative_radius, norm, time_limit, threads, seed, None, 0.01,
                          False, 0, centre_name)
    run = _core.Run(layer._core, centre, s)
    core, interrupted = run_in_worker(run.search, progress=progress, label="lipcert search", total_s=run.time_limit)
    return SearchResult(core, interrupted=interrupted)


def _model_paths(models, out_dir, layer_arg):
    """Checkpoint paths for a sweep: paths as given; Layers written to out_dir/layers/."""
    paths = []
    for i, m in enumerate(models):
        if isinstance(m, Layer):
            d = os.path.join(out_dir, "layers")
            os.makedirs(d, exist_ok=True)
            paths.append(m.save(os.path.join(d, f"layer{i}.safetensors")))
            if layer_arg not in (None, "", 0, "0"):
                raise ValueError("layer: a sweep of Layer objects certifies each layer itself; give layer=None")
        elif isinstance(m, (str, os.PathLike)):
            paths.append(os.fspath(m))
        else:
            raise TypeError(f"models[{i}]: expected a checkpoint path or a lipcert.Layer, got {type(m).__name__}")
    return paths


def _centre_specs(centres, out_dir):
    """Centre specs for a sweep: strings ("zero", FILE[:TENSOR]) as given; arrays written as .npy."""
    specs = []
    for i, c in enumerate(centres):
        if isinstance(c, (str, os.PathLike)):
            specs.append(os.fspath(c))
        else:
            a = _arrays.as_float64(f"centres[{i}]", c, 2)
            d = os.path.join(out_dir, "centres")
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, f"centre{i}.npy")
            _core.write_npy(path, a)
            specs.append(path)
    return specs


def _as_list(name, value):
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike, Layer)) or hasattr(value, "shape"):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise TypeError(f"{name}: expected one item or a list")


def sweep(models, centres, radii=None, relative_radii=None, set="ball", norm=2, layer=None, tokens=0,
          tokens_list=None, preset="auto", heads=0, attention_only=False, time_limit_per_point=10, budget=None,
          threads=0, out="lipcert-sweep", validate=False, progress=True):
    """Certifies a grid of radii (and N, layers, models) and writes a report (`lipcert sweep`).

    models: checkpoint paths or lipcert.Layer objects (a Layer is saved to OUT/layers/ first);
    centres: "zero", FILE[:TENSOR] or arrays (saved to OUT/centres/), one for every model or
    one per model. radii or relative_radii: lists (exactly one). layer: None (the only
    layer), "all" or an index. budget: per point, as for certify (instead of
    time_limit_per_point). Resumes from OUT/sweep.json as the CLI does.
    Returns a dict: json, csv, html, markdown (paths) and total, computed, resumed, seconds.
    """
    model_list = _as_list("models", models)
    if not model_list:
        raise ValueError("models: give at least one checkpoint or Layer")
    out = os.fspath(out)
    os.makedirs(out, exist_ok=True)
    o = _core.SweepOptions()
    o.models = _model_paths(model_list, out, layer)
    o.centres = _centre_specs(_as_list("centres", centres), out)
    if (radii is None) == (relative_radii is None):
        raise ValueError("radii: give exactly one of radii and relative_radii")
    if radii is not None:
        o.radii = [_arrays.real(f"radii[{i}]", r, minimum=0) for i, r in enumerate(_as_list("radii", radii))]
    else:
        o.relative_radii = [_arrays.real(f"relative_radii[{i}]", r, minimum=0)
                            for i, r in enumerate(_as_list("relative_radii", relative_radii))]
    o.layer = "" if layer is None else str(layer) if layer == "all" else str(_arrays.integer("layer", layer, minimum=0))
    o.tokens = _arrays.integer("tokens", tokens, minimum=0)
    o.tokens_list = [_arrays.integer("tokens_list", n, minimum=1) for n in (tokens_list or [])]
    o.preset = _arrays.choice("preset", preset, ["auto"] + list(_core.known_presets()))
    o.heads = _arrays.integer("heads", heads, minimum=0)
    o.attention_only = bool(attention_only)
    o.time_limit_per_point = _arrays.real("time_limit_per_point", time_limit_per_point, minimum=0, strictly=True)
    o.threads = _arrays.integer("threads", threads, minimum=0)
    o.out_dir = out
    o.validate = bool(validate)
    o.progress = bool(progress)
    o.command_line = "python: " + " ".join(shlex.quote(a) for a in sys.argv)
    args = (o, _arrays.choice("set", set, _SETS), _arrays.norm_name(norm), _arrays.budget_text(budget))
    summary, _ = run_in_worker(lambda: _core.run_sweep(*args), progress=False, label="lipcert sweep", total_s=1)
    result = {k: summary[k] for k in ("json", "csv", "html", "markdown")}
    result.update({k: int(summary[k]) for k in ("total", "computed", "resumed")})
    result["seconds"] = float(summary["seconds"])
    return result


def report(inputs, html=None, markdown=None, title="lipcert report", validate=False, validation_time_limit=2,
           threads=0):
    """Renders certificates and sweeps as one HTML report (`lipcert report`); returns the HTML.

    inputs: JSON files (certificates, sweeps, audits) and Certificate objects; the report
    lists the files first, then the certificates, each in the order given.
    html: also write the HTML here; markdown: write a Markdown twin here (SVGs beside it).
    """
    paths, documents = [], []
    items = _as_list("inputs", inputs)
    if not items:
        raise ValueError("inputs: give at least one certificate or JSON file")
    for i, x in enumerate(items):
        if isinstance(x, Certificate):
            documents.append((f"certificate {i}", x.to_json(-1)))
        elif isinstance(x, (str, os.PathLike)):
            paths.append(os.fspath(x))
        else:
            raise TypeError(f"inputs[{i}]: expected a JSON file path or a lipcert.Certificate, got {type(x).__name__}")
    o = _core.ReportOptions()
    o.title = str(title)
    o.command_line = "python: " + " ".join(shlex.quote(a) for a in sys.argv)
    o.validate = bool(validate)
    o.validation_time_limit = _arrays.real("validation_time_limit", validation_time_limit, minimum=0, strictly=True)
    o.threads = _arrays.integer("threads", threads, minimum=0)
    for flag, p in (("html", html), ("markdown", markdown)):
        if p is not None and not os.path.isdir(os.path.dirname(os.path.abspath(os.fspath(p)))):
            raise ValueError(f"{flag}: output folder of {os.fspath(p)} does not exist")
    text = _core.render_report(paths, documents, "" if markdown is None else os.fspath(markdown), o)
    if html is not None:
        _core.write_file_atomic(os.fspath(html), text)
    return text
