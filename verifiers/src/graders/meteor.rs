//! METEOR (Banerjee & Lavie, 2005) as NLTK's `meteor_score` computes it, with exact and Porter
//! stem matching (NLTK's third stage, WordNet synonyms, is not done: no WordNet ships with
//! Verity). Parameters are NLTK's defaults: α = 0.9, β = 3, γ = 0.5.

use std::collections::HashMap;

use rust_stemmers::{Algorithm, Stemmer};

/// Weight of precision against recall in the harmonic mean.
const ALPHA: f64 = 0.9;
/// Exponent of the fragmentation penalty.
const BETA: f64 = 3.0;
/// Largest fragmentation penalty.
const GAMMA: f64 = 0.5;

/// METEOR of `hypothesis` against `reference` (lower-cased tokens), in [0, 1].
///
/// Alignment as NLTK's: exact matches first, then stem matches among the words left; in each
/// stage hypothesis words are taken from the last one back, each matching the last unmatched
/// reference word equal to it. Hashing each stage makes the whole computation linear in the
/// number of tokens, so no input cap is needed.
pub fn meteor(hypothesis: &[String], reference: &[String]) -> f64 {
    let (hyp_len, ref_len) = (hypothesis.len(), reference.len());
    if hyp_len == 0 || ref_len == 0 {
        return 0.0;
    }
    let hyp: Vec<(usize, &str)> = hypothesis.iter().map(String::as_str).enumerate().collect();
    let refr: Vec<(usize, &str)> = reference.iter().map(String::as_str).enumerate().collect();
    let (mut matches, hyp, refr) = align(hyp, refr);
    let stemmer = Stemmer::create(Algorithm::English);
    let stem = |words: Vec<(usize, &str)>| -> Vec<(usize, String)> {
        words.into_iter().map(|(i, w)| (i, stemmer.stem(w).into_owned())).collect()
    };
    let (hyp_stems, ref_stems) = (stem(hyp), stem(refr));
    let (stem_matches, _, _) = align(
        hyp_stems.iter().map(|(i, s)| (*i, s.as_str())).collect(),
        ref_stems.iter().map(|(i, s)| (*i, s.as_str())).collect(),
    );
    matches.extend(stem_matches);
    if matches.is_empty() {
        return 0.0;
    }
    matches.sort_unstable();
    let m = matches.len() as f64;
    let precision = m / hyp_len as f64;
    let recall = m / ref_len as f64;
    let fmean = precision * recall / (ALPHA * precision + (1.0 - ALPHA) * recall);
    let fragmentation = chunks(&matches) as f64 / m;
    let penalty = GAMMA * fragmentation.powf(BETA);
    ((1.0 - penalty) * fmean).clamp(0.0, 1.0)
}

