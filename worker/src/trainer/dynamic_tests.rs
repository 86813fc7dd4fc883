//! Dynamic sampling as one continuously batched stream, on a tiny model: every kept group has
//! reward contrast, each dropped group is replaced by the next prompt of the data order, and the
//! first `batch_size` prompts of the stream sample exactly what a plain step's draw samples.

use super::Trainer;
use crate::grpo::advantages::group_has_contrast as has_contrast;
use verity_core::spec::Hyperparameters;

const BATCH: usize = 3;
const CAP: usize = 12;

fn trainer(dynamic_sampling: bool) -> Trainer {
    let hp = Hyperparameters {
        batch_size: Some(BATCH),
        group_size: Some(2),
        max_completion_tokens: Some(3),
        dynamic_sampling,
        max_groups_drawn: Some(CAP),
        temperature: 1.0,
        // With this seed the first three prompts' groups of 2 have contrast, none, contrast.
        seed: Some(3),
        ..Hyperparameters::default()
    };
    hp.validate("hyperparameters").unwrap();
    super::testing::tiny_rollout_trainer(hp, 8, 5).unwrap()
}

#[test]
fn dropped_groups_are_replaced_within_one_stream() {
    let plain = trainer(false).draw_groups(1).unwrap();
    let mut t = trainer(true);
    let mut order = t.order.clone();
    let drawn = t.draw_groups(1).unwrap();
    let contrasting = plain.groups.iter().filter(|g| has_contrast(&g.rewards())).count();
    assert!(contrasting < BATCH, "the first prompts must include a group without contrast");
    assert!(contrasting > 0, "and a group with contrast");
    assert!(drawn.groups_drawn > BATCH, "dropped groups were replaced: {}", drawn.groups_drawn);
    assert!(drawn.groups_drawn <= CAP);
    assert_eq!(drawn.groups.len(), BATCH, "the batch filled before the cap");
    assert!(drawn.groups.iter().all(|g| has_contrast(&g.rewards())));
    // The data order advanced by exactly the groups drawn, and they came from it.
    let stream: Vec<usize> = (0..drawn.groups_drawn).map(|_| order.next_index()).collect();
    assert_eq!(t.order.cursor(), order.cursor());
    assert!(drawn.groups.iter().all(|g| stream.contains(&g.example)));
    // The plain draw's groups with contrast were kept, sampled exactly as the plain step did
    // (the same stream seed and index), and the others were dropped.
    for g in plain.groups.iter().filter(|g| has_contrast(&g.rewards())) {
        let kept = drawn.groups.iter().find(|k| k.example == g.example);
        let kept = kept.unwrap_or_else(|| panic!("group of example {} was dropped", g.example));
        assert_eq!(kept.completions, g.completions, "prompt index and tokens");
        assert_eq!(kept.grades, g.grades);
    }
}
