//! Standalone configuration: every `*.yaml`/`*.yml` file under a directory, recursively, in
//! path order, is one bundle. The API key files its front doors name (`GatewayBackend`
//! `spec.tenants.apiKeys.file`) belong to it too: [`Watch`] counts an edit of one as a change
//! of the configuration.

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

/// The directory that relative paths of a configuration (API key files, tokenizers, credential
/// files) are resolved against: `config` itself when it is a directory, else the directory of
/// the file.
pub fn base_dir(config: &Path) -> PathBuf {
    if config.is_dir() {
        config.to_path_buf()
    } else {
        config
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    }
}

/// The API key files (`GatewayBackend` `spec.tenants.apiKeys.file`) that the resources of
/// `sources` name, as written (a relative path is relative to [`base_dir`]), sorted, without
/// repeats. The resources are only loaded, not checked; a front door that does not load names
/// none (its bundle is refused for it anyway).
pub fn key_files(sources: &Sources) -> Vec<String> {
    let mut diagnostics = Vec::new();
    let bundle = kinf_lang::bundle::load(sources, &mut diagnostics);
    crate::tenants::identity::key_files_named(bundle.gateways.iter().map(|g| &g.spec))
}

/// The provider credential files (`InferenceProvider` `spec.credentials.file`) that the
/// bundle in `sources` names, as written, sorted, without repeats.
pub fn credential_files(sources: &Sources) -> Vec<String> {
    let mut diagnostics = Vec::new();
    let bundle = kinf_lang::bundle::load(sources, &mut diagnostics);
    let mut names: Vec<String> = bundle
        .providers
        .iter()
        .filter_map(|p| p.spec.credentials.as_ref()?.file.clone())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// A digest of the content of the files `names` (a relative name is relative to `base`, as
/// provider credentials resolve it): it changes when one of them is edited, created or
/// removed. `None` for no names. Never shown or logged: the files hold secrets.
pub fn files_digest(base: &Path, names: &[String]) -> Option<u64> {
    if names.is_empty() {
        return None;
    }
    let mut h = crate::bundle::FNV_OFFSET;
    for name in names {
        h = crate::bundle::fnv(h, name.as_bytes());
        h = match std::fs::read(base.join(name)) {
            Ok(bytes) => crate::bundle::fnv(crate::bundle::fnv(h, b"\0ok\0"), &bytes),
            Err(e) => crate::bundle::fnv(h, format!("\0err\0{:?}", e.kind()).as_bytes()),
        };
    }
    Some(h)
}

/// A configuration polled for changes (directory mode's reloads): what [`Watch::read`] hashes
/// is the YAML and the content of every API key file and provider credential file the YAML
/// names, wherever it lies.
#[derive(Debug)]
pub struct Watch {
    config: PathBuf,
    base: PathBuf,
    /// The key files and the provider credential files named by the YAML whose
    /// [`crate::bundle::sources_hash`] is the first value: the YAML is loaded again only when
    /// it changed.
    named: Option<(u64, Vec<String>, Vec<String>)>,
}

impl Watch {
    /// Watches the configuration directory (or one file) `config`.
    pub fn new(config: &Path) -> Self {
        Watch {
            config: config.to_path_buf(),
            base: base_dir(config),
            named: None,
        }
    }

    /// Reads the YAML ([`read_dir`]) and returns it with a hash of its content and of the
    /// content of every API key file and provider credential file it names: an edit of one of
    /// those files alone changes the hash.
    /// The key files are hashed as the policy's fingerprint counts them
    /// ([`crate::tenants::identity::KeyFiles::fingerprint`]); one that cannot be read hashes
    /// as such (the apply refuses the bundle for it,
    /// [`crate::gateway::Gateway::apply`]); the YAML cannot be read: an error. Without key
    /// files the hash is [`crate::bundle::sources_hash`].
    pub fn read(&mut self) -> Result<(Sources, u64), ConfigDirError> {
        let sources = read_dir(&self.config)?;
        let yaml = crate::bundle::sources_hash(&sources);
        let (named, credentials) = match &mut self.named {
            Some((h, named, credentials)) if *h == yaml => (named, credentials),
            slot => {
                let (_, named, credentials) =
                    slot.insert((yaml, key_files(&sources), credential_files(&sources)));
                (named, credentials)
            }
        };
        let files = crate::tenants::identity::KeyFiles::read(&self.base, named.iter().cloned());
        let mut h = if files.is_empty() {
            yaml
        } else {
            crate::bundle::fnv(yaml, &files.fingerprint().to_le_bytes())
        };
        if let Some(d) = files_digest(&self.base, credentials) {
            h = crate::bundle::fnv(h, &d.to_le_bytes());
        }
        Ok((sources, h))
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const DOOR: &str = "apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: { name: gw, namespace: t }
spec:
  pool: pool
  tenants: { apiKeys: { file: KEYS } }
";

    #[test]
    fn the_hash_covers_the_key_files_the_yaml_names_wherever_they_lie() {
        let root = std::env::temp_dir().join(format!("kinf-watch-{}", std::process::id()));
        let (config, outside) = (root.join("config"), root.join("outside"));
        std::fs::create_dir_all(&config).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let keys = outside.join("keys.txt");
        std::fs::write(&keys, "team-a: sk-1\n").unwrap();
        std::fs::write(
            config.join("door.yaml"),
            DOOR.replace("KEYS", &format!("\"{}\"", keys.display())),
        )
        .unwrap();
        let mut watch = Watch::new(&config);
        let (sources, first) = watch.read().unwrap();
        assert_eq!(key_files(&sources), [keys.display().to_string()]);
        assert_ne!(first, crate::bundle::sources_hash(&sources));
        assert_eq!(watch.read().unwrap().1, first, "nothing changed");
        // The key file alone: revoked, then gone.
        std::fs::write(&keys, "").unwrap();
        let revoked = watch.read().unwrap().1;
        assert_ne!(revoked, first);
        std::fs::remove_file(&keys).unwrap();
        let gone = watch.read().unwrap().1;
        assert!(gone != revoked && gone != first);
        // No key file named: the YAML's hash alone.
        std::fs::write(config.join("door.yaml"), "# nothing\n").unwrap();
        let (sources, h) = watch.read().unwrap();
        assert_eq!(h, crate::bundle::sources_hash(&sources));
        let _ = std::fs::remove_dir_all(&root);
    }
    #[test]
    fn the_hash_covers_the_provider_credential_files_the_yaml_names() {
        let root = std::env::temp_dir().join(format!("kinf-watch-creds-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("openai.token"), "sk-old\n").unwrap();
        std::fs::write(
            root.join("p.yaml"),
            "apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: { name: openai, namespace: t }
spec:
  type: OpenAI
  url: https://api.openai.com/v1
  credentials: { file: openai.token }
  models: [ { name: m, providerModel: gpt-5 } ]
",
        )
        .unwrap();
        let mut watch = Watch::new(&root);
        let (sources, first) = watch.read().unwrap();
        assert_eq!(credential_files(&sources), ["openai.token"]);
        assert_ne!(first, crate::bundle::sources_hash(&sources));
        assert_eq!(watch.read().unwrap().1, first, "nothing changed");
        std::fs::write(root.join("openai.token"), "sk-new\n").unwrap();
        let rotated = watch.read().unwrap().1;
        assert_ne!(rotated, first, "the key rotated");
        std::fs::remove_file(root.join("openai.token")).unwrap();
        let gone = watch.read().unwrap().1;
        assert!(gone != rotated && gone != first);
        let _ = std::fs::remove_dir_all(&root);
    }
}
