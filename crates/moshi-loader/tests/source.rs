//! Model resolution: Kyutai-style folders (with and without config.json), explicit files, and
//! Hub repo ids through a local HF cache (offline) or an unreachable endpoint.

mod common;

use std::path::Path;

use common::asset;
use moshi_loader::hub::HubSettings;
use moshi_loader::{
    LmConfig, LmLayout, LmVariant, LoaderError, MimiConfig, ModelSource, SourceOverrides,
};
use moshi_test_support::tiny_a_dir;

fn copy(name: &str, to: &Path, as_name: &str) {
    std::fs::copy(asset(name), to.join(as_name)).unwrap();
}

#[test]
fn tiny_a_folder_resolves_from_its_config() {
    let r =
        ModelSource::resolve(tiny_a_dir().to_str().unwrap(), &SourceOverrides::default()).unwrap();
    assert_eq!(r.lm_config.dim, 256);
    assert!(r.lm_config_source.ends_with("config.json"));
    assert_eq!(r.lm_weights_path.file_name().unwrap(), "model.safetensors");
    assert_eq!(r.layout, LmLayout::PyTorch);
    assert_eq!(r.mimi_weights_path.file_name().unwrap(), "mimi.safetensors");
    assert_eq!(r.mimi_config.quantizer.n_q, 12);
    assert!(r.mimi_config_source.ends_with("mimi_config.json"));
    assert_eq!(r.tokenizer_path.file_name().unwrap(), "tokenizer.model");
}

#[test]
fn variant_picks_the_quantized_file() {
    for (variant, file) in [
        (LmVariant::Q8, "model.q8.safetensors"),
        (LmVariant::Q4, "model.q4.safetensors"),
    ] {
        let o = SourceOverrides {
            variant: Some(variant),
            ..Default::default()
        };
        let r = ModelSource::resolve(tiny_a_dir().to_str().unwrap(), &o).unwrap();
        assert_eq!(r.lm_weights_path.file_name().unwrap(), file);
        assert_eq!(r.layout, LmLayout::Mlx);
    }
}

#[test]
fn explicit_checkpoint_file_takes_the_rest_from_its_folder() {
    let r = ModelSource::resolve(
        asset("model.q8.safetensors").to_str().unwrap(),
        &SourceOverrides::default(),
    )
    .unwrap();
    assert_eq!(r.lm_weights_path, asset("model.q8.safetensors"));
    assert_eq!(r.layout, LmLayout::Mlx);
    assert_eq!(r.lm_config.dim, 256);
    assert_eq!(r.tokenizer_path.file_name().unwrap(), "tokenizer.model");
}

#[test]
fn legacy_folder_without_configs_uses_the_built_in_ones() {
    let dir = tempfile::tempdir().unwrap();
    copy("model.q4.safetensors", dir.path(), "model.q4.safetensors");
    copy(
        "mimi.safetensors",
        dir.path(),
        "tokenizer-e351c8d8-checkpoint125.safetensors",
    );
    copy("tokenizer.model", dir.path(), "tokenizer_spm_32k_3.model");
    let r =
        ModelSource::resolve(dir.path().to_str().unwrap(), &SourceOverrides::default()).unwrap();
    assert_eq!(r.lm_config, LmConfig::moshiko_7b());
    assert_eq!(r.lm_config_source, "built-in moshiko-7b");
    assert_eq!(r.mimi_config, MimiConfig::v0_1());
    assert_eq!(r.layout, LmLayout::Mlx);
    assert_eq!(
        r.mimi_weights_path.file_name().unwrap(),
        "tokenizer-e351c8d8-checkpoint125.safetensors"
    );
    assert_eq!(
        r.tokenizer_path.file_name().unwrap(),
        "tokenizer_spm_32k_3.model"
    );
}

