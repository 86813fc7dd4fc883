"""Checks a GGUF export with llama.cpp's own Python package (`gguf`, maintained in the llama.cpp
repository): reads the file with its GGUFReader, dequantises every tensor with its decoders and
compares it with the HF weights it came from (read here from the safetensors directly, renamed
and q/k-permuted by this script's own table, not Verity's), and re-quantises the source with its
quantisers where it has one (f16, q8_0, q5_0) to compare bytes.

usage: gguf_check.py FILE.gguf HF_FOLDER  -> prints one JSON report on stdout
"""

import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}
REQUANTISABLE = {Q.F16, Q.Q8_0, Q.Q5_0}


def safetensors(folder):
    out = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        n = int.from_bytes(bytes(raw[:8]), "little")
        header = json.loads(bytes(raw[8:8 + n]))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            buf = raw[8 + n + a:8 + n + b]
            if info["dtype"] == "BF16":
                arr = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                arr = np.frombuffer(buf, {"F32": np.float32, "F16": np.float16}[info["dtype"]])
            out[name] = arr.astype(np.float32).reshape(info["shape"])
    return out


def gguf_name(hf):
    if hf in TOP:
        return TOP[hf]
    parts = hf.split(".")
    layer, module, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
    return f"blk.{layer}.{LAYER[module]}.{kind}"


def permute(w, heads):
    # convert_hf_to_gguf.py's LlamaModel.permute
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    if len(f.types) == 1 and f.types[0].name == "STRING":
        return bytes(f.parts[f.data[0]]).decode()
    if f.types and f.types[0].name == "ARRAY":
        return len(f.data)
    return f.parts[f.data[0]].tolist()[0]


def main():
    reader = GGUFReader(sys.argv[1])
    arch = field(reader, "general.architecture")
    heads = field(reader, f"{arch}.attention.head_count")
    kv_heads = field(reader, f"{arch}.attention.head_count_kv")
    source = {gguf_name(k): v for k, v in safetensors(sys.argv[2]).items()}
    if arch == "llama":
        for name in list(source):
            if ".attn_q." in name:
                source[name] = permute(source[name], heads)
            elif ".attn_k." in name:
                source[name] = permute(source[name], kv_heads)
    keys = ["general.architecture", "general.name", "general.file_type", "tokenizer.ggml.model",
            "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
            "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
            "tokenizer.chat_template"] + [f"{arch}.{k}" for k in (
                "context_length", "embedding_length", "block_count", "feed_forward_length",
                "attention.head_count", "attention.head_count_kv", "rope.freq_base",
                "attention.layer_norm_rms_epsilon")]
    report = {"metadata": {k: field(reader, k) for k in keys}, "tensors": {},
              "missing": sorted(set(source) - {t.name for t in reader.tensors})}
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]
        values = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        entry = {"type": t.tensor_type.name, "shape": shape}
        src = source.get(t.name)
        if src is not None:
            err = values - src
            entry["rel_rms_err"] = float(np.sqrt((err ** 2).mean() / max((src ** 2).mean(), 1e-30)))
            if t.tensor_type in REQUANTISABLE:
                again = quantize(src, t.tensor_type)
                entry["same_bytes_as_gguf_py"] = bool(np.array_equal(
                    np.asarray(again).view(np.uint8).ravel(), np.asarray(t.data).view(np.uint8).ravel()))
        report["tensors"][t.name] = entry
    print(json.dumps(report))


if __name__ == "__main__":
    main()