/// One matching stage: the (hypothesis, reference) index pairs, and the words of each side
/// left unmatched (in order).
type Aligned<'a> = (Vec<(usize, usize)>, Vec<(usize, &'a str)>, Vec<(usize, &'a str)>);

/// Matches equal words: each hypothesis word, from the last back, takes the last unmatched
/// reference word equal to it (NLTK's `_match_enums` without its quadratic scan).
fn align<'a>(hyp: Vec<(usize, &'a str)>, refr: Vec<(usize, &'a str)>) -> Aligned<'a> {
    // for each word, the positions in `refr` still free, ascending: the last is taken first
    let mut free: HashMap<&str, Vec<usize>> = HashMap::new();
    for (k, (_, word)) in refr.iter().enumerate() {
        free.entry(*word).or_default().push(k);
    }
    let mut ref_taken = vec![false; refr.len()];
    let mut hyp_left = Vec::with_capacity(hyp.len());
    let mut matches = Vec::new();
    for &(i, word) in hyp.iter().rev() {
        match free.get_mut(word).and_then(Vec::pop) {
            Some(k) => {
                ref_taken[k] = true;
                matches.push((i, refr[k].0));
            }
            None => hyp_left.push((i, word)),
        }
    }
    hyp_left.reverse();
    let ref_left =
        refr.into_iter().zip(ref_taken).filter(|(_, taken)| !taken).map(|(w, _)| w).collect();
    (matches, hyp_left, ref_left)
}

/// Chunks of matches sorted by hypothesis position: runs adjacent on both sides.
fn chunks(matches: &[(usize, usize)]) -> usize {
    1 + matches.windows(2).filter(|w| !(w[1].0 == w[0].0 + 1 && w[1].1 == w[0].1 + 1)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_lowercase).collect()
    }

    fn score(hypothesis: &str, reference: &str) -> f64 {
        meteor(&words(hypothesis), &words(reference))
    }

    /// (hypothesis, reference, NLTK's score) from NLTK 3.10.4's
    /// `meteor_score([ref.split()], hyp.split(), wordnet=NoSynonyms())`: its defaults (alpha=0.9,
    /// beta=3, gamma=0.5, PorterStemmer) with WordNet matching disabled (`synsets()` returns
    /// `[]`). Printed by scripts/reference/meteor_nltk.py; for these pairs NLTK gives the same
    /// score with its Porter stemmer and with the Snowball English one Verity uses.
    const NLTK: &[(&str, &str, f64)] = &[
        ("the cat sat on the mat", "the cat is sitting on the mat", 0.7014492753623188),
        (
            "it is a guide to action which ensures that the military always obeys the commands of the party",
            "it is a guide to action that ensures that the military will forever heed party commands",
            0.6944444444444445,
        ),
        (
            "the quick brown fox jumps over the lazy dog",
            "the lazy dog is jumped over by a quick brown fox",
            0.7212094907407407,
        ),
        ("a b c d e f", "f e d c b a", 0.5),
        ("players played the games", "the player plays a game", 0.6441326530612245),
        ("completely unrelated words here", "nothing in common at all", 0.0),
        ("connection connected connecting", "connect connects connections", 0.9814814814814815),
        ("the the the", "the cat", 0.2380952380952381),
    ];

    #[test]
    fn matches_nltk_without_synonyms() {
        for (hypothesis, reference, expected) in NLTK {
            let got = score(hypothesis, reference);
            assert!((got - expected).abs() < 1e-12, "{hypothesis:?} / {reference:?}: {got}");
        }
    }

    #[test]
    fn stemmer_is_snowball_english() {
        // Porter stems "quickly" to "quickli", Snowball (Porter2) to "quick": NLTK scores this
        // pair 0.7311475409836065 with PorterStemmer and 0.9653916211293262 with
        // SnowballStemmer("english"), the stemmer Verity uses (same script)
        let got = score("he was running quickly to the stations", "he runs quick to the station");
        assert!((got - 0.9653916211293262).abs() < 1e-12, "{got}");
    }

    #[test]
    fn identical_empty_and_disjoint() {
        // one chunk of n matches: (1 - 0.5 (1/n)^3)
        let same = score("the cat sat on the mat", "the cat sat on the mat");
        assert!((same - (1.0 - 0.5 / 216.0)).abs() < 1e-12, "{same}");
        assert_eq!(score("", "a b"), 0.0);
        assert_eq!(score("a b", ""), 0.0);
        assert_eq!(score("alpha beta", "gamma delta"), 0.0);
    }

    #[test]
    fn stems_match_after_exact_words() {
        // "running" and "runs" share the stem "run"; exact matches are taken first
        let stem = score("he runs fast", "he running fast");
        let exact = score("he run fast", "he run fast");
        assert!((stem - exact).abs() < 1e-12, "{stem} {exact}");
    }

    #[test]
    fn long_inputs_are_linear() {
        let a: Vec<String> = (0..200_000).map(|i| format!("w{}", i % 997)).collect();
        let b: Vec<String> = (0..200_000).map(|i| format!("w{}", i % 991)).collect();
        let started = std::time::Instant::now();
        let value = meteor(&a, &b);
        assert!((0.0..=1.0).contains(&value), "{value}");
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
    }
}
