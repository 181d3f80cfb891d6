//! Text-to-speech configs (Kyutai's TTS: `model_type` "tts", `tts_config`, cross-attention on
//! the speaker embeddings, the muxed second text stream): the tiny-tts fixture's config parses
//! with its values and its weights load under the canonical names, every stored tensor used; a
//! key that contradicts the model type or is out of range is refused naming the key.

mod common;

use moshi_loader::{load_lm_weights, LmConfig, WeightMode};

/// The tiny-tts config with `edit` applied, parsed.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> moshi_loader::Result<LmConfig> {
    common::edited_fixture_config("tiny-tts", edit)
}

/// The error of an edited config, which must name the file and `needles`.
fn refused(edit: impl FnOnce(&mut serde_json::Value), needles: &[&str]) {
    common::refused_fixture_config("tiny-tts", edit, needles)
}

#[test]
fn the_fixture_config_is_text_to_speech() {
    let cfg = edited(|_| {}).unwrap();
    assert!(cfg.is_text_to_speech());
    assert!(cfg.cross_attention && cfg.demux_second_stream);
    assert_eq!((cfg.n_q, cfg.dep_q, cfg.user_codebooks()), (32, 32, 0));
    let tts = cfg.tts_config.clone().unwrap();
    assert_eq!((tts.delay_steps(), tts.second_stream_ahead), (16, 2));
    assert_eq!(tts.max_speakers(), 5);
    let id = cfg.model_id.clone().unwrap();
    assert_eq!(id.voice_suffix(), ".f00d4040@12.safetensors");
    assert_eq!(cfg.max_text_input(), 385 * 385 - 1);
    let fuser = cfg.fuser.clone().unwrap();
    assert_eq!(fuser.cross, ["speaker_wavs"]);
    assert!(fuser.cross_attention_pos_emb);
    assert_eq!(cfg.text_card_out, None);
    assert!(cfg.unknown.is_empty(), "{:?}", cfg.unknown.keys());
}

#[test]
fn the_fixture_weights_load_every_stored_tensor() {
    let cfg = edited(|_| {}).unwrap();
    let path = moshi_test_support::fixture("tiny-tts", "model.safetensors");
    let map = load_lm_weights(&path, &cfg, WeightMode::Native).unwrap();
    for name in [
        "text_emb.out1",
        "text_emb.out2",
        "depformer.0.emb.out1",
        "depformer.0.emb.out2",
        "depformer.0.emb.low_rank",
        "transformer.layers.1.norm_cross",
        "transformer.layers.1.norm_cross.bias",
        "transformer.layers.1.cross_attention.in_proj",
        "transformer.layers.0.cross_attention.out_proj",
        "condition_provider.conditioners.speaker_wavs.output_proj",
        "condition_provider.conditioners.speaker_wavs.learnt_padding",
        "condition_provider.conditioners.cfg.embed",
    ] {
        assert!(map.names().any(|n| n == name), "{name} missing");
    }
}

#[test]
fn contradicting_keys_are_refused_naming_the_key() {
    refused(
        |v| {
            v["dep_q"] = 8.into();
            v.as_object_mut()
                .unwrap()
                .remove("depformer_weights_per_step_schedule");
        },
        &["dep_q", "dep_q = n_q"],
    );
    refused(
        |v| {
            v.as_object_mut().unwrap().remove("tts_config");
        },
        &["tts_config", "audio_delay"],
    );
    refused(
        |v| v["tts_config"]["audio_delay"] = (-1.0).into(),
        &["tts_config.audio_delay"],
    );
    refused(
        |v| v["tts_config"]["multistream"] = true.into(),
        &["tts_config.multistream"],
    );
    refused(
        |v| v["cross_attention"] = false.into(),
        &["cross_attention"],
    );
    refused(
        |v| v["demux_second_stream"] = false.into(),
        &["demux_second_stream", "second_stream_ahead"],
    );
    refused(|v| v["model_type"] = "hibiki".into(), &["cross_attention"]);
    refused(
        |v| v["conditioners"]["speaker_wavs"]["type"] = "lut".into(),
        &["speaker_wavs"],
    );
}
