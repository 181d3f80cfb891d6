//! What a config's optional keys mean when set and when left out, as in Kyutai's loaders: the
//! generation settings of `lm_gen_config`, and the refusal of settings this engine does not run.

use std::path::Path;

use moshi_loader::config::MOSHIKO_7B_JSON;
use moshi_loader::{LmConfig, LmGenSampling};
use serde_json::json;

/// The built-in 7B config with `edit` applied, parsed and validated.
fn edited_7b(edit: impl FnOnce(&mut serde_json::Value)) -> moshi_loader::Result<LmConfig> {
    let mut v: serde_json::Value = serde_json::from_str(MOSHIKO_7B_JSON).unwrap();
    edit(&mut v);
    LmConfig::from_json_str(&v.to_string(), Path::new("edited-config.json"))
}

#[test]
fn lm_gen_config_sampling_settings_are_read() {
    assert_eq!(
        LmConfig::moshiko_7b().lm_gen_sampling(),
        LmGenSampling::default()
    );
    let cfg = edited_7b(|v| {
        v["lm_gen_config"] = json!({
            "temp": 0.6, "temp_text": 0.0, "top_k": 100, "top_k_text": 0, "use_sampling": false,
            "cfg_coef": 2.0
        })
    })
    .unwrap();
    assert_eq!(
        cfg.lm_gen_sampling(),
        LmGenSampling {
            use_sampling: Some(false),
            temp_audio: Some(0.6),
            temp_text: Some(0.0),
            top_k_audio: Some(100),
            top_k_text: Some(0),
        }
    );
    let partial = edited_7b(|v| v["lm_gen_config"] = json!({"temp_text": 0.5})).unwrap();
    assert_eq!(
        partial.lm_gen_sampling(),
        LmGenSampling {
            temp_text: Some(0.5),
            ..LmGenSampling::default()
        }
    );
}

#[test]
fn bad_lm_gen_config_sampling_values_name_the_key_expected_and_got() {
    let cases = [
        (json!({"temp": -0.1}), "lm_gen_config.temp", "-0.1"),
        (
            json!({"temp_text": "hot"}),
            "lm_gen_config.temp_text",
            "\"hot\"",
        ),
        (json!({"top_k": -5}), "lm_gen_config.top_k", "-5"),
        (
            json!({"top_k_text": 2.5}),
            "lm_gen_config.top_k_text",
            "2.5",
        ),
        (
            json!({"use_sampling": "no"}),
            "lm_gen_config.use_sampling",
            "\"no\"",
        ),
        (json!([0.7]), "lm_gen_config", "[0.7]"),
    ];
    for (gen, key, got) in cases {
        let err = edited_7b(|v| v["lm_gen_config"] = gen.clone())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("edited-config.json") && err.contains(key) && err.contains(got),
            "{gen}: {err}"
        );
        assert!(
            err.contains("expected") || err.contains("must be"),
            "{gen}: {err}"
        );
    }
}

#[test]
fn lora_fine_tunes_are_refused_naming_the_key() {
    for (gen, key, got) in [
        (json!({"lora": true, "lora_rank": 128}), "lora", "true"),
        (
            json!({"lora_name": "lora.safetensors"}),
            "lora_name",
            "lora.safetensors",
        ),
    ] {
        let err = edited_7b(|v| {
            for (k, val) in gen.as_object().unwrap() {
                v[k] = val.clone();
            }
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("edited-config.json")
                && err.contains(&format!("`{key}`"))
                && err.contains(got)
                && err.contains("LoRA adapters are not supported"),
            "{gen}: {err}"
        );
    }
    // No adapter: the LoRA keys then change nothing, in Kyutai's loader as here.
    let base = edited_7b(|v| {
        v["lora"] = json!(false);
        v["lora_rank"] = json!(128);
        v["lora_scaling"] = json!(2.0);
    })
    .unwrap();
    assert!(base.unknown.contains_key("lora_rank"));
}

#[test]
fn depformer_feedforward_defaults_to_hidden_scale_times_depformer_dim() {
    let cfg = edited_7b(|v| v["depformer_dim_feedforward"] = json!(null)).unwrap();
    assert_eq!(cfg.depformer_feedforward(), 4224);
    assert_eq!(cfg.depformer_hidden_dim(), 2816);
    let absent = edited_7b(|v| {
        v.as_object_mut()
            .unwrap()
            .remove("depformer_dim_feedforward");
    })
    .unwrap();
    assert_eq!(absent.depformer_hidden_dim(), 2816);
}

#[test]
fn gated_widths_follow_kyutai_activation_gating() {
    // The 7B's widths: 2 x 16896 / 3 and 2 x 4224 / 3.
    let base = LmConfig::moshiko_7b();
    assert_eq!(
        (base.hidden_dim(), base.depformer_hidden_dim()),
        (11264, 2816)
    );
    // A feed-forward of exactly 4 x dim takes 21 x dim / 8, not 2 x 4 x dim / 3.
    let four = edited_7b(|v| {
        v["hidden_scale"] = json!(4.0);
        v["depformer_dim_feedforward"] = json!(4096);
    })
    .unwrap();
    assert_eq!(
        (four.hidden_dim(), four.depformer_hidden_dim()),
        (21 * 4096 / 8, 21 * 1024 / 8)
    );
    let derived = edited_7b(|v| {
        v["hidden_scale"] = json!(4.0);
        v["depformer_dim_feedforward"] = json!(null);
    })
    .unwrap();
    assert_eq!(derived.depformer_hidden_dim(), 2688);
    assert_eq!(moshi_loader::config::gated_hidden_dim(64, 192), 128);
}

#[test]
fn absent_positional_embeddings_take_kyutai_default_sin_which_is_refused() {
    for key in ["positional_embedding", "depformer_pos_emb"] {
        for edit in [None, Some(json!("sin"))] {
            let err = edited_7b(|v| match &edit {
                Some(value) => v[key] = value.clone(),
                None => {
                    v.as_object_mut().unwrap().remove(key);
                }
            })
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("edited-config.json")
                    && err.contains(&format!("`{key}` is sin"))
                    && err.contains("not implemented"),
                "{key} {edit:?}: {err}"
            );
        }
    }
    // Kyutai's configs set both keys; the bundled ones still load.
    let root = moshi_test_support::repo_root();
    for path in [
        "configs/moshiko-7b.json",
        "configs/hibiki-m.json",
        "assets/tiny-a/config.json",
        "assets/tiny-hibiki/config.json",
        "configs/stt-1b-en_fr.json",
        "configs/stt-2.6b-en.json",
        "assets/tiny-stt/config.json",
        "assets/tiny-stt-2b6/config.json",
    ] {
        LmConfig::from_file(root.join(path)).unwrap();
    }
}

