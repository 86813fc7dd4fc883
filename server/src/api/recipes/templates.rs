//! The recipe templates the dashboard's "new recipe" page and `docs/recipes.md` start from:
//! `examples/recipes/*.json`, compiled in.

/// A template: a key, a title for people and the request body (file ids left as
/// `<file id: …>` placeholders to replace).
#[derive(Debug, Clone, Copy)]
pub struct Template {
    /// Short key (`r1`).
    pub key: &'static str,
    /// What it is.
    pub title: &'static str,
    /// The `POST /v1/verity/recipes` body.
    pub body: &'static str,
}

/// Every template, the R1 recipe first.
pub const TEMPLATES: [Template; 3] = [
    Template {
        key: "r1",
        title: "R1: cold-start SFT → RL → rejection sampling → SFT of a fresh base → evaluation",
        body: include_str!("../../../../examples/recipes/r1.json"),
    },
    Template {
        key: "sft-then-rl",
        title: "SFT → RL → evaluation",
        body: include_str!("../../../../examples/recipes/sft-then-rl.json"),
    },
    Template {
        key: "rl-then-distill",
        title: "RL → rejection sampling → SFT of a fresh base → evaluation",
        body: include_str!("../../../../examples/recipes/rl-then-distill.json"),
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use verity_core::recipes::RecipeSpec;

    #[test]
    fn every_template_is_a_recipe_whose_references_check() {
        for template in TEMPLATES {
            let body: serde_json::Value = serde_json::from_str(template.body).unwrap();
            let seed = body["seed"].as_i64();
            let spec = RecipeSpec::parse(&body["stages"], seed, body.get("guard"))
                .unwrap_or_else(|e| panic!("{}: {e}", template.key));
            assert!(spec.stages.len() >= 3, "{}", template.key);
            assert_eq!(spec.first_model().map(|(i, _)| i), Some(0), "{}", template.key);
        }
    }
}
