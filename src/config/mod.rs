//! Configuration: read the YAML file, validate it completely, and compile it into the
//! immutable runtime [`Table`]. Every error carries `FILE:LINE:COL`.

pub mod compile;
pub mod document;
pub mod file;
pub mod lint;
pub mod position;
pub mod units;

use std::fmt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::model::table::{Boot, Table};

/// One problem in a config file, printed as `FILE:LINE:COL: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl fmt::Display for ConfigError {
    /// One line per error, whatever the file held: control characters in echoed values are
    /// escaped and a message is cut at [`MAX_MESSAGE`] characters, so every line of
    /// `sluice check`'s stderr starts with `FILE:LINE:COL: `.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.col)?;
        for (i, c) in self.message.chars().enumerate() {
            if i == MAX_MESSAGE {
                return f.write_str("…");
            }
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

/// Longest message printed for one error, in characters.
pub const MAX_MESSAGE: usize = 300;

/// All problems found in one file (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// The version of a config: a short hash of its exact text and of the files it reads (the
/// `consumers_file`, certificates and keys). Two instances serving different consumers or
/// certificates from the same config file then show different versions. A config that reads
/// no other file has the hash of its text alone.
pub fn version_of(text: &str, files: &[PathBuf]) -> String {
    content_hash(text, files, 6)
}

/// The first `bytes` bytes, in hex, of SHA-256 over `text` and the contents of `files`, each
/// after its length (a file that cannot be read counts as empty). Not their paths: the text
/// names them, and the same config started as `-c sluice.yaml` or `-c /etc/sluice/sluice.yaml`
/// must have one version.
pub fn content_hash(text: &str, files: &[PathBuf], bytes: usize) -> String {
    let mut h = Sha256::new();
    h.update(text.as_bytes());
    for f in files {
        let content = std::fs::read(f).unwrap_or_default();
        h.update((content.len() as u64).to_le_bytes());
        h.update(content);
    }
    h.finalize()[..bytes]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Read, parse, validate and compile `path` (named in errors exactly as given).
pub fn load(path: &Path) -> Result<Loaded, ConfigErrors> {
    let text = read(path, "config")?;
    load_str(&path.display().to_string(), &text)
}

/// The text of `path` (a `what` file), or an error at its 1:1.
pub fn read(path: &Path, what: &str) -> Result<String, ConfigErrors> {
    std::fs::read_to_string(path).map_err(|e| read_error(path, what, &e))
}

/// `e`, met reading `path` (a `what` file), as an error at its 1:1.
pub fn read_error(path: &Path, what: &str, e: &std::io::Error) -> ConfigErrors {
    ConfigErrors(vec![ConfigError {
        file: path.display().to_string(),
        line: 1,
        col: 1,
        message: format!("cannot read {what}: {e}"),
    }])
}

/// Parse, validate and compile config text; `name` is used in error positions.
pub fn load_str(name: &str, text: &str) -> Result<Loaded, ConfigErrors> {
    compile_file(name, text, parse(name, text)?)
}

/// Parse config text into its file form (structure and types only).
pub fn parse(name: &str, text: &str) -> Result<file::File, ConfigErrors> {
    parse_yaml(name, text)
}

/// Parse YAML text named `name` into `T`, with the document's own checks first (see
/// [`document`]) and positioned errors (the config file, and a `consumers_file`).
pub fn parse_yaml<T: serde::de::DeserializeOwned>(
    name: &str,
    text: &str,
) -> Result<T, ConfigErrors> {
    let text = without_bom(text);
    if let Err((line, col, message)) = document::check(text) {
        return Err(ConfigErrors(vec![ConfigError {
            file: name.to_string(),
            line,
            col,
            message,
        }]));
    }
    serde_yaml::from_str(text).map_err(|e| {
        // An error that names a top-level section first (`routes` is empty, say) is placed
        // at that section: serde_yaml places it at the document's start.
        let section = || {
            let name = e.to_string();
            let name = name.strip_prefix('`')?.split('`').next()?.to_owned();
            let at = position::Positions::index(text).of(&name);
            Some((at.line, at.col))
        };
        let (mut line, mut col) =
            section().unwrap_or_else(|| e.location().map_or((1, 1), |l| (l.line(), l.column())));
        // serde_yaml appends " at line L column C"; the position goes in front instead.
        let raw = e.to_string();
        let mut msg = match raw.rfind(" at line ") {
            Some(i) => raw[..i].to_string(),
            None => raw.clone(),
        };
        // A syntax error with a context ("could not find expected ':' at line 6 column 5,
        // while scanning a simple key at line 5 column 5"). The scanner's context is what it
        // was reading, where the mistake is (`upstream:api`, a quote left open): the error is
        // placed there, with where the parser gave up in the message. A parser's context is
        // the enclosing mapping ("while parsing a block mapping"), maybe dozens of lines
        // above: the error stays where it was found, with where that mapping began.
        if let Some((problem, context)) = raw.split_once(", while ") {
            let at = |s: &str| {
                let (l, c) = s.strip_prefix("line ")?.split_once(" column ")?;
                Some((l.parse::<usize>().ok()?, c.parse::<usize>().ok()?))
            };
            let (p, c) = (problem.rfind(" at line "), context.rfind(" at line "));
            if let (Some(p), Some(c)) = (p, c) {
                if let (Some(found), Some(begun)) = (at(&problem[p + 4..]), at(&context[c + 4..])) {
                    let (what, context) = (&problem[..p], &context[..c]);
                    if context.starts_with("scanning ") {
                        (line, col) = begun;
                        msg = format!("{what} (at {}:{}) while {context}", found.0, found.1);
                    } else {
                        (line, col) = found;
                        msg = format!("{what} while {context} (begun at {}:{})", begun.0, begun.1);
                    }
                }
            }
        }
        if msg.starts_with("found character that cannot start any token")
            && text
                .lines()
                .nth(line.saturating_sub(1))
                .and_then(|l| l.chars().nth(col.saturating_sub(1)))
                == Some('\t')
        {
            msg.push_str(": a tab (YAML indents with spaces only)");
        }
        ConfigErrors(vec![ConfigError {
            file: name.to_string(),
            line,
            col,
            message: plain_types(&msg),
        }])
    })
}

/// serde's names for what it expected, in the words of the config reference: `struct
/// Listener` is a map to the reader of a YAML file, and `usize` a whole number.
fn plain_types(msg: &str) -> String {
    let mut out = msg.to_string();
    while let Some(at) = out.find("expected struct ") {
        let rest = &out[at + "expected struct ".len()..];
        let end = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        let said = match &rest[..end] {
            "File" => "a map of the config's sections".to_string(),
            name => format!("a map (a {})", name.to_ascii_lowercase()),
        };
        out = format!("{}expected {said}{}", &out[..at], &rest[end..]);
    }
    for int in ["usize", "u64", "u32", "u16", "u8"] {
        out = out.replace(&format!("expected {int}"), "expected a whole number");
    }
    out
}

/// `text` without a leading byte-order mark (some Windows editors write one): it is not part
/// of the YAML, and counted in, every position on the first line would be one column off and
/// the first key would not be found by name.
pub fn without_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// Validate and compile a parsed file; `text` is its source, for positions and the version.
pub fn compile_file(name: &str, text: &str, file: file::File) -> Result<Loaded, ConfigErrors> {
    let positions = position::Positions::index(without_bom(text));
    let version = version_of(text, &compile::watched_files(name, &file));
    let (boot, table) = compile::compile(name, &file, &positions, version)?;
    // Certificate and key files are read here, so `check`, start and every reload refuse a
    // pair that does not load at the entry that named it.
    #[allow(clippy::disallowed_methods)] // certificate validity is wall-clock by definition
    let now = std::time::SystemTime::now();
    let mut tls = crate::tls::load(&boot, &table, now)
        .map_err(|errors| ConfigErrors(errors.into_iter().map(ConfigError::from).collect()))?;
    let mut warnings = lint::warnings(name, &positions, &table);
    warnings.extend(tls.warnings.drain(..).map(ConfigError::from));
    Ok(Loaded {
        boot,
        table,
        file,
        tls,
        warnings,
    })
}

impl From<crate::tls::Located> for ConfigError {
    fn from(l: crate::tls::Located) -> ConfigError {
        ConfigError {
            file: l.at.file,
            line: l.at.line,
            col: l.at.col,
            message: l.message,
        }
    }
}

/// A loaded config: what only a restart changes, the compiled table the gateway serves, the
/// file it came from (what `/admin/config` shows), and the TLS material its files hold.
pub struct Loaded {
    pub boot: Boot,
    pub table: Table,
    pub file: file::File,
    pub tls: crate::tls::Material,
    /// Every warning of this load: what loads but cannot do what it says (see [`lint`]),
    /// then the certificates' (taken from `tls`).
    pub warnings: Vec<ConfigError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a YAML reader is told instead of serde's type names.
    #[test]
    fn errors_name_maps_and_numbers_not_rust_types() {
        let msg = |text: &str| parse("F", text).unwrap_err().0[0].message.clone();
        assert_eq!(
            msg("- a\n"),
            "invalid type: sequence, expected a map of the config's sections"
        );
        let listen = msg("listen: [a, b]\nupstreams: {}\nroutes: []\n");
        assert!(listen.ends_with("expected a map (a listener)"), "{listen}");
        let limit = msg(
            "upstreams: {}\nroutes: [{ name: r, match: { path: / }, upstream: u, limits: [5] }]\n",
        );
        assert!(limit.ends_with("expected a map (a limit)"), "{limit}");
        let workers = msg("workers: -1\nupstreams: {}\nroutes: []\n");
        assert!(workers.ends_with("expected a whole number"), "{workers}");
    }

    #[test]
    fn the_version_covers_the_files_a_config_reads() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("consumers.yaml");
        std::fs::write(&list, "- { name: a, plan: p, keys: [k] }\n").unwrap();
        let text = "consumers_file: consumers.yaml\n";
        let files = [list.clone()];
        let v1 = version_of(text, &files);
        assert_eq!(v1.len(), 12);
        assert_eq!(
            v1,
            version_of(text, &files),
            "the same bytes, the same version"
        );
        std::fs::write(&list, "- { name: b, plan: p, keys: [k] }\n").unwrap();
        let v2 = version_of(text, &files);
        assert_ne!(v1, v2, "another consumer list is another version");
        std::fs::remove_file(&list).unwrap();
        assert_ne!(version_of(text, &files), v2, "a file gone is a change");
        // Where the config was started from does not matter, only what it reads.
        std::fs::write(&list, "- { name: b, plan: p, keys: [k] }\n").unwrap();
        let elsewhere = dir.path().join("again").join("..").join("consumers.yaml");
        std::fs::create_dir(dir.path().join("again")).unwrap();
        assert_eq!(version_of(text, &[elsewhere]), v2);
        // A config that reads nothing else: the hash of its text, as before.
        let plain: String = Sha256::digest(text.as_bytes())[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(version_of(text, &[]), plain);
        assert_eq!(content_hash(text, &[], 8).len(), 16);
    }
}