/// Hibiki 2B's depformer keys: a schedule of one weight set per step, every set used, and a
/// positive low rank; each refusal names the key.
#[test]
fn depformer_schedules_and_low_ranks_are_checked() {
    let ok = edited_7b(|v| {
        v["depformer_weights_per_step_schedule"] = json!([0, 1, 2, 3, 3, 4, 4, 4]);
        v["depformer_low_rank_embeddings"] = json!(128);
    })
    .unwrap();
    assert_eq!(ok.depformer_weight_sets(), 5);
    assert_eq!(
        (0..8)
            .map(|k| ok.depformer_weight_set(k))
            .collect::<Vec<_>>(),
        [0, 1, 2, 3, 3, 4, 4, 4]
    );
    assert_eq!(ok.depformer_emb_width(), 128);
    assert!(
        ok.unknown.is_empty(),
        "both keys are read: {:?}",
        ok.unknown
    );
    for (key, value, says) in [
        (
            "depformer_weights_per_step_schedule",
            json!([0, 1, 2]),
            "8 entries",
        ),
        (
            "depformer_weights_per_step_schedule",
            json!([0, 1, 2, 3, 3, 5, 5, 5]),
            "every weight set",
        ),
        (
            "depformer_low_rank_embeddings",
            json!(0),
            "depformer_low_rank_embeddings",
        ),
    ] {
        let err = edited_7b(|v| v[key] = value.clone())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(key) && err.contains(says),
            "{key} {value}: {err}"
        );
    }
}

/// Keys of Kyutai's configs that change the architecture in ways moshi-rs does not implement
/// are refused, naming the key, unless they hold the value that changes nothing.
#[test]
fn unimplemented_architecture_keys_are_refused_unless_neutral() {
    let neutral = edited_7b(|v| {
        v["kv_repeat"] = json!(1);
        v["depformer_norm"] = json!(null);
        v["demux_second_stream"] = json!(false);
        v["cross_attention"] = json!(false);
        v["text_card_out"] = json!(32000);
    });
    assert!(neutral.is_ok(), "{:?}", neutral.err());
    for (key, value) in [
        ("depformer_norm", json!("rms_norm")),
        ("text_card_out", json!(8000)),
    ] {
        let err = edited_7b(|v| v[key] = value.clone())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("`{key}`")) && err.contains("not implemented"),
            "{key} {value}: {err}"
        );
    }
    // The TTS's keys, in a model that is not text to speech.
    for key in ["demux_second_stream", "cross_attention"] {
        let err = edited_7b(|v| v[key] = json!(true)).unwrap_err().to_string();
        assert!(
            err.contains(&format!("`{key}`")) && err.contains("text-to-speech"),
            "{key}: {err}"
        );
    }
}

/// Hibiki-Zero's keys: grouped-query attention (inherited by the depformer unless
/// `depformer_kv_repeat` says otherwise), `rope_concat`, the depformer's LayerNorm.
#[test]
fn hibiki_zero_keys_are_read_and_bad_kv_repeat_is_refused_naming_the_key() {
    let cfg = edited_7b(|v| {
        v["kv_repeat"] = json!(2);
        v["positional_embedding"] = json!("rope_concat");
        v["depformer_norm"] = json!("layer_norm");
    })
    .unwrap();
    assert_eq!((cfg.kv_repeat, cfg.depformer_kv_repeat()), (2, 2));
    assert_eq!((cfg.kv_dim(), cfg.depformer_kv_dim()), (2048, 512));
    assert_eq!(cfg.positional_embedding.name(), "rope_concat");
    let own = edited_7b(|v| {
        v["kv_repeat"] = json!(4);
        v["depformer_kv_repeat"] = json!(1);
    })
    .unwrap();
    assert_eq!((own.kv_dim(), own.depformer_kv_dim()), (1024, 1024));
    for (key, value, expect) in [
        (
            "kv_repeat",
            json!(3),
            "kv_repeat 3 does not divide num_heads 32",
        ),
        ("kv_repeat", json!(0), "`kv_repeat`"),
        ("kv_repeat", json!(64), "`kv_repeat`"),
        (
            "depformer_kv_repeat",
            json!(5),
            "depformer_kv_repeat 5 does not divide",
        ),
    ] {
        let err = edited_7b(|v| v[key] = value.clone())
            .unwrap_err()
            .to_string();
        assert!(err.contains(expect), "{key} {value}: {err}");
    }
}
