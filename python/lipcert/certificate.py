"""lipcert.Certificate and lipcert.SearchResult: what certify() and search() return.

A Certificate wraps the C++ Certificate (certify/certificate.h). Its bounds are the C++
doubles themselves (not read back from JSON), its JSON is the C++ ToJson, the schema
"lipcert.certificate/1" that `lipcert certify --json` writes (docs/certificate.md).
"""

import html
import json
import math
import os
from typing import NamedTuple

import numpy as np

from . import _core


def _num(v):
    """A JSON bound (null stands for +inf) as a float."""
    return math.inf if v is None else float(v)


class Witness(NamedTuple):
    """The witness of the lower bound: ||J(x) v|| / ||v|| >= lower_bound, x in the set."""
    x: np.ndarray          # (N, D), the point
    v: np.ndarray          # (N, D), the direction
    lower_bound: float     # rigorous
    value: float           # the floating estimate
    origin: str            # how the search found it


class Certificate:
    """A certified upper bound and a witnessed lower bound on the local Lipschitz constant.

    upper_bound: sup over the set of ||J(X)|| <= upper_bound (certified, rounding included).
    lower_bound: ||J(X*) v|| / ||v|| >= lower_bound at the witness X* of the set.
    interrupted: True when the run was stopped by Ctrl-C (the bounds still hold).
    """

    def __init__(self, core, interrupted=False):
        self._core = core
        self._doc = json.loads(core.to_json(-1))
        self.interrupted = bool(interrupted)

    # ---- the result ----
    upper_bound = property(lambda self: self._core.upper_bound, doc="certified upper bound (float, may be inf)")
    lower_bound = property(lambda self: self._core.lower_bound, doc="witnessed lower bound (float)")
    gap = property(lambda self: self._core.gap, doc="upper / lower (inf when lower is 0)")
    status = property(lambda self: self._core.status,
                      doc="tolerance_reached, time_limit, engines_exhausted or in_progress (or the stop's)")
    elapsed_s = property(lambda self: self._core.elapsed_s)
    norm = property(lambda self: self._doc["norm"])
    set = property(lambda self: dict(self._doc["set"]), doc="kind, radius, tokens, centre, centre_frobenius_norm")
    layer = property(lambda self: dict(self._doc["layer"]), doc="the layer's structure")
    notes = property(lambda self: list(self._doc.get("notes", [])))

    @property
    def winner(self):
        """The engine whose bound is the certificate's, or None when no bound is finite."""
        w = self._doc.get("winner")
        return None if w is None else w["engine"]

    @property
    def dominant_term(self):
        """(name, upper bound) of the winner's largest term, or None."""
        t = (self._doc.get("winner") or {}).get("dominant_term")
        return None if t is None else (t["name"], _num(t["upper_bound"]))

    @property
    def engines(self):
        """Every engine: name, upper_bound (inf when it did not apply), seconds, applied, note, terms."""
        out = []
        for e in self._doc["engine_details"]:
            out.append({"name": e["name"], "upper_bound": _num(e["upper_bound"]), "seconds": e["seconds"],
                        "applied": e["applied"], "note": e["note"],
                        "terms": [(t["name"], _num(t["upper_bound"])) for t in e["terms"]]})
        return out

    @property
    def terms(self):
        """The winner's terms as (name, upper bound) pairs (empty when there is no winner)."""
        for e in self.engines:
            if e["name"] == self.winner:
                return e["terms"]
        return []

    @property
    def witness(self):
        w = self._doc["witness"]
        return Witness(self._core.witness_x, self._core.witness_v, self._core.lower_bound, _num(w["value"]),
                       w["origin"])

    @property
    def probabilistic(self):
        """The probabilistic (not certified) bound beside the certificate, or None."""
        p = self._doc.get("probabilistic")
        return None if p is None else json.loads(json.dumps(p))

    @property
    def invertibility(self):
        p = self._doc.get("invertibility")
        return None if p is None else dict(p)

    @property
    def provenance(self):
        """Where the numbers came from: model (path, sha256, preset, layer), centre, numerics, notes."""
        return {"model": dict(self._doc["model"]), "centre": self._doc["set"]["centre"],
                "numerics": dict(self._doc["numerics"]), "notes": self.notes, "interrupted": self.interrupted}

    # ---- output ----

    def to_dict(self):
        """The certificate as the CLI's JSON document (a fresh dict)."""
        return json.loads(self._core.to_json(-1))

    def to_json(self, indent=2):
        """The CLI's JSON (schema lipcert.certificate/1), byte for byte as `lipcert certify --json`."""
        return self._core.to_json(indent)

    def save(self, path):
        """Writes to_json() to path atomically, as `lipcert certify --json PATH` does. Returns path."""
        path = os.fspath(path)
        _core.write_file_atomic(path, self.to_json(2) + "\n")
        return path

    def summary(self):
        """The CLI's few-line summary (what `lipcert certify` prints)."""
        return self._core.summary()

    def __str__(self):
        s = self._doc["set"]
        m = self._doc["model"]
        stop = ", interrupted" if self.interrupted else ""
        return (f"Lipschitz in [{self.lower_bound:.6g}, {self.upper_bound:.6g}] (certified upper, witnessed lower; "
                f"gap {self.gap:.4g}, {self.status}{stop}, {self.elapsed_s:.1f} s) over the {s['kind']} of radius "
                f"{s['radius']:.4g} around {s['centre']} (N={s['tokens']}), norm {self.norm}, "
                f"{self._doc['layer']['kind']} layer {m['layer']} of {m['path']}")

    def __repr__(self):
        return (f"<lipcert.Certificate upper={self.upper_bound!r} lower={self.lower_bound!r} "
                f"status={self.status!r}>")

    def _repr_html_(self):
        e = html.escape
        s = self._doc["set"]
        m = self._doc["model"]
        L = self._doc["layer"]
        rows = [("certified upper bound", f"<b>{self.upper_bound:.6g}</b>"),
                ("witnessed lower bound", f"<b>{self.lower_bound:.6g}</b>"),
                ("gap (upper / lower)", f"{self.gap:.4g}"),
                ("status", e(self.status) + (" (interrupted)" if self.interrupted else "")),
                ("set", e(f"{s['kind']}, radius {s['radius']:.6g} around {s['centre']} (N={s['tokens']}), "
                          f"norm {self.norm}")),
                ("layer", e(f"{L['kind']}, D={L['d_model']}, H={L['heads']}"
                            + (", causal" if L["causal"] else "")
                            + (", X+MHA(LN(X))" if L["layer_norm"] else "")
                            + (", LN(X+MHA(X))" if L.get("post_layer_norm") else ""))),
                ("model", e(f"{m['path']} layer {m['layer']} ({m['preset']}, sha256 {m['sha256'][:12]})")),
                ("time", f"{self.elapsed_s:.2f} s")]
        if self.winner is not None:
            terms = " + ".join(f"{e(n)} {v:.4g}" for n, v in self.terms)
            rows.append(("winner", e(self.winner) + (f" = {terms}" if terms else "")))
        p = self._doc.get("probabilistic")
        if p is not None:
            rows.append(("probabilistic (not certified)",
                         f"{_num(p['probable_upper']):.6g} with probability &ge; {p['confidence']:.6g}"))
        for n in self.notes:
            rows.append(("note", e(n)))
        head = "".join(f"<tr><th style='text-align:left'>{k}</th><td>{v}</td></tr>" for k, v in rows)
        eng = "".join(
            f"<tr><td>{e(x['name'])}</td><td>{x['upper_bound']:.6g}</td><td>{x['seconds']:.3f}</td>"
            f"<td>{e(x['note'])}</td></tr>" for x in self.engines)
        return (f"<div class='lipcert-certificate'><table>{head}</table>"
                f"<details><summary>engines</summary><table><tr><th>engine</th><th>upper bound</th>"
                f"<th>s</th><th>note</th></tr>{eng}</table></details></div>")


class SearchResult:
    """The witnessed lower bound alone (lipcert.search; `lipcert search`)."""

    def __init__(self, core, interrupted=False):
        self._core = core
        self.interrupted = bool(interrupted)

    lower_bound = property(lambda self: self._core.lower_bound, doc="rigorous lower bound at the witness")
    value = property(lambda self: self._core.value, doc="floating estimate at the witness")
    origin = property(lambda self: self._core.origin)
    points_evaluated = property(lambda self: self._core.points_evaluated)
    rounds = property(lambda self: self._core.rounds)
    elapsed_s = property(lambda self: self._core.elapsed_s)
    best_by_origin = property(lambda self: dict(self._core.best_by_origin))

    @property
    def witness(self):
        return Witness(self._core.witness_x, self._core.witness_v, self.lower_bound, self.value, self.origin)

    def __str__(self):
        return (f"witnessed lower bound {self.lower_bound:.17g} (floating {self.value:.9g}, origin {self.origin}; "
                f"{self.points_evaluated} points, {self.rounds} rounds, {self.elapsed_s:.1f} s)")

    def __repr__(self):
        return f"<lipcert.SearchResult lower={self.lower_bound!r} origin={self.origin!r}>"
