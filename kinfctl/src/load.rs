//! Reading YAML files and directories into [`Sources`].

use std::path::{Path, PathBuf};

use kinf_lang::Sources;

use crate::report::Error;

/// Reads every path (files as given; directories recursively, `*.yaml`/`*.yml`, sorted). A
/// directory that holds no such file is an error. Errors are of
/// [`ErrorKind::Read`](crate::report::ErrorKind::Read).
pub fn read_sources(paths: &[PathBuf]) -> Result<Sources, Error> {
    let mut files = Vec::new();
    for p in paths {
        let before = files.len();
        collect(p, &mut files, true)?;
        // A directory without any policy file is a mistyped path or layout, not a clean bundle.
        if files.len() == before {
            return Err(Error::read(format!(
                "no policy files found: `{}` holds no `*.yaml` or `*.yml` file (subdirectories included)",
                p.display()
            ))
            .with_help("check the path"));
        }
    }
    let mut sources = Sources::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|e| Error::cannot_read(&f, e))?;
        sources.add(f.display().to_string(), text);
    }
    Ok(sources)
}

fn collect(p: &Path, out: &mut Vec<PathBuf>, explicit: bool) -> Result<(), Error> {
    let meta = std::fs::metadata(p).map_err(|e| Error::cannot_read(p, e))?;
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|e| Error::read(format!("cannot read directory `{}`: {e}", p.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
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
