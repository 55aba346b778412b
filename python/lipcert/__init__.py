"""lipcert: certified local Lipschitz bounds of attention layers, from Python.

    import lipcert
    layer = lipcert.Layer.from_checkpoint("models/zoo/dot-layer0.safetensors")
    cert = lipcert.certify(layer, x0, relative_radius=0.01, time_limit=10)
    print(cert)            # one line: certified upper, witnessed lower, gap, status
    cert.save("cert.json") # the CLI's JSON (lipcert.certificate/1)

The C++ core (lipcert._core) runs the same engines as the `lipcert` command line, which
the package installs too. docs/python.md describes the API.
"""

from ._core import known_presets
from .api import certify, load_centre, report, search, sweep
from .certificate import Certificate, SearchResult, Witness
from .layer import Layer

try:
    from importlib.metadata import version as _version

    __version__ = _version("lipcert")
except Exception:  # not installed as a distribution (e.g. imported from a build folder)
    __version__ = "0.1.0"

__all__ = ["Layer", "Certificate", "SearchResult", "Witness", "certify", "search", "sweep", "report", "load_centre", "capture",
           "known_presets", "__version__"]


def capture(model, *args, **kwargs):
    """Hooks every supported attention block of a torch module, runs its forward once and
    returns the centres and layers (lipcert.capture; needs the [hf] extra)."""
    from .capture import capture as _capture  # torch is optional: imported only here
    return _capture(model, *args, **kwargs)


def __getattr__(name):
    # lipcert.hf (HuggingFace) on first use, so that `import lipcert` needs numpy only.
    if name in ("hf", "torch_layers"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'lipcert' has no attribute {name!r}")
