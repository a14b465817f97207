//! "Did you mean" suggestions.

/// The candidate closest to `input`, if it is close enough to be a likely typo (the same rule
/// as the condition language's suggestions: case-insensitive Damerau–Levenshtein distance of at
/// most a third of the longer name, at least 1).
pub fn did_you_mean<'a, I>(input: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    kinf_grammar::suggest::closest(input, candidates)
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
                format!("there are no {what}")
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
