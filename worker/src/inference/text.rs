//! Turning a growing list of sampled tokens into text deltas: partial UTF-8 characters are held
//! back, and so is any tail that could still become a stop string; a completed stop string
//! ends the text before it.

/// What the text of a completion looks like after one more token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextUpdate {
    /// New text the client may see now.
    pub delta: String,
    /// A stop string appeared (the text ends before it).
    pub stopped: bool,
}

/// The text shown so far of one completion.
#[derive(Debug, Default, Clone)]
pub struct StopTextTracker {
    emitted: usize,
}

impl StopTextTracker {
    /// The next delta of `text` (the decoded completion so far); with `last`, everything not
    /// yet shown up to a stop string is released.
    pub fn update(&mut self, text: &str, stop: &[String], last: bool) -> TextUpdate {
        let search_from = floor_boundary(
            text,
            self.emitted.saturating_sub(stop.iter().map(String::len).max().unwrap_or(0)),
        );
        let cut = stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text[search_from..].find(s.as_str()).map(|i| search_from + i))
            .min();
        if let Some(cut) = cut {
            let delta = text.get(self.emitted.min(cut)..cut).unwrap_or_default().to_string();
            self.emitted = self.emitted.max(cut);
            return TextUpdate { delta, stopped: true };
        }
        let mut end = text.len();
        if !last {
            // A replacement character at the end is a partial multi-byte token sequence.
            end = text.trim_end_matches('\u{FFFD}').len();
            end -= held_back(&text[..end], stop);
        }
        let end = floor_boundary(text, end);
        let delta =
            if end > self.emitted { text[self.emitted..end].to_string() } else { String::new() };
        self.emitted = self.emitted.max(end);
        TextUpdate { delta, stopped: false }
    }
}

/// Length of the longest tail of `text` that is a proper prefix of a stop string.
fn held_back(text: &str, stop: &[String]) -> usize {
    stop.iter()
        .map(|s| {
            (1..s.len())
                .rev()
                .find(|&k| s.is_char_boundary(k) && text.ends_with(&s[..k]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// The largest char boundary of `text` at or below `at`.
fn floor_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(steps: &[&str], stop: &[&str]) -> (String, bool) {
        let stop: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        let mut tracker = StopTextTracker::default();
        let mut out = String::new();
        for (i, text) in steps.iter().enumerate() {
            let u = tracker.update(text, &stop, i + 1 == steps.len());
            out.push_str(&u.delta);
            if u.stopped {
                return (out, true);
            }
        }
        (out, false)
    }

    #[test]
    fn stop_strings_end_the_text_before_them_even_across_tokens() {
        assert_eq!(run(&["a", "a\n", "a\nB", "a\nBx"], &["\nB"]), ("a".to_string(), true));
        assert_eq!(run(&["ab", "abc"], &["zz"]), ("abc".to_string(), false));
        // A held-back prefix that never completes is released at the end.
        assert_eq!(run(&["a", "a\n"], &["\nB"]), ("a\n".to_string(), false));
    }

    #[test]
    fn partial_characters_wait_for_the_next_token() {
        let mut tracker = StopTextTracker::default();
        assert_eq!(tracker.update("h\u{FFFD}", &[], false).delta, "h");
        assert_eq!(tracker.update("hé", &[], false).delta, "é");
    }
}
