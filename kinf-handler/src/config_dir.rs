//! Standalone configuration: every `*.yaml`/`*.yml` file under a directory, recursively, in
//! path order, is one bundle. The API key files its front doors name (`GatewayBackend`
//! `spec.tenants.apiKeys.file`) belong to it too: [`Watch`] counts an edit of one as a change
//! of the configuration.

use std::path::{Path, PathBuf};

use kinf_lang::Sources;

/// Largest policy file read: a whole Kubernetes ConfigMap holds at most 1 MiB, so a file over
/// this is no policy (a log or a dump saved as `*.yaml`), and reading it whole would only cost
/// memory.
pub const MAX_FILE_BYTES: u64 = 8 << 20;

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
    /// A `*.yaml`/`*.yml` path that is no regular file (a FIFO, a socket, a device): reading it
    /// could block or never end.
    #[error("cannot read `{path}`: not a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// A file over [`MAX_FILE_BYTES`].
    #[error("cannot read `{path}`: larger than {max} bytes", max = MAX_FILE_BYTES)]
    TooLarge {
        /// The path.
        path: PathBuf,
    },
    /// A file that is not UTF-8 text.
    #[error(
        "`{path}` is not UTF-8 text: byte 0x{byte:02X} at line {line}, column {column} (save it as UTF-8)"
    )]
    NotUtf8 {
        /// The path.
        path: PathBuf,
        /// 1-based line of the first byte that is not UTF-8.
        line: usize,
        /// 1-based column (in characters) of that byte.
        column: usize,
        /// The byte.
        byte: u8,
    },
    /// A directory that holds no `*.yaml`/`*.yml` file, subdirectories included: a mistyped
    /// path or a directory being replaced, not a bundle without resources.
    #[error(
        "no policy files found: `{path}` holds no `*.yaml` or `*.yml` file (subdirectories included)"
    )]
    NoFiles {
        /// The directory.
        path: PathBuf,
    },
}

impl ConfigDirError {
    /// Why the file could not be read, without its path (for callers that name the file
    /// themselves, e.g. an API key or credential file).
    pub fn reason(&self) -> String {
        match self {
            ConfigDirError::Read { source, .. } => source.to_string(),
            ConfigDirError::NotAFile { .. } => {
                "not a regular file (a FIFO, socket or device could block the reader)".to_owned()
            }
            ConfigDirError::TooLarge { .. } => format!("larger than {MAX_FILE_BYTES} bytes"),
            ConfigDirError::NotUtf8 {
                line, column, byte, ..
            } => {
                format!("not UTF-8 text: byte 0x{byte:02X} at line {line}, column {column}")
            }
            ConfigDirError::NoFiles { .. } => self.to_string(),
        }
    }

    /// The error as a refusal lists it: `file:line:col: error: message` when it has a place in
    /// the file, else `file: error: message`.
    pub fn diagnostic(&self) -> String {
        match self {
            ConfigDirError::Read { path, source } => {
                format!("{}: error: cannot read the file: {source}", path.display())
            }
            ConfigDirError::NotAFile { path } => format!(
                "{}: error: not a regular file (a FIFO, socket or device is not read)",
                path.display()
            ),
            ConfigDirError::TooLarge { path } => format!(
                "{}: error: the file is larger than {MAX_FILE_BYTES} bytes (8 MiB), the most a \
                 policy file may be",
                path.display()
            ),
            ConfigDirError::NotUtf8 {
                path,
                line,
                column,
                byte,
            } => format!(
                "{}:{line}:{column}: error: not UTF-8 text: byte 0x{byte:02X} (save the file as UTF-8)",
                path.display()
            ),
            ConfigDirError::NoFiles { path } => format!(
                "{}: error: no policy files found: the directory holds no `*.yaml` or `*.yml` \
                 file (subdirectories included)",
                path.display()
            ),
        }
    }
}

/// Reads every YAML file under `dir` (or `dir` itself when it is a file). The first file that
/// cannot be read (not UTF-8, over [`MAX_FILE_BYTES`], no regular file) is an error; a directory
/// without any is not.
pub fn read_dir(dir: &Path) -> Result<Sources, ConfigDirError> {
    let mut sources = Sources::new();
    for f in listed(dir) {
        let f = f?;
        let text = read_text(&f)?;
        sources.add(f.display().to_string(), text);
    }
    Ok(sources)
}

