//! The math grader against a table of equivalence / non-equivalence cases and hacking attempts.

use verity_verifiers::math;
use verity_verifiers::spec::MathExtract;

#[test]
fn table_of_at_least_200_cases() {
    let cases = math::cases::table();
    assert!(cases.len() >= 200, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let result = math::grade(&case.completion(), &case.reference, MathExtract::Auto);
        assert!(result.error.is_none());
        if (result.score == 1.0) != case.expected {
            failures.push(format!("{case:?} -> {} ({})", result.score, result.reason));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn chapter_example() {
    let resp = "<think>1/2 + 1/4 = 3/4</think> The answer is \\boxed{\\frac{3}{4}}";
    assert_eq!(math::grade(resp, "0.75", MathExtract::Auto).score, 1.0);
    assert_eq!(math::grade(resp, "0.75", MathExtract::Boxed).score, 1.0);
}

#[test]
fn several_different_answers_score_zero() {
    for resp in [
        "\\boxed{3} \\boxed{4}",
        "\\boxed{4} then \\boxed{3}",
        "<answer>3</answer> <answer>4</answer>",
    ] {
        let r = math::grade(resp, "3", MathExtract::Auto);
        assert_eq!(r.score, 0.0, "{resp}");
        assert!(r.reason.contains("different"), "{}", r.reason);
    }
    // the same answer twice is fine
    assert_eq!(math::grade("\\boxed{3} so \\boxed{3.0}", "3", MathExtract::Auto).score, 1.0);
}

#[test]
fn only_the_extraction_mode_counts() {
    // a number in the text does not count when a box is required
    assert_eq!(math::grade("it is 3", "3", MathExtract::Boxed).score, 0.0);
    assert_eq!(math::grade("\\boxed{3}", "3", MathExtract::AnswerTag).score, 0.0);
    assert_eq!(math::grade("3 apples then 4", "4", MathExtract::LastNumber).score, 1.0);
    assert_eq!(math::grade("4 apples then 3", "4", MathExtract::LastNumber).score, 0.0);
}

#[test]
fn hostile_answers_are_bounded() {
    let long = format!("\\boxed{{{}}}", "1+".repeat(5000) + "1");
    assert_eq!(math::grade(&long, "1", MathExtract::Auto).score, 0.0);
    let tower = "\\boxed{2^{2^{2^{2^{2^{2^{2^{2}}}}}}}}";
    assert_eq!(math::grade(tower, "1", MathExtract::Auto).score, 0.0);
    let nested = format!("\\boxed{{{}x{}}}", "\\sqrt{".repeat(300), "}".repeat(300));
    assert_eq!(math::grade(&nested, "1", MathExtract::Auto).score, 0.0);
    let many_vars = "\\boxed{a+b+c+d+f+g+h+k+m+n+p+q}";
    assert_eq!(math::grade(many_vars, "1", MathExtract::Auto).score, 0.0);
    let big_fact = "\\boxed{(10^{6})!}";
    assert_eq!(math::grade(big_fact, "1", MathExtract::Auto).score, 0.0);
}

#[test]
fn longest_accepted_answers_fit_a_small_stack() {
    let long_sum = format!("\\boxed{{{}1}}", "1+".repeat(495));
    let long_product = format!("\\boxed{{{}}}", "x".repeat(990));
    let nested = format!("\\boxed{{{}1{}}}", "(".repeat(95), ")".repeat(95));
    let shallow = format!("\\boxed{{{}1{}}}", "(".repeat(20), ")".repeat(20));
    let handle = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || {
            for text in [long_sum, long_product, nested] {
                let r = math::grade(&text, "496", MathExtract::Auto);
                assert!(r.error.is_none());
            }
            let moderate = format!("\\boxed{{{}1}}", "1+".repeat(99));
            assert_eq!(math::grade(&shallow, "1", MathExtract::Auto).score, 1.0);
            math::grade(&moderate, "100", MathExtract::Auto).score
        })
        .unwrap();
    assert_eq!(handle.join().expect("no stack overflow"), 1.0);
}

#[test]
fn text_with_multibyte_characters_never_panics() {
    // The panic that found this: a model wrote "ARABA èi" and the extractor sliced inside 'è'.
    let seen =
        "AWAAL-S iReal Depreciacionen ResumenARABA èi Unamado A Naruto\n\nGrace has 42 stickers.";
    assert_eq!(math::grade(seen, "42", MathExtract::Auto).score, 1.0);
    // Random text over pieces that mix LaTeX syntax with 2-, 3- and 4-byte characters.
    let pieces = [
        "\\boxed{",
        "\\fbox",
        "}",
        "{",
        "\\",
        "è",
        "数",
        "🙂",
        "ß",
        " ",
        "7",
        "1/2",
        "$",
        "<answer>",
        "</answer>",
        "\\text{",
        "\\frac{",
        "the answer is ",
        ",",
        ".",
        "x",
        "=",
        "\\sqrt{",
        "^",
        "-",
        "é\\boxed{é}",
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..5000 {
        let mut text = String::new();
        for _ in 0..(state % 24) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            text.push_str(pieces[(state % pieces.len() as u64) as usize]);
        }
        for extract in
            [MathExtract::Auto, MathExtract::Boxed, MathExtract::AnswerTag, MathExtract::LastNumber]
        {
            let result = std::panic::catch_unwind(|| math::grade(&text, "7", extract));
            assert!(result.is_ok(), "grading panicked on {text:?}");
        }
    }
}

fn score(completion: &str, reference: &str) -> f64 {
    math::grade(completion, reference, MathExtract::Auto).score
}

#[test]
fn decimal_approximations_of_exact_values_to_the_given_precision() {
    for (answer, reference) in [
        ("0.333333", r"\frac{1}{3}"),
        ("0.3333", r"\frac{1}{3}"),
        ("0.6667", r"\frac{2}{3}"),
        ("0.6666", r"\frac{2}{3}"),
        ("3.14159", r"\pi"),
        ("3.1416", r"\pi"),
        ("1.41421", r"\sqrt{2}"),
        ("6.2832", r"2\pi"),
        ("-0.3333", r"-\frac{1}{3}"),
    ] {
        let r = math::grade(&format!("\\boxed{{{answer}}}"), reference, MathExtract::Auto);
        assert_eq!(r.score, 1.0, "{answer} against {reference}: {}", r.reason);
        assert!(r.reason.contains("decimal places"), "{}", r.reason);
    }
    for (answer, reference) in [
        ("0.3", r"\frac{1}{3}"),
        ("0.33", r"\frac{1}{3}"),
        ("0.333", r"\frac{1}{3}"),
        ("3.14", r"\pi"),
        ("1.41", r"\sqrt{2}"),
        ("0.3334", r"\frac{1}{3}"),
        ("3.1415", r"-\pi"),
        ("3.14160", r"\pi"),
        ("1.4143", r"\sqrt{2}"),
        ("0.7499", "0.75"),
        ("0.1249", r"\frac{1}{8}"),
    ] {
        assert_eq!(
            score(&format!("\\boxed{{{answer}}}"), reference),
            0.0,
            "{answer} vs {reference}"
        );
    }
}

#[test]
fn commutative_sums_and_products() {
    for (answer, reference) in [
        (r"\pi \cdot 2", r"2\pi"),
        (r"\pi*2", r"2\pi"),
        (r"2 \times \pi", r"\pi \cdot 2"),
        ("1+x", "x+1"),
        ("2ba", "2ab"),
        ("a b", "b a"),
        (r"c \cdot a b", "abc+0"),
        ("yx+1", "1+xy"),
        (r"-b + a", "a - b"),
        // not evaluable at any sample point, still equal up to the order of operands
        (r"1+\sqrt{x-100}", r"\sqrt{x-100}+1"),
        ("a+b+c+d+f+g+h+k+m", "m+k+h+g+f+d+c+b+a"),
    ] {
        assert_eq!(
            score(&format!("\\boxed{{{answer}}}"), reference),
            1.0,
            "{answer} vs {reference}"
        );
    }
    for (answer, reference) in
        [("1-x", "x-1"), (r"\pi - 2", r"2 - \pi"), ("a+b+c+d+f+g+h+k+m", "a+b")]
    {
        assert_eq!(
            score(&format!("\\boxed{{{answer}}}"), reference),
            0.0,
            "{answer} vs {reference}"
        );
    }
}

#[test]
fn nested_boxes_resolve_to_the_inner_answer() {
    for completion in [
        r"\boxed{\boxed{5}}",
        r"\boxed{\text{\boxed{5}}}",
        r"\boxed{\fbox{$5$}}",
        r"so $\boxed{ \boxed{\boxed{5}} }$",
    ] {
        assert_eq!(score(completion, "5"), 1.0, "{completion}");
        assert_eq!(math::grade(completion, "5", MathExtract::Boxed).score, 1.0, "{completion}");
    }
    assert_eq!(score(r"\boxed{\boxed{6}}", "5"), 0.0);
    assert_eq!(score(r"\boxed{\boxed{5}} then \boxed{6}", "5"), 0.0);
    // a reference written in nested boxes is read the same way
    assert_eq!(score(r"\boxed{5}", r"\boxed{\boxed{5}}"), 1.0);
}

#[test]
fn an_unterminated_box_scores_zero() {
    for mode in [MathExtract::Auto, MathExtract::Boxed] {
        for completion in [
            r"The answer is \boxed{42",
            r"<answer>\boxed{42</answer>",
            r"\boxed{42} and later \boxed{42",
            r"\boxed{\boxed{42}",
        ] {
            let r = math::grade(completion, "42", mode);
            assert_eq!(r.score, 0.0, "{completion} ({mode:?})");
            assert!(r.reason.contains("unterminated"), "{}", r.reason);
        }
    }
    // answer_tag mode reads boxes inside tags only
    let r = math::grade(r"<answer>\boxed{42</answer>", "42", MathExtract::AnswerTag);
    assert_eq!((r.score, r.reason.contains("unterminated")), (0.0, true), "{}", r.reason);
    assert_eq!(
        math::grade(r"\boxed{4 <answer>42</answer>", "42", MathExtract::AnswerTag).score,
        1.0
    );
    // last_number mode reads numbers only, as documented
    assert_eq!(math::grade(r"\boxed{42", "42", MathExtract::LastNumber).score, 1.0);
}

#[test]
fn strict_boxed_mode_requires_a_box() {
    for completion in ["The answer is 42", "<answer>42</answer>", "42", "final answer: 42"] {
        let strict = math::grade(completion, "42", MathExtract::Boxed);
        assert_eq!(strict.score, 0.0, "{completion}");
        assert_eq!(strict.reason, "no final answer found");
        // the default (auto) accepts each of them
        assert_eq!(score(completion, "42"), 1.0, "{completion}");
    }
    assert_eq!(math::grade(r"\boxed{42}", "42", MathExtract::Boxed).score, 1.0);
    // the default mode is auto
    let spec: verity_verifiers::spec::MathSpec =
        serde_json::from_str(r#"{"reference": "{{item.reference_answer}}"}"#).unwrap();
    assert_eq!(spec.extract, MathExtract::Auto);
}
