//! Field paths inside a resource document (`spec.rules[0].route.select[1]`).

use std::borrow::Cow;
use std::fmt;

/// One step of a [`FieldPath`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Seg {
    /// A mapping key (borrowed when it is a literal of the compiler, as most are).
    Key(Cow<'static, str>),
    /// A sequence index.
    Index(usize),
}

impl From<&'static str> for Seg {
    fn from(s: &'static str) -> Self {
        Seg::Key(Cow::Borrowed(s))
    }
}

impl From<String> for Seg {
    fn from(s: String) -> Self {
        Seg::Key(Cow::Owned(s))
    }
}

impl From<usize> for Seg {
    fn from(i: usize) -> Self {
        Seg::Index(i)
    }
}

/// A path from the document root to a node, written like `spec.rules[0].name`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldPath(pub Vec<Seg>);

impl FieldPath {
    /// The root.
    pub fn root() -> Self {
        FieldPath(Vec::new())
    }

    /// This path extended by one key.
    pub fn key(&self, k: impl Into<Cow<'static, str>>) -> Self {
        let mut p = FieldPath(Vec::with_capacity(self.0.len() + 1));
        p.0.extend(self.0.iter().cloned());
        p.0.push(Seg::Key(k.into()));
        p
    }

    /// This path extended by one index.
    pub fn index(&self, i: usize) -> Self {
        let mut p = FieldPath(Vec::with_capacity(self.0.len() + 1));
        p.0.extend(self.0.iter().cloned());
        p.0.push(Seg::Index(i));
        p
    }

    /// Parses a JSON pointer into the document `root` (`/spec/rules/0/name`): a segment is an
    /// index where `root` has a list, a key everywhere else, so that a mapping key made of
    /// digits (the label `"8080"`) stays a key. Past the end of `root`, as
    /// [`FieldPath::from_json_pointer`].
    pub fn from_json_pointer_in(ptr: &str, root: &crate::yaml::Node) -> Self {
        use crate::yaml::Value;
        let mut node = Some(root);
        let segs = ptr
            .split('/')
            .skip(1)
            .map(|s| {
                let s = s.replace("~1", "/").replace("~0", "~");
                let (seg, next) = match node.map(|n| &n.value) {
                    Some(Value::Map(entries)) => {
                        let next = entries.iter().find(|e| e.key == s).map(|e| &e.value);
                        (Seg::Key(Cow::Owned(s)), next)
                    }
                    Some(Value::Seq(items)) => match s.parse::<usize>() {
                        Ok(i) => (Seg::Index(i), items.get(i)),
                        Err(_) => (Seg::Key(Cow::Owned(s)), None),
                    },
                    _ => match s.parse::<usize>() {
                        Ok(i) => (Seg::Index(i), None),
                        Err(_) => (Seg::Key(Cow::Owned(s)), None),
                    },
                };
                node = next;
                seg
            })
            .collect();
        FieldPath(segs)
    }

    /// Parses a JSON pointer (`/spec/rules/0/name`). Numeric segments become indices.
    pub fn from_json_pointer(ptr: &str) -> Self {
        let segs = ptr
            .split('/')
            .skip(1)
            .map(|s| {
                let s = s.replace("~1", "/").replace("~0", "~");
                match s.parse::<usize>() {
                    Ok(i) => Seg::Index(i),
                    Err(_) => Seg::Key(Cow::Owned(s)),
                }
            })
            .collect();
        FieldPath(segs)
    }

    /// The last key of the path, if it ends in a key.
    pub fn last_key(&self) -> Option<&str> {
        match self.0.last() {
            Some(Seg::Key(k)) => Some(k.as_ref()),
            _ => None,
        }
    }

    /// The path without its last segment.
    pub fn parent(&self) -> FieldPath {
        let mut p = self.clone();
        p.0.pop();
        p
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for seg in &self.0 {
            match seg {
                Seg::Key(k) => {
                    if !first {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Seg::Index(i) => write!(f, "[{i}]")?,
            }
            first = false;
        }
        Ok(())
    }
}

/// Builds a [`FieldPath`] from keys and indices: `fpath!["spec", "rules", 0, "name"]`.
#[macro_export]
macro_rules! fpath {
    ($($seg:expr),* $(,)?) => {
        $crate::path::FieldPath(vec![$($crate::path::Seg::from($seg)),*])
    };
}
