//! The API keys a server lets in (moshi-server's `authorized_ids`): read from a file of one key a
//! line (`#` starts a comment) or from a list; a client presents one in the `kyutai-api-key`
//! header or the `auth_id` query parameter.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest key file read (a few thousand keys).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Longest key accepted.
const MAX_KEY_BYTES: usize = 256;

/// The keys that open a session.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKeys {
    keys: Vec<String>,
}

impl std::fmt::Debug for ApiKeys {
    /// The keys themselves never reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} key(s))", self.keys.len())
    }
}

/// Why keys could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeysError {
    #[error("{path}: {detail}")]
    File { path: PathBuf, detail: String },
    #[error("{source_name}: {detail}")]
    Key { source_name: String, detail: String },
}

impl ApiKeys {
    /// The keys of `path`: one a line, blank lines and lines starting with `#` skipped.
    pub fn from_file(path: &Path) -> Result<Self, ApiKeysError> {
        let bad = |detail: String| ApiKeysError::File {
            path: path.to_path_buf(),
            detail,
        };
        let file = std::fs::File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
        let mut text = String::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| bad(format!("cannot read as UTF-8 text: {e}")))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(bad(format!(
                "larger than {MAX_FILE_BYTES} bytes: expected one key a line"
            )));
        }
        let lines = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'));
        Self::from_keys(lines, &path.display().to_string())
    }

    /// The keys of a list (`source_name` names it in errors: a flag or a variable).
    pub fn from_keys<'a>(
        keys: impl IntoIterator<Item = &'a str>,
        source_name: &str,
    ) -> Result<Self, ApiKeysError> {
        let bad = |detail: String| ApiKeysError::Key {
            source_name: source_name.to_string(),
            detail,
        };
        let mut out = Vec::new();
        for (i, key) in keys.into_iter().enumerate() {
            if key.len() > MAX_KEY_BYTES {
                return Err(bad(format!(
                    "key {} is {} bytes long: at most {MAX_KEY_BYTES}",
                    i + 1,
                    key.len()
                )));
            }
            if !key.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad(format!(
                    "key {} has a space or a character that is not printable ASCII: a key must fit an HTTP header and a URL",
                    i + 1
                )));
            }
            out.push(key.to_string());
        }
        if out.is_empty() {
            return Err(bad("no key: expected at least one".into()));
        }
        Ok(Self { keys: out })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether `key` is one of the keys. Every key is compared in full, so that the time taken
    /// says nothing about how much of a guess was right.
    pub fn allows(&self, key: &str) -> bool {
        self.keys.iter().fold(false, |found, k| {
            found | same_bytes(k.as_bytes(), key.as_bytes())
        })
    }
}

/// Byte equality in a time that depends only on the lengths.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_and_its_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, "# operators\n\n  public_token  \nsecond-key\n").unwrap();
        let keys = ApiKeys::from_file(&path).unwrap();
        assert_eq!(keys.len(), 2);
        assert!(keys.allows("public_token") && keys.allows("second-key"));
        assert!(!keys.allows("public_toke") && !keys.allows("") && !keys.allows("public_token "));
        assert_eq!(format!("{keys:?}"), "ApiKeys(2 key(s))");

        std::fs::write(&path, "# nothing\n").unwrap();
        let e = ApiKeys::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("keys") && e.contains("no key"), "{e}");
        std::fs::write(&path, "a b\n").unwrap();
        let e = ApiKeys::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("key 1 has a space"), "{e}");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        let e = ApiKeys::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("UTF-8"), "{e}");
        let e = ApiKeys::from_file(&dir.path().join("absent")).unwrap_err();
        assert!(e.to_string().contains("cannot open"), "{e}");
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        let e = ApiKeys::from_keys([long.as_str()], "MOSHI_RS_API_KEYS").unwrap_err();
        assert!(e.to_string().starts_with("MOSHI_RS_API_KEYS: key 1"), "{e}");
    }
}
