//! `text_similarity`: the lexical metrics (fuzzy_match, BLEU, GLEU, METEOR, ROUGE-N, ROUGE-L)
//! in [0, 1]; `cosine` needs a model and lives in [`crate::embed`].

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use crate::graders::meteor::meteor;
use crate::spec::SimilarityMetric;

/// Default of [`Limits::fuzzy_chars`]: the characters of each text `fuzzy_match` compares.
pub const MAX_FUZZY_CHARS: usize = 20_000;
/// Default of [`Limits::lcs_tokens`]: the tokens of each text `rouge_l` compares.
pub const MAX_LCS_TOKENS: usize = 10_000;

/// How much of each text the LCS-based (quadratic) metrics compare; the linear metrics (BLEU,
/// GLEU, METEOR, ROUGE-N) always read the whole text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Characters of each text compared by `fuzzy_match`.
    pub fuzzy_chars: usize,
    /// Tokens of each text compared by `rouge_l`.
    pub lcs_tokens: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { fuzzy_chars: MAX_FUZZY_CHARS, lcs_tokens: MAX_LCS_TOKENS }
    }
}

/// A metric value in [0, 1] and, when a text was longer than the metric's limit, the cap applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Similarity {
    /// The metric value, in [0, 1].
    pub value: f64,
    /// `Some` when only the first `limit` units of a text were compared.
    pub capped: Option<Cap>,
}

/// The prefix an over-long input was cut to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// `characters` or `tokens`.
    pub unit: &'static str,
    /// Units of each text compared.
    pub limit: usize,
    /// Units in the candidate text.
    pub candidate_len: usize,
    /// Units in the reference text.
    pub reference_len: usize,
}

impl fmt::Display for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "compared only the first {} {} of each text (input has {}, reference has {})",
            self.limit, self.unit, self.candidate_len, self.reference_len
        )
    }
}

/// The metric value of `candidate` against `reference` with the default [`Limits`]; `None`
/// for `cosine`, which needs an embedding model ([`crate::embed::cosine_similarity`]).
pub fn similarity(
    candidate: &str,
    reference: &str,
    metric: SimilarityMetric,
) -> Option<Similarity> {
    similarity_with(candidate, reference, metric, Limits::default())
}

/// The metric value of `candidate` against `reference` (`None` for `cosine`); the LCS-based
/// metrics compare at most `limits` units of each text, so their work is bounded by
/// `limit · ⌈limit / 64⌉` word steps.
pub fn similarity_with(
    candidate: &str,
    reference: &str,
    metric: SimilarityMetric,
    limits: Limits,
) -> Option<Similarity> {
    let whole = |value| Similarity { value, capped: None };
    Some(match metric {
        SimilarityMetric::Cosine => return None,
        SimilarityMetric::FuzzyMatch => fuzzy_ratio(candidate, reference, limits.fuzzy_chars),
        SimilarityMetric::RougeL => rouge_l(candidate, reference, limits.lcs_tokens),
        linear => {
            let (cand, refr) = (tokens(candidate), tokens(reference));
            whole(match linear {
                SimilarityMetric::Bleu => bleu(&cand, &refr),
                SimilarityMetric::Gleu => gleu(&cand, &refr),
                SimilarityMetric::Meteor => meteor(&cand, &refr),
                SimilarityMetric::Rouge1 => rouge_n(&cand, &refr, 1),
                SimilarityMetric::Rouge2 => rouge_n(&cand, &refr, 2),
                SimilarityMetric::Rouge3 => rouge_n(&cand, &refr, 3),
                SimilarityMetric::Rouge4 => rouge_n(&cand, &refr, 4),
                SimilarityMetric::Rouge5 => rouge_n(&cand, &refr, 5),
                SimilarityMetric::Cosine
                | SimilarityMetric::FuzzyMatch
                | SimilarityMetric::RougeL => unreachable!("handled above"),
            })
        }
    })
}

fn token_iter(text: &str) -> impl Iterator<Item = &str> + Clone {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'').filter(|t| !t.is_empty())
}

fn tokens(text: &str) -> Vec<String> {
    token_iter(text).map(str::to_lowercase).collect()
}

