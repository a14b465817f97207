//! `kinfctl crds` and `kinfctl schema`.

use std::io::Write;

use kinf_policy::ResourceKind;

use crate::EXIT_OK;
use crate::cli::Format;
use crate::report::{self, Error, ErrorKind};

/// Every CRD as one multi-document YAML (or a JSON array).
pub fn crds_text(format: Format) -> String {
    let values: Vec<serde_json::Value> = ResourceKind::ALL
        .iter()
        .map(|k| serde_json::to_value(kinf_policy::schema::crd(*k)).unwrap_or_default())
        .collect();
    match format {
        Format::Json => serde_json::to_string_pretty(&values).unwrap_or_default() + "\n",
        Format::Human => values
            .iter()
            .map(|v| format!("---\n{}", crate::yaml_out::to_yaml(v)))
            .collect(),
    }
}

/// `kinfctl crds`.
pub fn run_crds(format: Format, out: &mut dyn Write, _err: &mut dyn Write) -> i32 {
    let _ = out.write_all(crds_text(format).as_bytes());
    EXIT_OK
}

/// `kinfctl schema KIND`.
///
/// The schema is JSON whatever the format; `--format json` makes an error JSON too.
pub fn run_schema(kind: &str, format: Format, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let Some(k) = ResourceKind::ALL
        .iter()
        .copied()
        .find(|k| k.as_str().eq_ignore_ascii_case(kind))
    else {
        let kinds: Vec<&str> = ResourceKind::ALL.iter().map(|k| k.as_str()).collect();
        let e = Error::new(ErrorKind::Unknown, format!("unknown kind `{kind}`")).with_help(
            kinf_lang::suggest::help_for(kind, kinds.iter().copied(), "kinds"),
        );
        return report::error(format == Format::Json, out, err, e);
    };
    let schema = kinf_lang::schema_check::lint_schema(k);
    let _ = writeln!(
        out,
        "{}",
        serde_json::to_string_pretty(&schema).unwrap_or_default()
    );
    EXIT_OK
}