/// The text of a [`Sources`] entry that stands for a file that could not be read
/// ([`read_dir_for_reload`]); recognised by its address, never by its content (a comment, so
/// that whatever loads it finds no resource).
static UNREADABLE: std::sync::LazyLock<std::sync::Arc<str>> = std::sync::LazyLock::new(|| {
    std::sync::Arc::from("# kinference: this file could not be read\n")
});

/// Reads the configuration as [`read_dir`] does, for a reload: every file that cannot be read
/// (and the directory itself, or a directory without any `*.yaml`/`*.yml` file) is an entry
/// of the sources named by its [`ConfigDirError::diagnostic`], which [`unreadable`] lists and
/// which refuses the bundle ([`crate::policy_store::PolicyStore::apply_resolved`]): the
/// refusal is shown like a compilation's, and the last good policy stays in force.
pub fn read_dir_for_reload(dir: &Path) -> Sources {
    let mut sources = Sources::new();
    let mut any = false;
    for f in listed(dir) {
        any = true;
        match f.and_then(|f| read_text(&f).map(|text| (f, text))) {
            Ok((f, text)) => {
                sources.add(f.display().to_string(), text);
            }
            Err(e) => {
                sources.add(e.diagnostic(), UNREADABLE.clone());
            }
        }
    }
    if !any {
        let e = ConfigDirError::NoFiles {
            path: dir.to_path_buf(),
        };
        sources.add(e.diagnostic(), UNREADABLE.clone());
    }
    sources
}

/// The errors of the files of `sources` that could not be read ([`read_dir_for_reload`]),
/// rendered `file[:line:col]: error: message`; empty when every file was read.
pub fn unreadable(sources: &Sources) -> Vec<String> {
    sources
        .iter()
        .filter(|(_, f)| std::sync::Arc::ptr_eq(&f.text, &UNREADABLE))
        .map(|(_, f)| f.name.clone())
        .collect()
}

/// What [`Watch::read_settled`] found.
#[derive(Debug)]
pub enum Settled {
    /// The content in force (`last`).
    Unchanged,
    /// Another content, read the same twice in a row: its sources and hash.
    Changed(Sources, u64),
    /// Still changing after the reads allowed.
    Changing,
}

