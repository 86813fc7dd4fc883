"""Reference sentence embeddings for worker/tests/embedding.rs (run once, by hand; no test needs it).

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install numpy safetensors tokenizers
    scripts/fetch-embedding-model.sh
    /tmp/ref/bin/python scripts/reference/minilm_numpy.py ~/.cache/verity/models/all-minilm-l6-v2

An independent NumPy (float64) implementation of sentence-transformers' all-MiniLM-L6-v2
pipeline: BertModel (post-LN encoder, exact erf GELU) over the `tokenizers` encoding (max 256
tokens), mean pooling over the attention mask, L2 normalisation. Prints the first 8 components
of each sentence's embedding and the cosine of each pair.
"""

import json, math, sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

SENTENCES = [
    "The cat sits on the mat.",
    "A cat is sitting on a rug.",
    "Stock markets fell sharply on Monday.",
    "The answer is 42",
    "This is an example sentence",
    # 300 words: longer than the 256 tokens the model reads, so it is truncated (keeping [SEP])
    " ".join(["apples and oranges"] * 100),
]

folder = sys.argv[1]
cfg = json.load(open(f"{folder}/config.json"))
w = {k.removeprefix("bert."): v.astype(np.float64) for k, v in load_file(f"{folder}/model.safetensors").items()}
tok = Tokenizer.from_file(f"{folder}/tokenizer.json")
tok.no_padding()
tok.no_truncation()
H, heads, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
erf = np.vectorize(math.erf)


def layer_norm(x, p):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]


def linear(x, p):
    return x @ w[p + ".weight"].T + w[p + ".bias"]


def embed(text):
    ids = tok.encode(text).ids
    if len(ids) > 256:
        ids = ids[:255] + ids[-1:]
    n = len(ids)
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] \
        + w["embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, "embeddings.LayerNorm")
    d = H // heads
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        q, k, v = (linear(x, f"{p}.attention.self.{m}").reshape(n, heads, d).transpose(1, 0, 2)
                   for m in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, H)
        x = layer_norm(linear(a, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
        h = linear(x, f"{p}.intermediate.dense")
        h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
        x = layer_norm(linear(h, f"{p}.output.dense") + x, f"{p}.output.LayerNorm")
    m = x.mean(0)
    return m / np.linalg.norm(m)


vectors = [embed(s) for s in SENTENCES]
for s, v in zip(SENTENCES, vectors):
    print(f'("{s[:60]}", [{", ".join(f"{x:.6f}" for x in v[:8])}]),')
for i in range(len(SENTENCES)):
    for j in range(i + 1, len(SENTENCES)):
        print(f"cosine({i}, {j}) = {float(vectors[i] @ vectors[j]):.6f}")
