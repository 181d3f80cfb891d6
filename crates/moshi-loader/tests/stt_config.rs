//! Speech-to-text configs (Kyutai's STT: `model_type` "stt", `dep_q` 0, `stt_config`, extra
//! heads): the tiny-stt fixtures' and the bundled release configs parse with their values; a
//! key that contradicts the model type or is out of range is refused naming the key.

mod common;

use std::path::Path;

use moshi_loader::{LmConfig, SafetensorsFile};

/// The tiny-stt config with `edit` applied, parsed.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> moshi_loader::Result<LmConfig> {
    common::edited_fixture_config("tiny-stt", edit)
}

/// The error of an edited config, which must name the file and `needles`.
fn refused(edit: impl FnOnce(&mut serde_json::Value), needles: &[&str]) {
    common::refused_fixture_config("tiny-stt", edit, needles)
}

#[test]
fn the_fixture_config_is_speech_to_text() {
    let cfg = edited(|_| {}).unwrap();
    assert!(cfg.is_speech_to_text());
    assert_eq!((cfg.n_q, cfg.dep_q, cfg.user_codebooks()), (32, 0, 32));
    assert_eq!((cfg.extra_heads_num_heads, cfg.extra_heads_dim), (4, 6));
    let stt = cfg.stt();
    assert_eq!((stt.delay_s(), stt.silence_prefix_s()), (0.5, 0.0));
    assert!(cfg.unknown.is_empty(), "{:?}", cfg.unknown.keys());
    // The fixture's weights: 2,342,400 parameters, the extra heads included.
    assert_eq!(cfg.parameter_count(), 2_342_400);
}

#[test]
fn the_2b6_fixture_config_has_no_extra_heads_and_the_2b6_feeding() {
    let path = moshi_test_support::fixture("tiny-stt-2b6", "config.json");
    let cfg = LmConfig::from_file(&path).unwrap();
    assert!(cfg.is_speech_to_text());
    assert_eq!(cfg.extra_heads_num_heads, 0);
    let stt = cfg.stt();
    assert_eq!((stt.delay_s(), stt.silence_prefix_s()), (2.5, 1.0));
    assert!(cfg.unknown.is_empty(), "{:?}", cfg.unknown.keys());
    // `extra_heads_num_heads` 0 (as written there) and absent (as the bundled 2.6B config)
    // are the same model; 4 x 6 x 256 parameters fewer than tiny-stt's.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("extra_heads_num_heads");
    let absent = LmConfig::from_json_str(&v.to_string(), Path::new("config.json")).unwrap();
    assert_eq!(absent.extra_heads_num_heads, 0);
    assert_eq!(absent.parameter_count(), cfg.parameter_count());
    assert_eq!(cfg.parameter_count(), 2_342_400 - 4 * 6 * 256);
}

#[test]
fn a_model_without_a_depformer_must_be_stt_and_the_reverse() {
    refused(
        |v| {
            v.as_object_mut().unwrap().remove("model_type");
        },
        &["model_type", "dep_q", "stt"],
    );
    refused(|v| v["model_type"] = "moshi".into(), &["model_type", "stt"]);
    refused(
        |v| {
            v["dep_q"] = 8.into();
        },
        &["dep_q", "stt"],
    );
}

#[test]
fn stt_values_out_of_range_are_refused_by_key() {
    refused(
        |v| v["stt_config"]["audio_delay_seconds"] = (-0.5).into(),
        &["stt_config.audio_delay_seconds"],
    );
    refused(
        |v| v["stt_config"]["audio_silence_prefix_seconds"] = 1e9.into(),
        &["stt_config.audio_silence_prefix_seconds"],
    );
    refused(
        |v| v["stt_config"]["audio_delay_seconds"] = "0.5".into(),
        &["audio_delay_seconds"],
    );
    refused(
        |v| v["extra_heads_num_heads"] = 100_000.into(),
        &["extra_heads_num_heads"],
    );
    refused(|v| v["extra_heads_dim"] = 0.into(), &["extra_heads_dim"]);
    refused(
        |v| v["text_padding_token_id"] = 384.into(),
        &["text_padding_token_id"],
    );
}

#[test]
fn without_stt_config_the_scripts_defaults_apply() {
    let cfg = edited(|v| {
        v.as_object_mut().unwrap().remove("stt_config");
    })
    .unwrap();
    assert_eq!(
        (cfg.stt().delay_s(), cfg.stt().silence_prefix_s()),
        (5.0, 1.0)
    );
}

#[test]
fn a_file_without_a_depformer_is_read_as_pytorch() {
    let file = SafetensorsFile::open(moshi_test_support::fixture("tiny-stt", "model.safetensors"))
        .unwrap();
    assert_eq!(
        moshi_loader::layout::detect_kind(&file).unwrap(),
        moshi_loader::CheckpointKind::Lm(moshi_loader::LmLayout::PyTorch)
    );
}

/// The bundled configs: shapes from Kyutai's moshi-server TOMLs
/// (`delayed-streams-modeling/configs/config-stt-*-hf.toml`), the rest from the export configs
/// (`moshi/configs/stt_*.json`); see docs/stt.md for what comes from where.
#[test]
fn bundled_configs_have_the_releases_shapes() {
    let root = moshi_test_support::repo_root();
    let one = LmConfig::from_file(root.join("configs/stt-1b-en_fr.json")).unwrap();
    assert!(one.is_speech_to_text() && one.unknown.is_empty());
    assert_eq!(
        (one.n_q, one.dep_q, one.text_card, one.card),
        (32, 0, 8000, 2048)
    );
    assert_eq!((one.num_layers, one.num_heads, one.context), (16, 16, 750));
    assert_eq!((one.extra_heads_num_heads, one.extra_heads_dim), (4, 6));
    assert_eq!(
        (one.stt().delay_s(), one.stt().silence_prefix_s()),
        (0.5, 0.0)
    );
    // hidden 5632 (candle: dim_feedforward 8192 = 4 x dim gives 11 x dim / 4): 989,253,632
    // parameters, 2 bytes each in a bf16 file.
    assert_eq!(one.hidden_dim(), 5632);
    assert_eq!(one.parameter_count(), 989_253_632);
    let big = LmConfig::from_file(root.join("configs/stt-2.6b-en.json")).unwrap();
    assert!(big.is_speech_to_text() && big.unknown.is_empty());
    assert_eq!(
        (big.num_layers, big.num_heads, big.context, big.text_card),
        (48, 32, 375, 4000)
    );
    assert_eq!(big.extra_heads_num_heads, 0);
    assert_eq!(
        (big.stt().delay_s(), big.stt().silence_prefix_s()),
        (2.5, 1.0)
    );
    assert_eq!(big.hidden_dim(), 5632);
}
