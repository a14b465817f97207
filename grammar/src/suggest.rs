//! "Did you mean" suggestions for misspelt names.

/// The candidate closest to `name`, if it is close enough to be a plausible
/// typo: a case-insensitive edit distance of at most a third of the longer
/// name (and at least 1).
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let lower = name.to_lowercase();
    candidates
        .into_iter()
        .map(|candidate| {
            let distance = strsim::damerau_levenshtein(&lower, &candidate.to_lowercase());
            (distance, candidate)
        })
        .filter(|(distance, candidate)| {
            let longest = name.chars().count().max(candidate.chars().count());
            *distance <= (longest / 3).max(1)
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// `` `a`, `b`, `c` `` for a help line, or `none` when empty.
pub fn list(names: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let quoted: Vec<String> = names
        .into_iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect();
    if quoted.is_empty() {
        "none".to_owned()
    } else {
        quoted.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_close_names() {
        let names = ["promptTokens", "tenant", "qos"];
        assert_eq!(closest("promptToken", names), Some("promptTokens"));
        assert_eq!(closest("prompttokens", names), Some("promptTokens"));
        assert_eq!(closest("tennat", names), Some("tenant"));
        assert_eq!(closest("qs", names), Some("qos"));
        assert_eq!(closest("model", names), None);
        assert_eq!(closest("x", [] as [&str; 0]), None);
    }

    #[test]
    fn lists_names() {
        assert_eq!(list(["a", "b"]), "`a`, `b`");
        assert_eq!(list([] as [&str; 0]), "none");
    }
}
