//! Tensor names: llama.cpp's GGUF names against HF's, one table for both directions.

/// Whole-model tensors: `(GGUF name, HF name)`.
const MODEL_TENSORS: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// Modules of decoder layer N: `(blk.N.{GGUF}, model.layers.N.{HF})`.
const LAYER_MODULES: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// Maps a llama.cpp tensor name to its HF name.
pub fn hf_name(gguf: &str) -> Option<String> {
    if let Some((_, hf)) = MODEL_TENSORS.iter().find(|(g, _)| *g == gguf) {
        return Some((*hf).to_string());
    }
    let (layer, module, kind) = split_layer(gguf.strip_prefix("blk.")?)?;
    let (_, hf) = LAYER_MODULES.iter().find(|(g, _)| *g == module)?;
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// Maps an HF tensor name to llama.cpp's name.
pub fn gguf_name(hf: &str) -> Option<String> {
    if let Some((gguf, _)) = MODEL_TENSORS.iter().find(|(_, h)| *h == hf) {
        return Some((*gguf).to_string());
    }
    let (layer, module, kind) = split_layer(hf.strip_prefix("model.layers.")?)?;
    let (gguf, _) = LAYER_MODULES.iter().find(|(_, h)| *h == module)?;
    Some(format!("blk.{layer}.{gguf}.{kind}"))
}

/// `N.module.path.kind` → `(N, "module.path", "kind")`.
fn split_layer(rest: &str) -> Option<(usize, &str, &str)> {
    let (layer, rest) = rest.split_once('.')?;
    let (module, kind) = rest.rsplit_once('.')?;
    Some((layer.parse().ok()?, module, kind))
}

/// The decoder layer a GGUF tensor belongs to (`blk.N.…`), if any.
pub fn layer_of(gguf: &str) -> Option<usize> {
    split_layer(gguf.strip_prefix("blk.")?).map(|(layer, _, _)| layer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways() {
        for (gguf, hf) in [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output.weight", "lm_head.weight"),
            ("blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias"),
            ("blk.11.ffn_down.weight", "model.layers.11.mlp.down_proj.weight"),
            ("blk.0.attn_k_norm.weight", "model.layers.0.self_attn.k_norm.weight"),
        ] {
            assert_eq!(hf_name(gguf).as_deref(), Some(hf));
            assert_eq!(gguf_name(hf).as_deref(), Some(gguf));
        }
        assert_eq!(hf_name("rope_freqs.weight"), None);
        assert_eq!(gguf_name("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(layer_of("blk.7.attn_v.weight"), Some(7));
        assert_eq!(layer_of("output.weight"), None);
    }
}
