//! Hibiki configs: `configs/hibiki-m.json` (Kyutai's `rust/s2st-1b.toml` in config.json form) and
//! the tiny-hibiki fixture's config parse, are translation models with the description
//! conditioner, and bad conditioning or guidance keys are errors naming the file and the key.

mod common;

use std::path::{Path, PathBuf};

use common::hibiki_config;
use moshi_loader::LmConfig;

fn hibiki_m_path() -> PathBuf {
    moshi_test_support::repo_root().join("configs/hibiki-m.json")
}

#[test]
fn hibiki_m_config_has_kyutai_published_shapes() {
    let cfg = LmConfig::from_file(hibiki_m_path()).unwrap();
    assert!(cfg.is_conditioned() && cfg.is_translation());
    assert_eq!(cfg.model_type.as_deref(), Some("hibiki"));
    assert_eq!((cfg.dim, cfg.num_layers, cfg.num_heads), (2048, 16, 16));
    assert_eq!(
        (cfg.text_card, cfg.card, cfg.n_q, cfg.dep_q),
        (48000, 2048, 16, 8)
    );
    assert_eq!(
        (
            cfg.depformer_dim,
            cfg.depformer_num_layers,
            cfg.depformer_num_heads
        ),
        (1024, 6, 16)
    );
    // dim_feedforward 8192 / 4096 in the TOML: SiLU-gated widths 5632 and 2816.
    assert_eq!((cfg.hidden_dim(), cfg.depformer_hidden_dim()), (5632, 2816));
    assert_eq!(cfg.max_period, 100_000.0);
    assert_eq!(cfg.max_delay(), 2);
    assert_eq!(cfg.delays[1..9], [0, 2, 2, 2, 2, 2, 2, 2]);
    assert_eq!(cfg.delays[9..], [0, 2, 2, 2, 2, 2, 2, 2]);
    let lut = cfg.conditioners["description"].lut().unwrap();
    assert_eq!((lut.n_bins, lut.dim), (31, 16));
    assert_eq!(lut.row_of("very_good"), Some(4));
    assert_eq!(cfg.fuser.as_ref().unwrap().sum, vec!["description"]);
    // 1.80 billion parameters (embeddings, text head, 16 layers, depformer, conditioner).
    assert_eq!(cfg.parameter_count(), 1_799_907_840);
    assert_eq!(cfg.default_cfg_coef(), 1.0);
}

