"""Writes tests/fixtures/gguf/pygguf.gguf with the PyPI `gguf` package (llama.cpp's own Python
writer), an independent check of sluice's GGUF reader (shared/src/gguf), and pygguf.json: what
the same package's reader finds in it (metadata with types, tensors with ggml shapes, types,
absolute offsets and sizes) and its table of ggml type sizes, and its dequantization of every tensor.

    python3 -m venv /tmp/ggufenv && /tmp/ggufenv/bin/pip install gguf==0.19.0
    /tmp/ggufenv/bin/python tests/oracle/make_gguf.py
"""

import json
import pathlib

import gguf
import numpy as np

OUT = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
T = gguf.GGMLQuantizationType
# Byte offsets of each block's f16 scale (and min) fields.
SCALES = {T.Q8_0: [0], T.Q4_0: [0], T.Q5_0: [0], T.Q4_1: [0, 2], T.Q5_1: [0, 2], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "pygguf.gguf"
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), arch="qwen35moe")
    w.add_uint32("qwen35moe.block_count", 2)
    w.add_uint64("qwen35moe.context_length", 262144)
    w.add_int32("test.i32", -7)
    w.add_int64("test.i64", -(1 << 40))
    w.add_float32("qwen35moe.rope.freq_base", 10000000.0)
    w.add_float64("test.f64", 0.1)
    w.add_bool("test.bool", True)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_string("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m.role }}\n{% endfor %}")
    w.add_array("tokenizer.ggml.tokens", ["a", "é", "<|im_end|>"])
    w.add_array("tokenizer.ggml.token_type", [1, 1, 3])
    w.add_array("test.floats", [0.5, -1.25])
    w.add_tensor("token_embd.weight", rng.standard_normal((4, 64)).astype(np.float32))
    w.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float16))
    bf16 = (rng.standard_normal((2, 32)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    w.add_tensor("blk.0.attn_norm.weight", bf16.view(np.uint8), raw_dtype=T.BF16)
    # Quantized tensors as random bytes, shape (rows, bytes per row), with their f16 scales
    # (and mins) set to small finite values.
    for name, ty, rows, cols in [
        ("blk.0.ffn_down_exps.weight", T.Q8_0, 3, 64),
        ("blk.0.ffn_gate_exps.weight", T.Q4_K, 2, 256),
        ("blk.0.ffn_up_exps.weight", T.Q6_K, 2, 512),
        ("blk.1.ffn_gate_exps.weight", T.Q5_K, 1, 256),
        ("blk.1.q4_0.weight", T.Q4_0, 2, 64),
        ("blk.1.q4_1.weight", T.Q4_1, 2, 64),
        ("blk.1.q5_0.weight", T.Q5_0, 2, 64),
        ("blk.1.q5_1.weight", T.Q5_1, 2, 64),
    ]:
        block, size = gguf.GGML_QUANT_SIZES[ty]
        raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
        for at in SCALES[ty]:
            scale = rng.uniform(0.001, 0.1, size=raw.shape[:2]).astype(np.float16)
            raw[:, :, at:at + 2] = scale.view(np.uint8).reshape(rows, cols // block, 2)
        w.add_tensor(name, raw.reshape(rows, -1), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    r = gguf.GGUFReader(str(path))
    fields = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        types = [t.name for t in f.types]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING:
                value = [bytes(f.parts[i]).decode() for i in f.data]
            else:
                value = [f.parts[i].tolist()[0] for i in f.data]
        elif f.types[0] == gguf.GGUFValueType.STRING:
            value = bytes(f.parts[f.data[0]]).decode()
        else:
            value = f.parts[f.data[0]].tolist()[0]
        fields[name] = {"types": types, "value": value}
    tensors = [
        {
            "name": t.name,
            "dims": [int(d) for d in t.shape],
            "type": T(t.tensor_type).name,
            "offset": int(t.data_offset),
            "n_bytes": int(t.n_bytes),
            # The package's own dequantization, as f32 bit patterns.
            "dequant_bits": gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1).view(np.uint32).tolist(),
        }
        for t in r.tensors
    ]
    sizes = {T(k).name: {"id": int(k), "block": v[0], "bytes": v[1]} for k, v in gguf.GGML_QUANT_SIZES.items()}
    (OUT / "pygguf.json").write_text(
        json.dumps({"fields": fields, "tensors": tensors, "type_sizes": sizes, "file_len": path.stat().st_size}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