/// Reads one policy file (or an API key or credential file): a regular file (a FIFO would
/// block the reader), at most [`MAX_FILE_BYTES`], UTF-8 (the first other byte is located by
/// line and column).
pub(crate) fn read_text(path: &Path) -> Result<String, ConfigDirError> {
    use std::io::Read;
    let read_err = |source| ConfigDirError::Read {
        path: path.to_path_buf(),
        source,
    };
    // The type first: opening a FIFO blocks until someone writes to it.
    let meta = std::fs::metadata(path).map_err(read_err)?;
    if !meta.is_file() {
        return Err(ConfigDirError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ConfigDirError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let file = std::fs::File::open(path).map_err(read_err)?;
    // `len` bounds the allocation (checked above); `take` the read, should the file grow.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ConfigDirError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let before = std::str::from_utf8(bytes.get(..valid).unwrap_or_default()).unwrap_or("");
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        ConfigDirError::NotUtf8 {
            path: path.to_path_buf(),
            line: before.matches('\n').count() + 1,
            column: before.get(line_start..).unwrap_or("").chars().count() + 1,
            byte: bytes.get(valid).copied().unwrap_or(0),
        }
    })
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

    /// Reads the configuration ([`read`](Self::read)); when its content is not `last`'s, reads
    /// it again every `settle`, up to `reads` reads in all, until two reads in a row agree: a
    /// file caught mid-save (truncated then written, deleted then created again, a ConfigMap's
    /// `..data` swapped before its new files' links exist) reads differently a moment later.
    /// Blocks the calling thread for the waits. The directory watcher
    /// ([`crate::bundle::DirSource`]) and the read at startup ([`crate::serve::reload`]) both
    /// read through it.
    pub fn read_settled(
        &mut self,
        last: Option<u64>,
        reads: usize,
        settle: std::time::Duration,
    ) -> Result<Settled, ConfigDirError> {
        let (_, mut h) = self.read()?;
        if last == Some(h) {
            return Ok(Settled::Unchanged);
        }
        for _ in 1..reads {
            std::thread::sleep(settle);
            let (sources, again) = self.read()?;
            if again == h {
                // Settled, possibly back on what is in force.
                return Ok(if last == Some(h) {
                    Settled::Unchanged
                } else {
                    Settled::Changed(sources, h)
                });
            }
            h = again;
        }
        Ok(Settled::Changing)
    }

    /// Reads the YAML ([`read_dir_for_reload`]) and returns it with a hash of its content and
    /// of the content of every API key file and provider credential file it names: an edit of
    /// one of those files alone changes the hash.
    /// The key files are hashed as the policy's fingerprint counts them
    /// ([`crate::tenants::identity::KeyFiles::fingerprint`]); one that cannot be read hashes
    /// as such (the apply refuses the bundle for it,
    /// [`crate::gateway::Gateway::apply`]). A YAML file that cannot be read (or the
    /// directory) is in the sources as its error ([`unreadable`]), which refuses the bundle
    /// when it is applied; the hash covers the error, so that the fix is a change. Without key
    /// files the hash is [`crate::bundle::sources_hash`]. Never an error (the `Result` is kept
    /// for callers).
    pub fn read(&mut self) -> Result<(Sources, u64), ConfigDirError> {
        let sources = read_dir_for_reload(&self.config);
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

/// The YAML files under `p` (or `p` itself), in path order, with an error in place of what
/// could not be listed.
fn listed(p: &Path) -> Vec<Result<PathBuf, ConfigDirError>> {
    let mut out = Vec::new();
    collect(p, &mut out, &mut std::collections::HashSet::new(), true);
    out
}

/// Collects the YAML files under `p` into `out`. A directory is read once: one reached again
/// through a link (`ln -s . again`, or a link up the tree) is skipped, where it listed every
/// file again at each level until the path was too long to resolve (its resources defined
/// dozens of times over). `seen`: the directories read, by device and inode.
fn collect(
    p: &Path,
    out: &mut Vec<Result<PathBuf, ConfigDirError>>,
    seen: &mut std::collections::HashSet<(u64, u64)>,
    explicit: bool,
) {
    let read_err = |source| ConfigDirError::Read {
        path: p.to_path_buf(),
        source,
    };
    let meta = match std::fs::metadata(p) {
        Ok(meta) => meta,
        // A YAML file (a dangling symlink, say) is listed with its error; anything else that
        // cannot be seen is no policy file.
        Err(e) if explicit || is_yaml(p) => return out.push(Err(read_err(e))),
        Err(_) => return,
    };
    if meta.is_dir() {
        if let Some(id) = dir_id(&meta)
            && !seen.insert(id)
        {
            return;
        }
        let entries = match std::fs::read_dir(p) {
            Ok(entries) => entries,
            Err(e) => return out.push(Err(read_err(e))),
        };
        let mut entries: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|e| {
                !e.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        entries.sort();
        for e in entries {
            collect(&e, out, seen, false);
        }
    } else if explicit || is_yaml(p) {
        out.push(Ok(p.to_path_buf()));
    }
}

/// A directory's identity: its device and inode.
#[cfg(unix)]
fn dir_id(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((meta.dev(), meta.ino()))
}

/// A directory's identity: none known off Unix (links are followed as they come).
#[cfg(not(unix))]
fn dir_id(_: &std::fs::Metadata) -> Option<(u64, u64)> {
    None
}

fn is_yaml(p: &Path) -> bool {
    p.extension().is_some_and(|x| x == "yaml" || x == "yml")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
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
    fn a_file_that_is_not_utf8_is_located_by_line_and_character_column() {
        let root = std::env::temp_dir().join(format!("kinf-utf8-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let f = root.join("a.yaml");
        let at = |bytes: &[u8]| {
            std::fs::write(&f, bytes).unwrap();
            match read_dir(&root).unwrap_err() {
                ConfigDirError::NotUtf8 {
                    line, column, byte, ..
                } => (line, column, byte),
                e => panic!("{e}"),
            }
        };
        // UTF-16 (its byte order mark), and after `é` (two bytes, one column) on line 2.
        assert_eq!(at(b"\xff\xfek\0i\0"), (1, 1, 0xFF));
        assert_eq!(
            at("a: 1\nb: \u{e9}"
                .as_bytes()
                .iter()
                .chain(b"\xe9")
                .copied()
                .collect::<Vec<_>>()
                .as_slice()),
            (2, 5, 0xE9)
        );
        let e = read_dir(&root).unwrap_err();
        assert!(
            e.diagnostic()
                .starts_with(&format!("{}:2:5: error: not UTF-8", f.display())),
            "{}",
            e.diagnostic()
        );
        // Read for a reload, the file is its error: nothing of it is compiled.
        let sources = read_dir_for_reload(&root);
        assert_eq!(unreadable(&sources), [e.diagnostic()]);
        std::fs::write(&f, "a: 1\n").unwrap();
        assert!(unreadable(&read_dir_for_reload(&root)).is_empty());
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
