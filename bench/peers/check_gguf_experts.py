#!/usr/bin/env python3
"""Independent check of `expertd prepare FILE.gguf` with llama.cpp's own gguf-py reader.

For every routed expert of a qwen35moe GGUF, compares the container's blob parts with the
GGUF's bytes as gguf-py reads them: a tensor whose type is the container's block format for
its matrix must be byte-identical; any other is reported with the largest difference between
gguf-py's dequantization of the GGUF and of the container's blocks (relative to the largest
weight). Prints one JSON object.
Fused gate/up tensors (`--fuse-gate-up-exps`) are split per expert into their halves. Exit 1
unless at least one tensor was copied and every copy is identical.
Usage: check_gguf_experts.py FILE.gguf CONTAINER_DIR
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import dequantize

gguf_path, cdir = sys.argv[1], Path(sys.argv[2])
report = json.loads((cdir / "prepare-report.json").read_text())
fmt = report["expert_format"]
kinds = {"q4k": (T.Q4_K, T.Q4_K), "q4k-q6k": (T.Q4_K, T.Q6_K)}
if fmt not in kinds:
    sys.exit(f"container format {fmt}: only the k-quant formats are compared byte for byte")
gu_kind, dn_kind = kinds[fmt]
d, f = report["dims"]["hidden"], report["dims"]["expert_inner"]
n_layers, n_exp = report["dims"]["n_layers"], report["dims"]["n_experts"]

blob = (cdir / "experts.sluice").read_bytes()
# The v2 index at byte 4096: per blob (offset u64, length u64, checksum u64, format u32, 0 u32).
def blob_at(layer, expert):
    off, = struct.unpack_from("<Q", blob, 4096 + 32 * (layer * n_exp + expert))
    return off

def row_bytes(kind, cols):
    size = {T.Q4_K: 144, T.Q6_K: 210}[kind]
    return cols // 256 * size

gu_bytes = 2 * f * row_bytes(gu_kind, d)
dn_bytes = d * row_bytes(dn_kind, f)
r = GGUFReader(gguf_path)
tensors = {t.name: t for t in r.tensors}
out = {"gguf": gguf_path, "container": str(cdir), "format": fmt, "copied": [], "requantized": []}
for layer in range(n_layers):
    fused = tensors.get(f"blk.{layer}.ffn_gate_up_exps.weight")
    for part in ("gate", "up", "down"):
        if fused is not None and part != "down":
            # --fuse-gate-up-exps: each expert's gate rows, then its up rows.
            t = fused
            both = np.asarray(t.data).reshape(n_exp, -1).view(np.uint8)
            half = both.shape[1] // 2
            raw = both[:, :half] if part == "gate" else both[:, half:]
        else:
            t = tensors[f"blk.{layer}.ffn_{part}_exps.weight"]
            raw = np.asarray(t.data).reshape(n_exp, -1).view(np.uint8)
        kind = dn_kind if part == "down" else gu_kind
        rows, cols = (d, f) if part == "down" else (f, d)
        worst, largest, same = 0.0, 0.0, True
        for e in range(n_exp):
            at = blob_at(layer, e)
            if part == "down":
                ours = blob[at + gu_bytes: at + gu_bytes + dn_bytes]
            else:
                half = gu_bytes // 2
                start = at + (half if part == "up" else 0)
                ours = blob[start: start + half]
            theirs = raw[e].tobytes()
            if t.tensor_type == kind:
                same &= ours == theirs
            else:
                a = dequantize(np.frombuffer(theirs, np.uint8).reshape(rows, -1), t.tensor_type)
                b = dequantize(np.frombuffer(ours, np.uint8).reshape(rows, -1), kind)
                worst = max(worst, float(np.abs(a - b).max()))
                largest = max(largest, float(np.abs(a).max()))
        entry = {"tensor": t.name + ("" if fused is None or part == "down" else f" ({part} half)"),
                 "type": t.tensor_type.name}
        if t.tensor_type == kind:
            entry["byte_identical"] = bool(same)
            out["copied"].append(entry)
        else:
            entry.update(to=kind.name, max_abs_diff=worst, max_abs_weight=largest,
                         rel_to_max_weight=worst / largest if largest else 0.0)
            out["requantized"].append(entry)
# Nothing copied would make "all identical" vacuous: that counts as a failure.
out["all_copies_identical"] = bool(out["copied"]) and all(c["byte_identical"] for c in out["copied"])
print(json.dumps(out, indent=1))
sys.exit(0 if out["all_copies_identical"] else 1)
