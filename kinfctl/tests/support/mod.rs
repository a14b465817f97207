//! Shared by kinfctl's integration tests: the repository, a seed bundle, and a temporary
//! directory per test.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `burst-to-cloud` seed bundle.
pub fn bundle() -> PathBuf {
    root().join("testdata/policies/burst-to-cloud")
}

/// A fresh directory for one test, removed on drop.
pub struct Tmp(pub PathBuf);

impl Tmp {
    /// `kinfctl-<suite>-<pid>-<test>` under the system's temporary directory, emptied.
    pub fn new(suite: &str, test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("kinfctl-{suite}-{}-{test}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        Tmp(dir)
    }

    /// Writes `text` to `name` (parents created); its path.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    /// The path of `name` in this directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Output with this directory written as `TMP`.
    pub fn clean(&self, bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).replace(&self.0.display().to_string(), "TMP")
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}