/// The first `limit` units of `a` and `b` and the cap, if either was longer.
fn capped<T>(
    a: impl Iterator<Item = T> + Clone,
    b: impl Iterator<Item = T> + Clone,
    limit: usize,
    unit: &'static str,
) -> (Vec<T>, Vec<T>, Option<Cap>) {
    let (a_head, b_head): (Vec<T>, Vec<T>) =
        (a.clone().take(limit).collect(), b.clone().take(limit).collect());
    // counting the rest is linear; only the prefixes reach the quadratic part
    let cap = if a_head.len() == limit || b_head.len() == limit {
        let (candidate_len, reference_len) = (a.count(), b.count());
        (candidate_len > limit || reference_len > limit).then_some(Cap {
            unit,
            limit,
            candidate_len,
            reference_len,
        })
    } else {
        None
    };
    (a_head, b_head, cap)
}

/// rapidfuzz-style ratio: 1 - indel distance / total length = 2·LCS / (|a| + |b|).
fn fuzzy_ratio(a: &str, b: &str, limit: usize) -> Similarity {
    let (a, b, capped) = capped(a.chars(), b.chars(), limit, "characters");
    let value = if a.is_empty() && b.is_empty() {
        1.0
    } else {
        2.0 * lcs_len(&a, &b) as f64 / (a.len() + b.len()) as f64
    };
    Similarity { value, capped }
}

fn rouge_l(candidate: &str, reference: &str, limit: usize) -> Similarity {
    let (cand, refr, capped) =
        capped(token_iter(candidate), token_iter(reference), limit, "tokens");
    let (cand, refr): (Vec<String>, Vec<String>) = (
        cand.into_iter().map(str::to_lowercase).collect(),
        refr.into_iter().map(str::to_lowercase).collect(),
    );
    let value = if cand.is_empty() && refr.is_empty() {
        1.0
    } else {
        f1(lcs_len(&cand, &refr), cand.len(), refr.len())
    };
    Similarity { value, capped }
}

/// Length of the longest common subsequence, bit-parallel (Allison–Dix, Hyyrö): one pass over
/// the longer sequence, each step `⌈shorter / 64⌉` word operations; memory linear in the shorter.
fn lcs_len<T: Eq + Hash>(a: &[T], b: &[T]) -> usize {
    let (long, short) = if a.len() >= b.len() { (a, b) } else { (b, a) };
    if short.is_empty() {
        return 0;
    }
    let words = short.len().div_ceil(64);
    // for each element of `short`: the (word, bits) where it occurs, in word order
    let mut masks: HashMap<&T, Vec<(usize, u64)>> = HashMap::new();
    for (j, x) in short.iter().enumerate() {
        let (word, bit) = (j / 64, 1u64 << (j % 64));
        let entry = masks.entry(x).or_default();
        match entry.last_mut() {
            Some((last, bits)) if *last == word => *bits |= bit,
            _ => entry.push((word, bit)),
        }
    }
    // a 0 bit in `row` marks a column that ends a match of the LCS so far
    let mut row = vec![u64::MAX; words];
    for x in long {
        let Some(occurrences) = masks.get(x) else { continue };
        let mut next = occurrences.iter().peekable();
        let mut carry = false;
        for (w, v) in row.iter_mut().enumerate() {
            let m = match next.peek() {
                Some(&&(word, bits)) if word == w => {
                    next.next();
                    bits
                }
                _ => 0,
            };
            if m == 0 && !carry {
                continue;
            }
            let u = *v & m;
            let (sum, c1) = v.overflowing_add(u);
            let (sum, c2) = sum.overflowing_add(u64::from(carry));
            carry = c1 || c2;
            *v = sum | (*v & !m);
        }
    }
    let tail = short.len() % 64;
    let ones: usize = row
        .iter()
        .enumerate()
        .map(|(w, v)| {
            let v = if w + 1 == words && tail != 0 { v & ((1u64 << tail) - 1) } else { *v };
            v.count_ones() as usize
        })
        .sum();
    short.len() - ones
}

fn ngram_counts(tokens: &[String], n: usize) -> HashMap<&[String], usize> {
    let mut counts = HashMap::new();
    if tokens.len() >= n {
        for window in tokens.windows(n) {
            *counts.entry(window).or_insert(0) += 1;
        }
    }
    counts
}

