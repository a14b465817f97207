//! Standalone configuration: every `*.yaml`/`*.yml` file under a directory, recursively, in
//! path order, is one bundle.

use std::path::{Path, PathBuf};

use kinf_lang::Sources;

/// Errors reading a configuration directory.
#[derive(Debug, thiserror::Error)]
pub enum ConfigDirError {
    /// A path could not be read.
    #[error("cannot read `{path}`: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Reads every YAML file under `dir` (or `dir` itself when it is a file).
pub fn read_dir(dir: &Path) -> Result<Sources, ConfigDirError> {
    let mut files = Vec::new();
    collect(dir, &mut files, true)?;
    let mut sources = Sources::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|source| ConfigDirError::Read {
            path: f.clone(),
            source,
        })?;
        sources.add(f.display().to_string(), text);
    }
    Ok(sources)
}

fn collect(p: &Path, out: &mut Vec<PathBuf>, explicit: bool) -> Result<(), ConfigDirError> {
    let read_err = |source| ConfigDirError::Read {
        path: p.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(p).map_err(read_err)?;
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|source| ConfigDirError::Read {
                path: p.to_path_buf(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|e| {
                !e.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        entries.sort();
        for e in entries {
            collect(&e, out, false)?;
        }
    } else if explicit || p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
        out.push(p.to_path_buf());
    }
    Ok(())
}
