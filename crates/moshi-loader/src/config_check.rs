//! Reading and checking config files: the size cap on what is read, JSON parsing that names the
//! key at fault, and the range and consistency checks shared by the LM and Mimi configs. Every
//! check runs before the model allocates anything from the config.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::input_file::read_capped;
use crate::{LoaderError, Result};

/// The largest config file read (real ones are about 2 KB): a device or a huge file given as a
/// config is refused instead of read to the end.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads a config file of at most [`MAX_CONFIG_BYTES`] (a pipe works too).
pub fn read_config_text(path: &Path) -> Result<String> {
    let bytes = read_capped(
        path,
        MAX_CONFIG_BYTES,
        "a JSON config (Kyutai's are about 2 KB)",
    )?;
    String::from_utf8(bytes).map_err(|e| LoaderError::BadConfig {
        path: path.to_path_buf(),
        reason: format!(
            "not UTF-8 text (invalid byte at offset {}): not a JSON config",
            e.utf8_error().valid_up_to()
        ),
    })
}

/// Parses JSON into `T`; a value of the wrong type or an unknown setting names its key.
pub(crate) fn parse_json<T: DeserializeOwned>(text: &str, origin: &Path) -> Result<T> {
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed: std::result::Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = parsed.map_err(|e| {
        let key = e.path().to_string();
        let reason = e.into_inner().to_string();
        if key == "." || key.is_empty() {
            LoaderError::BadConfig {
                path: origin.to_path_buf(),
                reason,
            }
        } else {
            LoaderError::ConfigValue {
                path: origin.to_path_buf(),
                key,
                reason,
            }
        }
    })?;
    de.end().map_err(|e| LoaderError::BadConfig {
        path: origin.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(value)
}

/// A config read from JSON and validated once, at load.
pub(crate) trait ValidatedConfig: DeserializeOwned {
    fn check(&self, origin: &Path) -> Result<()>;
}

/// Parses `text` (JSON) and validates the result; `origin` names the file in errors.
pub(crate) fn config_from_json<T: ValidatedConfig>(text: &str, origin: &Path) -> Result<T> {
    let cfg: T = parse_json(text, origin)?;
    cfg.check(origin)?;
    Ok(cfg)
}

/// Reads (at most [`MAX_CONFIG_BYTES`]), parses and validates the config file `path`.
pub(crate) fn config_from_file<T: ValidatedConfig>(path: &Path) -> Result<T> {
    config_from_json(&read_config_text(path)?, path)
}

/// Range and consistency checks of one config file; errors name the file and the key.
pub(crate) struct ConfigChecker {
    path: PathBuf,
    /// Prefix of the keys (`"seanet."`), empty at the top level.
    prefix: &'static str,
}

impl ConfigChecker {
    pub(crate) fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            prefix: "",
        }
    }

    /// The same file, keys under `prefix` (e.g. `"transformer."`).
    pub(crate) fn nested(&self, prefix: &'static str) -> Self {
        Self {
            path: self.path.clone(),
            prefix,
        }
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// `min <= value <= max`.
    pub(crate) fn count(&self, key: &str, value: usize, min: usize, max: usize) -> Result<()> {
        if (min..=max).contains(&value) {
            return Ok(());
        }
        Err(LoaderError::ConfigOutOfRange {
            path: self.path.clone(),
            key: self.key(key),
            value: value.to_string(),
            expected: format!("{min} to {max}"),
        })
    }

    /// A finite `value` with `min <= value <= max`.
    pub(crate) fn real(&self, key: &str, value: f64, min: f64, max: f64) -> Result<()> {
        if value.is_finite() && (min..=max).contains(&value) {
            return Ok(());
        }
        Err(LoaderError::ConfigOutOfRange {
            path: self.path.clone(),
            key: self.key(key),
            value: value.to_string(),
            expected: format!("a finite number from {min} to {max}"),
        })
    }

    /// A finite `value` with `0 < value <= max` (said as such: `f64::MIN_POSITIVE` as a lower
    /// bound would print as 300 zeros).
    pub(crate) fn positive_real(&self, key: &str, value: f64, max: f64) -> Result<()> {
        if value.is_finite() && value > 0.0 && value <= max {
            return Ok(());
        }
        Err(LoaderError::ConfigOutOfRange {
            path: self.path.clone(),
            key: self.key(key),
            value: value.to_string(),
            expected: format!("a finite positive number at most {max}"),
        })
    }

    /// A setting this engine does not implement: `key` is `value`, `supported` says what is.
    pub(crate) fn unsupported(&self, key: &str, value: String, supported: &str) -> LoaderError {
        LoaderError::ConfigUnsupported {
            path: self.path.clone(),
            key: self.key(key),
            value,
            supported: supported.to_string(),
        }
    }

    /// Fails with `reason` (which names the keys involved) unless `ok`.
    pub(crate) fn ensure(&self, ok: bool, reason: impl FnOnce() -> String) -> Result<()> {
        if ok {
            return Ok(());
        }
        Err(LoaderError::BadConfig {
            path: self.path.clone(),
            reason: reason(),
        })
    }

    /// `Some(v)` when the product of `factors` fits `max`, else an error naming `what`.
    pub(crate) fn product(&self, what: &str, factors: &[u64], max: u64) -> Result<u64> {
        let total = factors
            .iter()
            .try_fold(1u64, |acc, &f| acc.checked_mul(f))
            .filter(|&t| t <= max);
        total.ok_or_else(|| LoaderError::BadConfig {
            path: self.path.clone(),
            reason: format!(
                "{what} would be {}, above this engine's limit of {max}",
                describe_product(factors)
            ),
        })
    }
}

/// `a x b x c (= n)`, or `a x b x c (more than 2^64)` when it overflows.
fn describe_product(factors: &[u64]) -> String {
    let shown: Vec<String> = factors.iter().map(u64::to_string).collect();
    let total = factors.iter().try_fold(1u64, |acc, &f| acc.checked_mul(f));
    match total {
        Some(t) => format!("{} = {t}", shown.join(" x ")),
        None => format!("{} (more than 2^64)", shown.join(" x ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_names_file_key_value_and_limits() {
        let c = ConfigChecker::new(Path::new("cfg.json")).nested("transformer.");
        let e = c
            .count("context", 1_000_000_000_000, 1, 65_536)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cfg.json: config key `transformer.context` is 1000000000000, expected 1 to 65536"
        );
        let e = c.real("max_period", f64::NAN, 1.0, 1e9).unwrap_err();
        assert!(
            e.to_string().contains("`transformer.max_period` is NaN"),
            "{e}"
        );
        assert!(c.real("max_period", 1e4, 1.0, 1e9).is_ok());
        let e = c
            .product("the KV cache", &[u64::MAX, 2], u64::MAX)
            .unwrap_err();
        assert!(e.to_string().contains("more than 2^64"), "{e}");
        assert_eq!(c.product("x", &[3, 4], 12).unwrap(), 12);
    }

    #[test]
    fn parse_errors_name_the_key() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Inner {
            ratios: Vec<usize>,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Outer {
            seanet: Inner,
        }
        let e = parse_json::<Outer>(r#"{"seanet": {"ratios": [8, "six"]}}"#, Path::new("m.json"))
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("`seanet.ratios[1]`") && msg.contains("m.json"),
            "{msg}"
        );
        let e = parse_json::<Outer>(
            r#"{"seanet": {"ratios": []}} trailing"#,
            Path::new("m.json"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("trailing"), "{e}");
    }

    #[test]
    fn devices_and_huge_files_are_not_read_to_the_end() {
        let e = read_config_text(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/dev/zero") && e.contains("too large for a JSON config"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let e = read_config_text(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let bin = dir.path().join("c.json");
        std::fs::write(&bin, [b'{', 0xff, b'}']).unwrap();
        let e = read_config_text(&bin).unwrap_err().to_string();
        assert!(e.contains("not UTF-8"), "{e}");
    }
}
