//! "Did you mean" suggestions.

/// The candidate closest to `input`, if it is close enough to be a likely typo.
pub fn did_you_mean<'a, I>(input: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let lower = input.to_ascii_lowercase();
    let mut best: Option<(usize, &'a str)> = None;
    for cand in candidates {
        if cand.eq_ignore_ascii_case(input) {
            return Some(cand);
        }
        let d = strsim::damerau_levenshtein(&lower, &cand.to_ascii_lowercase());
        let limit = (cand.chars().count().max(input.chars().count()) / 3).max(2);
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, cand));
        }
    }
    best.map(|(_, c)| c)
}

/// Help text: "did you mean `x`?" or the list of allowed names.
pub fn help_for<'a, I>(input: &str, candidates: I, what: &str) -> String
where
    I: IntoIterator<Item = &'a str> + Clone,
{
    match did_you_mean(input, candidates.clone()) {
        Some(s) => format!("did you mean `{s}`?"),
        None => {
            let list: Vec<String> = candidates.into_iter().map(|c| format!("`{c}`")).collect();
            if list.is_empty() {
                format!("no {what} is defined")
            } else {
                format!("{what}: {}", list.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let c = ["queuedPrompts", "runningPrompts", "kvCacheUsage"];
        assert_eq!(did_you_mean("queuedPrompt", c), Some("queuedPrompts"));
        assert_eq!(did_you_mean("kvcacheusage", c), Some("kvCacheUsage"));
        assert_eq!(did_you_mean("zzz", c), None);
    }
}