#[test]
fn a_conditioned_config_must_be_a_hibiki_model() {
    let cfg = hibiki_config();
    assert_eq!(cfg.model_type.as_deref(), Some("hibiki"));
    assert!(cfg.is_translation());
    assert!(!LmConfig::moshiko_7b().is_translation());
    assert!(!LmConfig::moshiko_7b().is_conditioned());
    // Kyutai's run_inference.py refuses a conditioned model that is not Hibiki (an absent
    // model_type is "moshi"), and only Hibiki reads an EOS input as PAD: no third behaviour.
    for (model_type, got) in [
        (None, "absent (Kyutai's default: \"moshi\")"),
        (Some("moshi"), "\"moshi\""),
    ] {
        let err = edited(|v| match model_type {
            Some(t) => v["model_type"] = serde_json::json!(t),
            None => {
                v.as_object_mut().unwrap().remove("model_type");
            }
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("edited-config.json")
                && err.contains(&format!("`model_type` is {got}"))
                && err.contains("hibiki"),
            "{err}"
        );
    }
}

/// The tiny-hibiki config with `edit` applied, parsed.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> moshi_loader::Result<LmConfig> {
    let text = std::fs::read_to_string(common::hibiki_asset("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut v);
    LmConfig::from_json_str(&v.to_string(), Path::new("edited-config.json"))
}

#[test]
fn guidance_default_comes_from_lm_gen_config() {
    let cfg = edited(|v| v["lm_gen_config"] = serde_json::json!({"cfg_coef": 3.0})).unwrap();
    assert_eq!(cfg.default_cfg_coef(), 3.0);
    for bad in [
        serde_json::json!(0.0),
        serde_json::json!(-1),
        serde_json::json!("3"),
    ] {
        let err = edited(|v| v["lm_gen_config"] = serde_json::json!({ "cfg_coef": bad }))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("edited-config.json") && err.contains("lm_gen_config.cfg_coef"),
            "{err}"
        );
        // The range reads as words, not as f64::MIN_POSITIVE's 300 zeros (issue #41, item 18).
        if bad.is_number() {
            assert!(
                err.contains("positive number at most 1000") && !err.contains("0.0000"),
                "{err}"
            );
        }
    }
}

/// A change to a config's JSON.
type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;

#[test]
fn bad_conditioning_keys_are_errors_naming_the_file_and_key() {
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("fuser");
            }),
            "in neither fuser.sum",
        ),
        (
            Box::new(|v| v["conditioners"]["description"]["type"] = "tensor".into()),
            "type `tensor`",
        ),
        (
            Box::new(|v| v["conditioners"]["description"]["lut"]["n_bins"] = 2.into()),
            "5 values",
        ),
        (
            Box::new(|v| v["conditioners"]["description"]["lut"]["dim"] = 100_000.into()),
            "lut.dim is 100000",
        ),
        (
            Box::new(|v| v["fuser"]["prepend"] = serde_json::json!(["description"])),
            "fuser.prepend",
        ),
    ];
    for (edit, needle) in cases {
        let err = edited(edit).unwrap_err().to_string();
        assert!(
            err.contains("edited-config.json") && err.contains(needle),
            "{needle}: {err}"
        );
    }
}

#[test]
fn conditioning_survives_serialization_and_moshi_configs_gain_no_keys() {
    let cfg = hibiki_config();
    let text = serde_json::to_string(&cfg).unwrap();
    assert_eq!(
        LmConfig::from_json_str(&text, Path::new("round-trip.json")).unwrap(),
        cfg
    );
    let moshi = serde_json::to_value(LmConfig::moshiko_7b()).unwrap();
    for key in ["conditioners", "fuser", "model_type"] {
        assert!(moshi.get(key).is_none(), "{key} written for Moshi");
    }
}

/// `configs/hibiki-zero-3b.json`: the release's sizes (see docs/hibiki.md for where each value
/// comes from), grouped-query attention with 8 key/value heads in the temporal transformer and
/// none in the depformer, 16 codebooks over 9 depformer weight sets, no conditioner.
#[test]
fn hibiki_zero_config_has_the_release_shapes() {
    let path = moshi_test_support::repo_root().join("configs/hibiki-zero-3b.json");
    let cfg = LmConfig::from_file(&path).unwrap();
    assert!(cfg.is_translation() && !cfg.is_conditioned());
    assert_eq!((cfg.dim, cfg.num_layers, cfg.num_heads), (2048, 28, 16));
    assert_eq!((cfg.kv_repeat, cfg.kv_dim()), (2, 1024));
    assert_eq!(
        (cfg.depformer_kv_repeat(), cfg.depformer_kv_dim()),
        (1, 1024)
    );
    assert_eq!((cfg.n_q, cfg.dep_q, cfg.text_card), (32, 16, 48000));
    // hidden_scale 6: feed-forward 12288 and 6144, SiLU-gated 8192 and 4096.
    assert_eq!((cfg.hidden_dim(), cfg.depformer_hidden_dim()), (8192, 4096));
    assert_eq!(cfg.depformer_weight_sets(), 9);
    assert_eq!(cfg.positional_embedding.name(), "rope_concat");
    assert_eq!(cfg.depformer_norm.map(|n| n.name()), Some("layer_norm"));
    assert_eq!((cfg.max_delay(), cfg.delays.len()), (2, 33));
}
