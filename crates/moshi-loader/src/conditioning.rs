//! The conditioning part of Kyutai's `config.json` (Hibiki, TTS): `conditioners` (LUT
//! conditioners: a value picks a row of `embed`, projected to the model width by `output_proj`;
//! tensor conditioners: a given `[T, dim]` tensor projected by `output_proj`, the TTS's speaker
//! embeddings) and `fuser` (`sum`: the LUT vectors are added to the temporal input at every step;
//! `cross`: the tensors are the source of the temporal layers' cross-attention), checked once
//! when the config is read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::limits::{MAX_CONDITIONER_BINS, MAX_CONDITIONER_DIM};

/// One entry of `conditioners`: `{"type": "lut", "lut": {...}}` (Kyutai's form: the options sit
/// under a key named after the type).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ConditionerConfig {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lut: Option<LutConditionerConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor: Option<TensorConditionerConfig>,
    /// Options of other conditioner types (refused by [`validate_conditioning`]).
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// A lookup-table conditioner (`moshi/conditioners/text.py` LUTConditioner, tokenizer "noop").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LutConditionerConfig {
    /// Rows of `embed` are `n_bins + 1` (the last one is the padding index).
    pub n_bins: usize,
    /// Width of `embed` (the input of `output_proj`).
    pub dim: usize,
    pub tokenizer: String,
    /// The values a condition may take; value `i` selects row `i` of `embed`.
    #[serde(default)]
    pub possible_values: Option<Vec<String>>,
    /// Other options (`init_scale` is training-only); kept, never used.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// A tensor conditioner (`moshi/conditioners/tensors.py` TensorConditioner): the given tensor's
/// width.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TensorConditionerConfig {
    pub dim: usize,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// `fuser`: how each conditioner enters the model: `sum` (Hibiki, TTS) and `cross` (TTS).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FuserConfig {
    #[serde(default)]
    pub sum: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cross: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prepend: Vec<String>,
    /// Sinusoidal position embeddings added to the cross-attention source.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cross_attention_pos_emb: bool,
    /// Their scale; Kyutai's default 1.
    #[serde(default = "default_pos_emb_scale", skip_serializing_if = "is_one")]
    pub cross_attention_pos_emb_scale: f64,
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