/// (clipped matches, candidate n-grams, reference n-grams).
fn overlap(cand: &[String], refr: &[String], n: usize) -> (usize, usize, usize) {
    let c = ngram_counts(cand, n);
    let r = ngram_counts(refr, n);
    let matches = c.iter().map(|(g, k)| (*k).min(r.get(g).copied().unwrap_or(0))).sum();
    (matches, cand.len().saturating_sub(n - 1), refr.len().saturating_sub(n - 1))
}

fn bleu(cand: &[String], refr: &[String]) -> f64 {
    if cand.is_empty() || refr.is_empty() {
        return if cand.is_empty() && refr.is_empty() { 1.0 } else { 0.0 };
    }
    let mut log_sum = 0.0;
    for n in 1..=4 {
        let (m, total, _) = overlap(cand, refr, n);
        // add-one smoothing for n > 1 (Lin & Och), so short sentences do not collapse to 0
        let p = if n == 1 {
            m as f64 / total.max(1) as f64
        } else {
            (m as f64 + 1.0) / (total as f64 + 1.0)
        };
        if p == 0.0 {
            return 0.0;
        }
        log_sum += p.ln() / 4.0;
    }
    let (c, r) = (cand.len() as f64, refr.len() as f64);
    let bp = if c > r { 1.0 } else { (1.0 - r / c).exp() };
    (bp * log_sum.exp()).clamp(0.0, 1.0)
}

fn gleu(cand: &[String], refr: &[String]) -> f64 {
    let (mut m, mut tc, mut tr) = (0, 0, 0);
    for n in 1..=4 {
        let (a, b, c) = overlap(cand, refr, n);
        m += a;
        tc += b;
        tr += c;
    }
    if tc == 0 || tr == 0 {
        return if cand == refr { 1.0 } else { 0.0 };
    }
    (m as f64 / tc as f64).min(m as f64 / tr as f64)
}

fn f1(matches: usize, cand_total: usize, ref_total: usize) -> f64 {
    if matches == 0 || cand_total == 0 || ref_total == 0 {
        return 0.0;
    }
    let p = matches as f64 / cand_total as f64;
    let r = matches as f64 / ref_total as f64;
    2.0 * p * r / (p + r)
}

