//! Reading YAML files and directories into [`Sources`].

use std::path::{Path, PathBuf};

use kinf_lang::Sources;

/// Reads every path (files as given; directories recursively, `*.yaml`/`*.yml`, sorted). A
/// directory that holds no such file is an error.
pub fn read_sources(paths: &[PathBuf]) -> Result<Sources, String> {
    let mut files = Vec::new();
    for p in paths {
        let before = files.len();
        collect(p, &mut files, true)?;
        // A directory without any policy file is a mistyped path or layout, not a clean bundle.
        if files.len() == before {
            return Err(format!(
                "no policy files found: `{}` holds no `*.yaml` or `*.yml` file (subdirectories included)\n  help: check the path",
                p.display()
            ));
        }
    }
    let mut sources = Sources::new();
    for f in files {
        let text = std::fs::read_to_string(&f)
            .map_err(|e| format!("cannot read `{}`: {e}", f.display()))?;
        sources.add(f.display().to_string(), text);
    }
    Ok(sources)
}

fn collect(p: &Path, out: &mut Vec<PathBuf>, explicit: bool) -> Result<(), String> {
    let meta = std::fs::metadata(p).map_err(|e| format!("cannot read `{}`: {e}", p.display()))?;
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|e| format!("cannot read directory `{}`: {e}", p.display()))?
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