fn default_pos_emb_scale() -> f64 {
    1.0
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

impl Default for FuserConfig {
    fn default() -> Self {
        Self {
            sum: Vec::new(),
            cross: Vec::new(),
            prepend: Vec::new(),
            cross_attention_pos_emb: false,
            cross_attention_pos_emb_scale: default_pos_emb_scale(),
            unknown: BTreeMap::new(),
        }
    }
}

impl ConditionerConfig {
    /// The LUT options (present once the config is validated, for a `lut` conditioner).
    pub fn lut(&self) -> Option<&LutConditionerConfig> {
        self.lut.as_ref()
    }

    /// The tensor options (present once the config is validated, for a `tensor` conditioner).
    pub fn tensor(&self) -> Option<&TensorConditionerConfig> {
        self.tensor.as_ref()
    }
}

impl LutConditionerConfig {
    /// Rows of the `embed` table.
    pub fn rows(&self) -> usize {
        self.n_bins + 1
    }

    /// Row of `embed` selected by `value`, `None` when the value is not one of `possible_values`.
    pub fn row_of(&self, value: &str) -> Option<usize> {
        self.possible_values
            .as_ref()?
            .iter()
            .position(|v| v == value)
    }
}

/// Checks what the model relies on: every LUT conditioner has a `noop` tokenizer and its possible
/// values and is summed into the input; every tensor conditioner is the cross-attention source;
/// nothing is prepended. The reason names the key.
pub fn validate_conditioning(
    conditioners: &BTreeMap<String, ConditionerConfig>,
    fuser: Option<&FuserConfig>,
) -> std::result::Result<(), String> {
    for (name, c) in conditioners {
        match c.kind.as_str() {
            "lut" => validate_lut(name, c.lut.as_ref())?,
            "tensor" => validate_tensor(name, c.tensor.as_ref())?,
            other => {
                return Err(format!(
                    "conditioners.{name}: type `{other}` is not supported (expected `lut` or `tensor`, as in Kyutai's Hibiki and TTS configs)"
                ))
            }
        }
    }
    let empty = FuserConfig::default();
    let fuser = fuser.unwrap_or(&empty);
    if let Some(n) = fuser.prepend.first() {
        return Err(format!(
            "fuser.prepend [`{n}`]: only `sum` and `cross` fusion are supported (Hibiki's and the TTS's)"
        ));
    }
    for (method, names, kind) in [
        ("sum", &fuser.sum, "lut"),
        ("cross", &fuser.cross, "tensor"),
    ] {
        for n in names {
            let Some(c) = conditioners.get(n) else {
                return Err(format!(
                    "fuser.{method} names `{n}`, which is not in `conditioners` ({:?})",
                    conditioners.keys().collect::<Vec<_>>()
                ));
            };
            if c.kind != kind {
                return Err(format!(
                    "fuser.{method} names `{n}`, a `{}` conditioner: only `{kind}` conditioners are fused by {method}",
                    c.kind
                ));
            }
        }
    }
    if let Some(n) = conditioners
        .keys()
        .find(|n| !fuser.sum.contains(n) && !fuser.cross.contains(n))
    {
        return Err(format!(
            "conditioner `{n}` is in neither fuser.sum ({:?}) nor fuser.cross ({:?}): every conditioner must enter the model",
            fuser.sum, fuser.cross
        ));
    }
    let scale = fuser.cross_attention_pos_emb_scale;
    if !(scale.is_finite() && scale.abs() <= 1e6) {
        return Err(format!(
            "fuser.cross_attention_pos_emb_scale is {scale}, expected a finite number"
        ));
    }
    Ok(())
}

fn validate_tensor(
    name: &str,
    tensor: Option<&TensorConditionerConfig>,
) -> std::result::Result<(), String> {
    let Some(t) = tensor else {
        return Err(format!(
            "conditioners.{name}: type `tensor` needs its options under `tensor` ({{\"dim\"}})"
        ));
    };
    if !(1..=MAX_CONDITIONER_DIM).contains(&t.dim) {
        return Err(format!(
            "conditioners.{name}.tensor.dim is {}, expected 1 to {MAX_CONDITIONER_DIM}",
            t.dim
        ));
    }
    Ok(())
}

fn validate_lut(name: &str, lut: Option<&LutConditionerConfig>) -> std::result::Result<(), String> {
    let Some(lut) = lut else {
        return Err(format!(
            "conditioners.{name}: type `lut` needs its options under `lut` ({{\"n_bins\", \"dim\", \"tokenizer\", \"possible_values\"}})"
        ));
    };
    if lut.tokenizer != "noop" {
        return Err(format!(
            "conditioners.{name}.lut.tokenizer: expected `noop`, got `{}`",
            lut.tokenizer
        ));
    }
    for (key, value, max) in [
        ("n_bins", lut.n_bins, MAX_CONDITIONER_BINS),
        ("dim", lut.dim, MAX_CONDITIONER_DIM),
    ] {
        if !(1..=max).contains(&value) {
            return Err(format!(
                "conditioners.{name}.lut.{key} is {value}, expected 1 to {max}"
            ));
        }
    }
    let Some(values) = &lut.possible_values else {
        return Err(format!(
            "conditioners.{name}.lut.possible_values is missing (hashed values are not supported)"
        ));
    };
    if values.is_empty() || values.len() > lut.n_bins {
        return Err(format!(
            "conditioners.{name}.lut.possible_values has {} values, expected 1 to n_bins = {}",
            values.len(),
            lut.n_bins
        ));
    }
    if let Some((i, v)) = values
        .iter()
        .enumerate()
        .find(|(i, v)| values[..*i].contains(v))
    {
        return Err(format!(
            "conditioners.{name}.lut.possible_values: value `{v}` (index {i}) appears twice"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(conditioners: &str, fuser: &str) -> std::result::Result<(), String> {
        let c: BTreeMap<String, ConditionerConfig> = serde_json::from_str(conditioners).unwrap();
        let f: Option<FuserConfig> = serde_json::from_str(fuser).unwrap();
        validate_conditioning(&c, f.as_ref())
    }

    const HIBIKI: &str = r#"{"description": {"type": "lut", "lut": {"n_bins": 31, "dim": 16,
        "tokenizer": "noop", "possible_values": ["very_bad", "bad", "neutral", "good", "very_good"]}}}"#;

    #[test]
    fn hibiki_conditioning_is_accepted_and_values_map_to_rows() {
        parse(HIBIKI, r#"{"sum": ["description"]}"#).unwrap();
        let c: BTreeMap<String, ConditionerConfig> = serde_json::from_str(HIBIKI).unwrap();
        let lut = c["description"].lut().unwrap();
        assert_eq!(lut.rows(), 32);
        assert_eq!(lut.row_of("very_good"), Some(4));
        assert_eq!(lut.row_of("very_bad"), Some(0));
        assert_eq!(lut.row_of("excellent"), None);
    }

    #[test]
    fn unsupported_conditioning_is_refused_naming_the_key() {
        let err = |c: &str, f: &str| parse(c, f).unwrap_err();
        assert!(err(HIBIKI, "null").contains("in neither fuser.sum"));
        assert!(err(HIBIKI, r#"{"sum": ["description"], "cross": ["x"]}"#)
            .contains("fuser.cross names `x`"));
        assert!(
            err(HIBIKI, r#"{"sum": ["description"], "prepend": ["x"]}"#).contains("fuser.prepend")
        );
        assert!(err(HIBIKI, r#"{"cross": ["description"]}"#).contains("only `tensor`"));
        assert!(err("{}", r#"{"sum": ["description"]}"#).contains("fuser.sum names `description`"));
        assert!(err(
            r#"{"d": {"type": "tensor", "tensor": {"dim": 4}}}"#,
            r#"{"sum": ["d"]}"#
        )
        .contains("only `lut`"));
        parse(
            r#"{"d": {"type": "tensor", "tensor": {"dim": 4}}}"#,
            r#"{"cross": ["d"], "cross_attention_pos_emb": true}"#,
        )
        .unwrap();
        assert!(
            err(r#"{"d": {"type": "tensor"}}"#, r#"{"cross": ["d"]}"#).contains("under `tensor`")
        );
        assert!(err(r#"{"d": {"type": "text"}}"#, r#"{"sum": ["d"]}"#).contains("type `text`"));
        assert!(err(r#"{"d": {"type": "lut"}}"#, r#"{"sum": ["d"]}"#).contains("under `lut`"));
        let lut = |body: &str| format!(r#"{{"d": {{"type": "lut", "lut": {body}}}}}"#);
        let sum = r#"{"sum": ["d"]}"#;
        assert!(err(
            &lut(r#"{"n_bins": 2, "dim": 4, "tokenizer": "whitespace", "possible_values": ["a"]}"#),
            sum
        )
        .contains("tokenizer"));
        assert!(
            err(&lut(r#"{"n_bins": 2, "dim": 4, "tokenizer": "noop"}"#), sum)
                .contains("possible_values is missing")
        );
        assert!(err(
            &lut(r#"{"n_bins": 1, "dim": 4, "tokenizer": "noop", "possible_values": ["a", "b"]}"#),
            sum
        )
        .contains("2 values"));
        assert!(err(
            &lut(r#"{"n_bins": 3, "dim": 4, "tokenizer": "noop", "possible_values": ["a", "a"]}"#),
            sum
        )
        .contains("appears twice"));
        assert!(err(
            &lut(r#"{"n_bins": 3, "dim": 0, "tokenizer": "noop", "possible_values": ["a"]}"#),
            sum
        )
        .contains("dim is 0, expected 1 to"));
    }
}