fn rouge_n(cand: &[String], refr: &[String], n: usize) -> f64 {
    if cand.is_empty() && refr.is_empty() {
        return 1.0;
    }
    let (m, c, r) = overlap(cand, refr, n);
    f1(m, c, r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use SimilarityMetric::*;

    fn value(candidate: &str, reference: &str, metric: SimilarityMetric) -> f64 {
        let result = similarity(candidate, reference, metric).expect("a lexical metric");
        assert_eq!(result.capped, None, "short texts are compared whole");
        result.value
    }

    #[test]
    fn identical_texts_score_one_and_disjoint_zero() {
        for m in [FuzzyMatch, Bleu, Gleu, Meteor, Rouge1, Rouge2, Rouge3, Rouge4, Rouge5, RougeL] {
            let same = value("the cat sat on the mat today", "the cat sat on the mat today", m);
            // METEOR keeps its fragmentation penalty for one chunk: 1 - 0.5 (1/7)^3, as NLTK
            let expected = if m == Meteor { 1.0 - 0.5 / 343.0 } else { 1.0 };
            assert!((same - expected).abs() < 1e-9, "{m:?} {same}");
            assert!(value("alpha beta gamma delta", "one two three four", m) < 0.35, "{m:?}");
        }
    }

    #[test]
    fn known_values() {
        assert!((value("kitten", "sitting", FuzzyMatch) - 2.0 * 4.0 / 13.0).abs() < 1e-9);
        let r1 = value("the cat sat", "the cat ran away", Rouge1);
        // matches 2, p = 2/3, r = 2/4 -> f1 = 4/7
        assert!((r1 - 4.0 / 7.0).abs() < 1e-9);
        let rl = value("a b c d", "a c d e", RougeL);
        assert!((rl - 0.75).abs() < 1e-9);
    }

    /// The textbook O(n·m) dynamic programme, as the oracle of the bit-parallel one.
    fn lcs_table<T: PartialEq>(a: &[T], b: &[T]) -> usize {
        let mut prev = vec![0usize; b.len() + 1];
        let mut cur = vec![0usize; b.len() + 1];
        for x in a {
            for (j, y) in b.iter().enumerate() {
                cur[j + 1] = if x == y { prev[j] + 1 } else { cur[j].max(prev[j + 1]) };
            }
            std::mem::swap(&mut prev, &mut cur);
        }
        prev[b.len()]
    }

    #[test]
    fn bit_parallel_lcs_matches_the_table() {
        // xorshift: deterministic sequences over small alphabets, lengths across word borders
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..300 {
            let (la, lb, alphabet) = (next(200) as usize, next(200) as usize, 1 + next(6));
            let a: Vec<u64> = (0..la).map(|_| next(alphabet)).collect();
            let b: Vec<u64> = (0..lb).map(|_| next(alphabet)).collect();
            assert_eq!(lcs_len(&a, &b), lcs_table(&a, &b), "{a:?} {b:?}");
        }
    }

    #[test]
    fn capped_score_is_the_score_of_the_prefixes() {
        let limits = Limits { fuzzy_chars: 50, lcs_tokens: 8 };
        let (a, b) = (
            "the quick brown fox jumps over the lazy dog ".repeat(5),
            "a quick brown cat jumps over a lazy dog ".repeat(4),
        );
        let fuzzy = similarity_with(&a, &b, FuzzyMatch, limits).expect("lexical");
        let (pa, pb): (String, String) =
            (a.chars().take(50).collect(), b.chars().take(50).collect());
        assert_eq!(
            fuzzy.value,
            similarity_with(&pa, &pb, FuzzyMatch, limits).expect("lexical").value
        );
        let cap = fuzzy.capped.expect("over-long texts are capped");
        assert_eq!(
            (cap.limit, cap.candidate_len, cap.reference_len),
            (50, a.chars().count(), b.chars().count())
        );
        let rouge = similarity_with(&a, &b, RougeL, limits).expect("lexical");
        let first = |t: &str| t.split(' ').take(8).collect::<Vec<_>>().join(" ");
        let uncapped = similarity_with(&first(&a), &first(&b), RougeL, limits).expect("lexical");
        assert_eq!((rouge.value, uncapped.capped), (uncapped.value, None));
        assert_eq!(
            rouge.capped.map(|c| (c.unit, c.limit, c.candidate_len)),
            Some(("tokens", 8, 45))
        );
        // exactly at the limit: nothing was left out
        assert_eq!(similarity_with(&pa, &pb, FuzzyMatch, limits).expect("lexical").capped, None);
    }

    #[test]
    fn long_inputs_are_capped_and_bounded() {
        // 200k characters (40k words) each: the probe's 11-18 s case; the capped, bit-parallel
        // metrics do at most 20k·313 (fuzzy) and 10k·157 (rouge_l) word steps
        let a: String = (0..40_000)
            .map(|i| format!("w{} ", i % 997))
            .collect::<String>()
            .chars()
            .take(200_000)
            .collect();
        let b: String = (0..40_000)
            .map(|i| format!("w{} ", i % 991))
            .collect::<String>()
            .chars()
            .take(200_000)
            .collect();
        let started = std::time::Instant::now();
        for metric in [FuzzyMatch, RougeL] {
            let result = similarity(&a, &b, metric).expect("lexical");
            let cap = result.capped.expect("200k-character inputs are capped");
            assert_eq!(
                cap.limit,
                if metric == FuzzyMatch { MAX_FUZZY_CHARS } else { MAX_LCS_TOKENS }
            );
            assert!((0.0..=1.0).contains(&result.value), "{metric:?} {}", result.value);
        }
        for metric in [Bleu, Gleu, Meteor, Rouge1, Rouge2, Rouge5] {
            let result = similarity(&a, &b, metric).expect("lexical");
            assert_eq!(result.capped, None, "linear metrics read everything");
        }
        // far above the expected time (well under a second even unoptimised): a regression to
        // the quadratic table on the whole input would take minutes here
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
    }
}
