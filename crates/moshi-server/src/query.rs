//! The query parameters of `/api/chat` (what Kyutai's web UI sends: `text_temperature`,
//! `text_topk`, `audio_temperature`, `audio_topk`, `pad_mult`, `text_seed`, `audio_seed`,
//! `repetition_penalty_context`, `repetition_penalty`) turned into session settings. Those the
//! engine has are applied; the others are reported back as ignored, never silently dropped.

use std::collections::BTreeMap;

use moshi_model::generator::SamplingConfig;
use serde_json::{json, Map, Value};

use crate::session_engine::SessionSettings;

/// Settings of one session and what became of each query parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRequest {
    pub settings: SessionSettings,
    /// `stats_s=S` (moshi-rs' own page): a metadata message with the session's counters every
    /// S seconds. Without it, counters are sent only when audio is lost.
    pub stats_every_s: Option<f64>,
    /// Parameters the engine cannot apply, with the reason.
    pub ignored: BTreeMap<String, String>,
}

fn number<T: std::str::FromStr>(key: &str, value: &str, expected: &str) -> Result<T, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("query parameter {key}={value:?}: expected {expected}"))
}

fn temperature(key: &str, value: &str) -> Result<f32, String> {
    let t: f32 = number(key, value, "a temperature (a number >= 0)")?;
    if !t.is_finite() || t < 0.0 {
        return Err(format!(
            "query parameter {key}={value:?}: expected a temperature (a finite number >= 0)"
        ));
    }
    Ok(t)
}

impl SessionRequest {
    /// Applies `params` (in order; a repeated key keeps its last value) over the server's
    /// `defaults`. A server started with `--greedy` stays greedy. Errors are sentences for the
    /// client.
    pub fn from_query(
        params: &[(String, String)],
        defaults: &SamplingConfig,
    ) -> Result<Self, String> {
        let mut sampling = defaults.clone();
        let mut ignored = BTreeMap::new();
        let mut stats_every_s = None;
        let mut text_seed: Option<u64> = None;
        let mut audio_seed: Option<u64> = None;
        let last: BTreeMap<&str, &str> = params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let greedy_note = "the server runs greedy (--greedy, or use_sampling: false in the model config's lm_gen_config): argmax everywhere";
        for (&key, &value) in &last {
            match key {
                "text_temperature" | "audio_temperature" | "text_topk" | "audio_topk"
                    if defaults.greedy =>
                {
                    // Still validated, so a typo is reported the same way on every server.
                    if key.ends_with("temperature") {
                        temperature(key, value)?;
                    } else {
                        number::<usize>(key, value, "a whole number >= 0")?;
                    }
                    ignored.insert(key.to_string(), greedy_note.to_string());
                }
                "text_temperature" => sampling.temp_text = temperature(key, value)?,
                "audio_temperature" => sampling.temp_audio = temperature(key, value)?,
                "text_topk" => {
                    sampling.top_k_text = number(key, value, "a whole number >= 0 (0: no top-k)")?
                }
                "audio_topk" => {
                    sampling.top_k_audio = number(key, value, "a whole number >= 0 (0: no top-k)")?
                }
                "text_seed" => text_seed = Some(number(key, value, "a whole number >= 0")?),
                "audio_seed" => audio_seed = Some(number(key, value, "a whole number >= 0")?),
                "seed" => sampling.seed = number(key, value, "a whole number >= 0")?,
                "pad_mult" => {
                    let p: f32 = number(key, value, "a number")?;
                    if p != 0.0 {
                        ignored.insert(
                            key.to_string(),
                            "the engine has no padding multiplier (0, no change, is what it does)"
                                .into(),
                        );
                    }
                }
                "repetition_penalty" => {
                    let p: f32 = number(key, value, "a number")?;
                    if p != 1.0 {
                        ignored.insert(
                            key.to_string(),
                            "the engine has no repetition penalty (1.0, no change, is what it does)"
                                .into(),
                        );
                    }
                }
                "stats_s" => {
                    let every: f64 = number(key, value, "seconds between statistics (0.5 to 60)")?;
                    if !(0.5..=60.0).contains(&every) {
                        return Err(format!(
                            "query parameter {key}={value:?}: expected seconds between statistics (0.5 to 60)"
                        ));
                    }
                    stats_every_s = Some(every);
                }
                "repetition_penalty_context" => {
                    number::<usize>(key, value, "a whole number >= 0")?;
                }
                other => {
                    ignored.insert(other.to_string(), "not a setting of this server".into());
                }
            }
        }
        // One RNG draws text and audio: a pair of seeds becomes one (still reproducible).
        match (text_seed, audio_seed) {
            (Some(t), Some(a)) => sampling.seed = t.wrapping_mul(1 << 32).wrapping_add(a),
            (Some(s), None) | (None, Some(s)) => sampling.seed = s,
            (None, None) => {}
        }
        if sampling.greedy {
            for key in ["text_seed", "audio_seed", "seed"] {
                if last.contains_key(key) {
                    ignored.insert(key.to_string(), greedy_note.to_string());
                }
            }
        }
        Ok(Self {
            settings: SessionSettings { sampling },
            stats_every_s,
            ignored,
        })
    }

