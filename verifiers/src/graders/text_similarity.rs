//! `text_similarity`: fuzzy_match, BLEU, GLEU, ROUGE-N and ROUGE-L in [0, 1].

use std::collections::HashMap;

use crate::spec::SimilarityMetric;

/// Longest text compared by the quadratic metrics (characters or tokens); longer input is cut.
const MAX_UNITS: usize = 20_000;

/// The metric value of `candidate` against `reference`, in [0, 1].
pub fn similarity(candidate: &str, reference: &str, metric: SimilarityMetric) -> f64 {
    let cand = tokens(candidate);
    let refr = tokens(reference);
    match metric {
        SimilarityMetric::FuzzyMatch => fuzzy_ratio(candidate, reference),
        SimilarityMetric::Bleu => bleu(&cand, &refr),
        SimilarityMetric::Gleu => gleu(&cand, &refr),
        SimilarityMetric::Rouge1 => rouge_n(&cand, &refr, 1),
        SimilarityMetric::Rouge2 => rouge_n(&cand, &refr, 2),
        SimilarityMetric::Rouge3 => rouge_n(&cand, &refr, 3),
        SimilarityMetric::Rouge4 => rouge_n(&cand, &refr, 4),
        SimilarityMetric::Rouge5 => rouge_n(&cand, &refr, 5),
        SimilarityMetric::RougeL => rouge_l(&cand, &refr),
    }
}

fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|t| !t.is_empty())
        .take(MAX_UNITS)
        .map(str::to_lowercase)
        .collect()
}

/// rapidfuzz-style ratio: 1 - indel distance / total length = 2·LCS / (|a| + |b|).
fn fuzzy_ratio(a: &str, b: &str) -> f64 {
    let a: Vec<char> = a.chars().take(MAX_UNITS).collect();
    let b: Vec<char> = b.chars().take(MAX_UNITS).collect();
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    2.0 * lcs_len(&a, &b) as f64 / (a.len() + b.len()) as f64
}

fn lcs_len<T: PartialEq>(a: &[T], b: &[T]) -> usize {
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

fn rouge_l(cand: &[String], refr: &[String]) -> f64 {
    if cand.is_empty() && refr.is_empty() {
        return 1.0;
    }
    f1(lcs_len(cand, refr), cand.len(), refr.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use SimilarityMetric::*;

    #[test]
    fn identical_texts_score_one_and_disjoint_zero() {
        for m in [FuzzyMatch, Bleu, Gleu, Rouge1, Rouge2, Rouge3, Rouge4, Rouge5, RougeL] {
            let same =
                similarity("the cat sat on the mat today", "the cat sat on the mat today", m);
            assert!((same - 1.0).abs() < 1e-9, "{m:?} {same}");
            assert!(similarity("alpha beta gamma delta", "one two three four", m) < 0.35, "{m:?}");
        }
    }

    #[test]
    fn known_values() {
        assert!((similarity("kitten", "sitting", FuzzyMatch) - 2.0 * 4.0 / 13.0).abs() < 1e-9);
        let r1 = similarity("the cat sat", "the cat ran away", Rouge1);
        // matches 2, p = 2/3, r = 2/4 -> f1 = 4/7
        assert!((r1 - 4.0 / 7.0).abs() < 1e-9);
        let rl = similarity("a b c d", "a c d e", RougeL);
        assert!((rl - 0.75).abs() < 1e-9);
    }
}