#[test]
fn files_are_recognised_by_content_and_unknown_config_keys_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    copy("model.safetensors", dir.path(), "weights-a.safetensors");
    copy("mimi.safetensors", dir.path(), "codec.safetensors");
    copy("tokenizer.model", dir.path(), "spm.model");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(asset("config.json")).unwrap()).unwrap();
    let obj = cfg.as_object_mut().unwrap();
    for k in [
        "moshi_name",
        "mimi_name",
        "tokenizer_name",
        "mimi_config_name",
    ] {
        obj.remove(k);
    }
    obj.insert("some_future_key".into(), serde_json::json!({"x": 1}));
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let r =
        ModelSource::resolve(dir.path().to_str().unwrap(), &SourceOverrides::default()).unwrap();
    assert_eq!(
        r.lm_weights_path.file_name().unwrap(),
        "weights-a.safetensors"
    );
    assert_eq!(
        r.mimi_weights_path.file_name().unwrap(),
        "codec.safetensors"
    );
    assert_eq!(r.tokenizer_path.file_name().unwrap(), "spm.model");
    assert_eq!(
        r.lm_config.unknown.get("some_future_key"),
        Some(&serde_json::json!({"x": 1}))
    );
}

#[test]
fn missing_parts_are_named() {
    let dir = tempfile::tempdir().unwrap();
    copy("model.safetensors", dir.path(), "model.safetensors");
    let err = ModelSource::resolve(dir.path().to_str().unwrap(), &SourceOverrides::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Mimi checkpoint") && err.contains("model.safetensors"),
        "{err}"
    );
    let o = SourceOverrides {
        variant: Some(LmVariant::Q4),
        ..Default::default()
    };
    let err = ModelSource::resolve(dir.path().to_str().unwrap(), &o)
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.q4.safetensors"), "{err}");
    let err = ModelSource::resolve("no/such/dir/x", &SourceOverrides::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a Hugging Face repo id"), "{err}");
}

fn hub_settings(cache_dir: &Path, offline: bool) -> HubSettings {
    // Port 9 (discard) on localhost: refused at once, never the real network.
    HubSettings {
        cache_dir: cache_dir.to_path_buf(),
        endpoint: "http://127.0.0.1:9".into(),
        token: None,
        offline,
        progress: false,
    }
}

#[test]
fn hub_repo_resolves_offline_from_the_hf_cache() {
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("models--kyutai--tiny-a");
    let snapshot = repo.join("snapshots").join("0123abcd");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), "0123abcd").unwrap();
    for f in [
        "config.json",
        "mimi_config.json",
        "model.q4.safetensors",
        "mimi.safetensors",
        "tokenizer.model",
    ] {
        copy(f, &snapshot, f);
    }
    let o = SourceOverrides {
        hub: Some(hub_settings(cache.path(), true)),
        ..Default::default()
    };
    let r = ModelSource::resolve("kyutai/tiny-a", &o).unwrap();
    // config.json names model.safetensors, which this snapshot lacks: the q4 file is taken.
    assert_eq!(r.lm_weights_path, snapshot.join("model.q4.safetensors"));
    assert_eq!(r.layout, LmLayout::Mlx);
    assert_eq!(r.tokenizer_path, snapshot.join("tokenizer.model"));

    let err = ModelSource::resolve("kyutai/not-cached", &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("HF_HUB_OFFLINE") && err.contains("local folder"),
        "{err}"
    );
}

#[test]
fn hub_without_network_says_so_and_how_to_use_a_local_folder() {
    let cache = tempfile::tempdir().unwrap();
    let o = SourceOverrides {
        hub: Some(hub_settings(cache.path(), false)),
        ..Default::default()
    };
    let err = ModelSource::resolve("kyutai/moshiko-mlx-q4", &o).unwrap_err();
    assert!(matches!(err, LoaderError::Download { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("kyutai/moshiko-mlx-q4")
            && msg.contains("no network")
            && msg.contains("folder"),
        "{msg}"
    );
}