    /// The settings in force, with the field names of Kyutai's web UI (its server-info panel
    /// reads them), plus ours.
    pub fn settings_json(&self) -> Map<String, Value> {
        let s = &self.settings.sampling;
        // The f32 as written (0.8, not 0.800000011920929).
        let decimal = |x: f32| json!(x.to_string().parse::<f64>().unwrap_or(x as f64));
        let mut m = Map::new();
        m.insert("text_temperature".into(), decimal(s.temp_text));
        m.insert("text_topk".into(), json!(s.top_k_text));
        m.insert("audio_temperature".into(), decimal(s.temp_audio));
        m.insert("audio_topk".into(), json!(s.top_k_audio));
        m.insert("pad_mult".into(), json!(0.0));
        m.insert("repetition_penalty_context".into(), json!(0));
        m.insert("repetition_penalty".into(), json!(1.0));
        m.insert("seed".into(), json!(s.seed));
        m.insert("greedy".into(), json!(s.greedy));
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Issue #41's class: a client's text reaches the log and the kind-5 escaped, never with
    /// raw control characters (a terminal would act on them).
    #[test]
    fn a_bad_value_is_echoed_escaped() {
        for (key, value) in [
            ("text_temperature", "\u{1b}[2J"),
            ("text_topk", "1\r\nforged log line"),
            ("stats_s", "\u{7}"),
        ] {
            let e =
                SessionRequest::from_query(&params(&[(key, value)]), &SamplingConfig::default())
                    .unwrap_err();
            assert!(!e.chars().any(char::is_control), "{e:?}");
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn the_web_ui_query_is_applied_where_the_engine_can() {
        let q = params(&[
            ("text_temperature", "0.5"),
            ("text_topk", "30"),
            ("audio_temperature", "0.9"),
            ("audio_topk", "200"),
            ("pad_mult", "0"),
            ("text_seed", "7"),
            ("audio_seed", "9"),
            ("repetition_penalty_context", "64"),
            ("repetition_penalty", "1.0"),
        ]);
        let r = SessionRequest::from_query(&q, &SamplingConfig::default()).unwrap();
        let s = &r.settings.sampling;
        assert_eq!((s.temp_text, s.top_k_text), (0.5, 30));
        assert_eq!((s.temp_audio, s.top_k_audio), (0.9, 200));
        assert_eq!(s.seed, (7u64 << 32) + 9);
        assert!(r.ignored.is_empty(), "{:?}", r.ignored);
    }

    #[test]
    fn settings_the_engine_lacks_are_reported_ignored() {
        let q = params(&[
            ("pad_mult", "1.5"),
            ("repetition_penalty", "1.2"),
            ("email", "a@b.c"),
        ]);
        let r = SessionRequest::from_query(&q, &SamplingConfig::default()).unwrap();
        assert_eq!(
            r.ignored.keys().collect::<Vec<_>>(),
            vec!["email", "pad_mult", "repetition_penalty"]
        );
        assert_eq!(r.settings.sampling, SamplingConfig::default());
    }

    #[test]
    fn a_greedy_server_stays_greedy() {
        let q = params(&[("text_temperature", "0.5"), ("seed", "3")]);
        let r = SessionRequest::from_query(&q, &SamplingConfig::greedy()).unwrap();
        assert!(r.settings.sampling.greedy);
        assert_eq!(
            r.settings.sampling.temp_text,
            SamplingConfig::greedy().temp_text
        );
        assert!(r.ignored.contains_key("text_temperature"));
        assert!(r.ignored.contains_key("seed"));
    }

    #[test]
    fn bad_values_name_the_parameter_and_what_was_expected() {
        for (k, v, want) in [
            (
                "text_temperature",
                "hot",
                "text_temperature=\"hot\": expected a temperature",
            ),
            (
                "audio_temperature",
                "-1",
                "audio_temperature=\"-1\": expected a temperature",
            ),
            (
                "audio_temperature",
                "NaN",
                "expected a temperature (a finite number >= 0)",
            ),
            (
                "text_topk",
                "-3",
                "text_topk=\"-3\": expected a whole number",
            ),
            (
                "text_seed",
                "1e3",
                "text_seed=\"1e3\": expected a whole number",
            ),
            ("pad_mult", "x", "pad_mult=\"x\": expected a number"),
            (
                "stats_s",
                "0",
                "stats_s=\"0\": expected seconds between statistics",
            ),
        ] {
            let e = SessionRequest::from_query(&params(&[(k, v)]), &SamplingConfig::default())
                .unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value() {
        let q = params(&[("text_topk", "5"), ("text_topk", "6")]);
        let r = SessionRequest::from_query(&q, &SamplingConfig::default()).unwrap();
        assert_eq!(r.settings.sampling.top_k_text, 6);
    }
}
