"""Reference fixtures for each decoder family Verity trains, made by transformers itself.

For each family: a tiny model with random weights built from the family's own config class
(`AutoModelForCausalLM.from_config`), saved as an HF folder (config.json + f16 safetensors),
and `reference.json` with what transformers computes from it in f64 with eager attention:
the logits of two sequences, greedy tokens after a prompt, and the gradients of the
sequence's log-likelihood. `worker/tests/families.rs` checks Verity against them.

Regenerate (needs torch and transformers; not needed to run the tests):
    python3 -m venv /tmp/peer && /tmp/peer/bin/pip install torch transformers safetensors
    /tmp/peer/bin/python scripts/reference/family_fixtures.py worker/tests/data/families
"""

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

# The shapes of each family's real config, shrunk: what makes the family itself is kept
# (q/k/v bias, q/k norms, NoPE layers, a sliding window shorter than the test sequences,
# tied or separate LM head, RoPE base and scaling).
SMALL = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
FAMILIES = {
    "llama": dict(
        head_dim=8, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=64),
    ),
    "mistral": dict(head_dim=8, rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=5,
                    tie_word_embeddings=False),
    "qwen2": dict(rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True),
    "qwen3": dict(head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True),
    "olmo2": dict(rms_norm_eps=1e-6, rope_theta=500000.0, tie_word_embeddings=False),
    # Four layers and transformers' default NoPE interval: layer 3 has no RoPE.
    "smollm3": dict(num_hidden_layers=4, rms_norm_eps=1e-6, rope_theta=2e6, 
                    tie_word_embeddings=True),
    # Gemma 3 1B's layout shrunk: local layers with a window shorter than the test sequence and
    # their own RoPE base around a global one, query_pre_attn_scalar apart from head_dim.
    "gemma3_text": dict(num_hidden_layers=3, head_dim=8, rms_norm_eps=1e-6, sliding_window=5,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        query_pre_attn_scalar=16, tie_word_embeddings=True,
                        rope_parameters={
                            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                        }),
    # Phi-4-mini's layout shrunk: fused projections, 3/4 of each head rotated, LongRoPE whose
    # original context (4) the sequences pass (so the long factors are used; greedy decoding
    # starts below it on the short ones), a window larger than any sequence.
    "phi3": dict(partial_rotary_factor=0.75, original_max_position_embeddings=4,
                 sliding_window=262144, tie_word_embeddings=True,
                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                  "short_factor": [1.0, 1.5, 2.0],
                                  "long_factor": [2.0, 4.0, 8.0],
                                  "original_max_position_embeddings": 4,
                                  "partial_rotary_factor": 0.75}),
}
SEQS = [
    [5, 17, 42, 3, 88, 61, 29, 7, 70, 14, 33, 51],
    [9, 2, 64, 31, 77, 12, 45],
]
PROMPT_LEN = 4
NEW_TOKENS = 8


def randomize(model, gen, family):
    """Weights with enough spread that logits differ clearly (HF's init gives near-uniform ones)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() == 1 and "norm" in name:
                # Gemma stores norm weights as offsets from one (it scales by 1 + w).
                p.copy_((0.0 if family.startswith("gemma") else 1.0) + 0.2 * noise)
            elif p.dim() == 1:
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5 * (3.0 if "embed" in name else 1.0))
            # The values Verity will read back from the f16 file.
            p.copy_(p.half().float())


def main(out_dir):
    out_dir = Path(out_dir)
    for family, extra in FAMILIES.items():
        gen = torch.Generator().manual_seed(0)
        cfg = AutoConfig.for_model(family, **{**SMALL, **extra})
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
        randomize(model, gen, family)
        model.eval()
        folder = out_dir / family
        folder.mkdir(parents=True, exist_ok=True)
        model.half().save_pretrained(folder, safe_serialization=True)
        # The reference is computed in f64: the exact values that Verity's f32 and
        # transformers' own f32 both approximate (they differ from it by 1e-5 to 1e-3).
        model.double()
        ref = {"transformers": transformers.__version__, "torch": torch.__version__,
               "sequences": SEQS, "logits": []}
        with torch.no_grad():
            for seq in SEQS:
                logits = model(torch.tensor([seq])).logits[0]
                ref["logits"].append([[round(x, 6) for x in row] for row in logits.tolist()])
            prompt = torch.tensor([SEQS[0][:PROMPT_LEN]])
            out = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=None, pad_token_id=0, min_new_tokens=NEW_TOKENS)
            ref["prompt"] = SEQS[0][:PROMPT_LEN]
            ref["greedy"] = out[0, PROMPT_LEN:].tolist()
        # Gradient of the log-likelihood of SEQS[0] (tokens 1.. given what precedes them).
        model.zero_grad()
        seq = torch.tensor([SEQS[0]])
        logp = torch.log_softmax(model(seq).logits[0, :-1], dim=-1)
        logp.gather(1, seq[0, 1:, None]).sum().backward()
        last = cfg.num_hidden_layers - 1
        wanted = [
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.qkv_proj.weight",
            "model.layers.0.mlp.gate_up_proj.weight",
            f"model.layers.{last}.mlp.down_proj.weight",
            "model.layers.0.post_attention_layernorm.weight",
            "model.layers.0.post_feedforward_layernorm.weight",
            "model.layers.0.pre_feedforward_layernorm.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.self_attn.q_norm.weight",
            "model.layers.0.self_attn.q_proj.bias",
            "model.norm.weight",
        ]
        params = dict(model.named_parameters())
        ref["gradients"] = {
            n: [round(x, 7) for x in params[n].grad.flatten().tolist()]
            for n in wanted if n in params
        }
        (folder / "reference.json").write_text(json.dumps(ref))
        print(family, "greedy", ref["greedy"], "grads", list(ref["gradients"]))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "worker/tests/data/families")
