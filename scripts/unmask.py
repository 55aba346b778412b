#!/usr/bin/python3
"""Copy a native lipcert checkpoint with its causal mask turned off (metadata causal=false).

The bundled zoo layers are causal, and the closed-form bounds (Castin et al., Kim et al.)
are for unmasked attention; this copy lets them be compared with the engines on trained
weights. The weights are unchanged; the copy records where it came from.

    /usr/bin/python3 scripts/unmask.py models/zoo/dot-layer0.safetensors /tmp/dot-layer0-unmasked.safetensors
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: unmask.py IN.safetensors OUT.safetensors")
    src, dst = sys.argv[1], sys.argv[2]
    tensors, meta = st.load(src)
    meta = dict(meta or {})
    if meta.get("causal") != "true":
        sys.exit(f"unmask.py: {src}: metadata field 'causal' is not 'true'; nothing to unmask")
    meta["causal"] = "false"
    meta["source"] = meta.get("source", "") + f"; causal mask removed by scripts/unmask.py from {os.path.basename(src)}"
    st.save(dst, tensors, meta)


if __name__ == "__main__":
    main()
