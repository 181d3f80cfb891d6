//! `moshi-rs bench` through the binary: bad input gives clear errors; a tiny random-weight run
//! and a tiny checkpoint run write a report whose fields exist and are consistent (no timing
//! thresholds); `--trace` writes a Chrome trace; the plot script reads the report.

use std::process::{Command, Output};

use moshi_test_support::{
    copy_tiny_a_files, read_json, repo_root, run_binary, stderr_text, tiny_a, tiny_a_dir,
};
use serde_json::Value;

/// Runs `moshi-rs bench ARGS` with a small bandwidth probe and one compute thread.
fn bench(args: &[&str]) -> Output {
    let common = [
        "--bandwidth-buffer-mib",
        "32",
        "--threads",
        "1",
        "--warmup",
        "1",
    ];
    run_binary(
        env!("CARGO_BIN_EXE_moshi-rs"),
        &[&["bench"][..], &common, args].concat(),
    )
}

/// `moshi-rs bench ARGS` fails and its error says `expected`.
fn refused(args: &[&str], expected: &str) {
    let out = bench(args);
    assert!(!out.status.success(), "{args:?} should fail");
    let err = stderr_text(&out);
    assert!(err.contains(expected), "{args:?}: {err}");
}

fn tiny_config() -> String {
    tiny_a("config.json").display().to_string()
}

fn num(v: &Value, path: &str) -> f64 {
    let mut cur = v;
    for key in path.split('.') {
        cur = &cur[key];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("`{path}` is not a number: {cur}"))
}

#[test]
fn layers_above_the_config_are_refused() {
    let out = bench(&[
        "--random-weights",
        "--config",
        &tiny_config(),
        "--layers",
        "3",
        "--frames",
        "1",
    ]);
    assert!(!out.status.success());
    let err = stderr_text(&out);
    assert!(
        err.contains("--layers 3 is above the 2 temporal layers") && err.contains("config.json"),
        "{err}"
    );
}

#[test]
fn a_config_that_does_not_parse_is_refused_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("broken-config.json");
    std::fs::write(&bad, "{\"dim\": 256, \"num_layers\": ").unwrap();
    let out = bench(&[
        "--random-weights",
        "--config",
        bad.to_str().unwrap(),
        "--frames",
        "1",
    ]);
    assert!(!out.status.success());
    let err = stderr_text(&out);
    assert!(
        err.contains("broken-config.json") && err.to_lowercase().contains("config"),
        "{err}"
    );
}

#[test]
fn a_quantization_the_checkpoint_lacks_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    copy_tiny_a_files(
        dir.path(),
        &[
            "config.json",
            "mimi_config.json",
            "mimi.safetensors",
            "tokenizer.model",
            "model.safetensors",
        ],
    );
    let out = bench(&[
        "--model",
        dir.path().to_str().unwrap(),
        "--quant",
        "q4",
        "--frames",
        "1",
    ]);
    assert!(!out.status.success());
    let err = stderr_text(&out);
    assert!(
        err.contains("cannot provide --quant q4") && err.contains("model.q4.safetensors"),
        "{err}"
    );
}

#[test]
fn tiny_random_run_writes_a_consistent_report_and_trace() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let trace = dir.path().join("trace.json");
    let out = bench(&[
        "--random-weights",
        "--config",
        &tiny_config(),
        "--frames",
        "3",
        "--quant",
        "q8",
        "--json",
        json.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr_text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("real-time factor") && stdout.contains("lower bound"),
        "{stdout}"
    );

    let r = read_json(&json);
    assert_eq!(r["schema_version"], 3);
    assert_eq!(r["run"]["weights"], "random");
    assert_eq!(r["run"]["quant"], "q8");
    assert_eq!(r["run"]["mimi_weights"], "f32");
    let kernel = r["run"]["quant_kernel"].as_str().unwrap_or_default();
    assert!(
        moshi_kernels::Kernel::from_name(kernel).is_some_and(|k| k.is_available()),
        "quant_kernel {kernel:?}"
    );
    assert_eq!(r["run"]["stage"], "all");
    assert_eq!(
        (
            r["run"]["layers_run"].as_u64(),
            r["run"]["layers_config"].as_u64()
        ),
        (Some(2), Some(2))
    );
    assert!(
        r["extrapolated"].is_null(),
        "nothing to extrapolate at full depth"
    );
    let frames = r["frames"].as_array().unwrap();
    assert_eq!(frames.len(), 3);
    for f in frames {
        let stages = [
            "mimi_encode_ms",
            "lm_temporal_ms",
            "lm_depformer_ms",
            "sampling_ms",
            "mimi_decode_ms",
        ];
        let sum: f64 = stages.iter().map(|s| num(f, s)).sum();
        assert!(stages.iter().all(|s| num(f, s) >= 0.0));
        assert!(num(f, "lm_temporal_ms") > 0.0 && num(f, "mimi_encode_ms") > 0.0);
        assert!(
            num(f, "total_ms") + 1e-9 >= sum,
            "total {} below the sum of stages {sum}",
            num(f, "total_ms")
        );
    }
    for stage in [
        "mimi_encode_ms",
        "lm_temporal_ms",
        "lm_depformer_ms",
        "sampling_ms",
        "mimi_decode_ms",
        "lm_step_ms",
        "total_ms",
    ] {
        let p = &r["stages"][stage];
        let q: Vec<f64> = ["min", "p50", "p95", "p99", "max"]
            .iter()
            .map(|k| num(p, k))
            .collect();
        assert!(
            q.windows(2).all(|w| w[0] <= w[1]),
            "{stage}: percentiles out of order {q:?}"
        );
    }
    let mean_total = num(&r, "stages.total_ms.mean");
    assert!((num(&r, "real_time_factor") - mean_total / 80.0).abs() < 1e-9);
    let probes: Vec<f64> = r["machine"]["read_bandwidth_probes_gbps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(probes.len(), 2);
    assert!(probes.iter().all(|p| *p > 0.0));
    assert_eq!(
        num(&r, "machine.read_bandwidth_gbps"),
        probes.iter().copied().fold(0.0, f64::max)
    );
    if cfg!(target_os = "linux") {
        assert!(num(&r, "machine.peak_memory_bytes") > 1e6);
    }
    // The probe's pages: Linux's setting where the kernel has one, null elsewhere.
    let setting = &r["machine"]["transparent_huge_pages"];
    assert_eq!(
        setting.as_str().map(String::from),
        moshi_kernels::huge_pages::transparent_huge_pages_setting(),
        "{setting}"
    );
    // Bytes: two layers + text head + depformer; q8 with group 64 reads 8.5 bits per weight.
    let w = &r["weights"];
    let read = num(w, "read_per_frame_bytes");
    let layer = num(w, "temporal_layer_bytes");
    assert_eq!(
        read,
        2.0 * layer + num(w, "text_head_bytes") + num(w, "depformer_bytes")
    );
    let (dim, hidden) = (256.0, 704.0);
    let layer_weights = 4.0 * dim * dim + 3.0 * dim * hidden;
    assert!(
        (layer - (layer_weights * 8.5 / 8.0 + 2.0 * 4.0 * dim)).abs() < 1.0,
        "q8 layer bytes {layer}"
    );
    // KV caches: after 1 warm-up frame (2 LM steps), the 3 timed frames attend over 3, 4 and 5
    // positions (tiny-a's context is 16): mean 4 positions of 256 f32 keys and values per layer.
    let kv_layer = num(w, "kv_cache_layer_read_bytes");
    assert_eq!(kv_layer, 2.0 * 4.0 * dim * 4.0);
    assert_eq!(num(w, "kv_cache_read_per_frame_bytes"), 2.0 * kv_layer);
    let bound = num(&r, "bound.lm_bound_ms");
    assert!(
        (bound - (read + 2.0 * kv_layer) / (num(&r, "machine.read_bandwidth_gbps") * 1e6)).abs()
            < 1e-9
    );
    assert!(
        (num(&r, "bound.ratio_to_bound") - num(&r, "stages.lm_step_ms.p50") / bound).abs() < 1e-9
    );

    let trace_events = read_json(&trace);
    let names: Vec<&str> = trace_events
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    for span in [
        "frame",
        "mimi_encode",
        "lm_temporal",
        "lm_temporal_layer",
        "lm_depformer",
        "mimi_decode",
    ] {
        assert!(names.contains(&span), "trace lacks `{span}` spans");
    }

    // The plot script (stdlib Python) turns the report into an SVG, when Python is installed.
    let svg = dir.path().join("bench.svg");
    match Command::new("python3")
        .arg(repo_root().join("scripts/plot_profile.py"))
        .args([json.to_str().unwrap(), "-o", svg.to_str().unwrap()])
        .output()
    {
        Ok(plot) => {
            assert!(
                plot.status.success(),
                "{}",
                String::from_utf8_lossy(&plot.stderr)
            );
            let text = std::fs::read_to_string(&svg).unwrap();
            assert!(
                text.starts_with("<svg")
                    && text.contains("budget 80 ms")
                    && text.contains("lm_temporal")
            );
        }
        Err(e) => eprintln!("python3 not available ({e}); plot script not exercised"),
    }
}

#[test]
fn fewer_layers_are_extrapolated_and_labelled() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = bench(&[
        "--random-weights",
        "--config",
        &tiny_config(),
        "--layers",
        "1",
        "--stage",
        "lm",
        "--frames",
        "3",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr_text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("EXTRAPOLATED to 2 layers"));
    let r = read_json(&json);
    assert_eq!(r["run"]["layers_run"], 1);
    let x = &r["extrapolated"];
    assert_eq!(x["layers"], 2);
    assert!(x["note"]
        .as_str()
        .unwrap()
        .contains("extrapolated, not measured"));
    let per_layer = num(x, "per_layer_p50_ms");
    assert!(per_layer > 0.0);
    assert!(
        (num(x, "lm_temporal_p50_ms") - (num(&r, "stages.lm_temporal_ms.p50") + per_layer)).abs()
            < 1e-9
    );
    assert_eq!(
        num(x, "read_per_frame_bytes"),
        num(&r, "weights.read_per_frame_bytes") + num(&r, "weights.temporal_layer_bytes")
    );
    // --stage lm runs no Mimi.
    assert_eq!(num(&r, "stages.mimi_encode_ms.max"), 0.0);
}

#[test]
fn echo_cancel_stage_times_the_canceller_alone() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = bench(&[
        "--random-weights",
        "--config",
        &tiny_config(),
        "--stage",
        "echo-cancel",
        "--frames",
        "5",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr_text(&out));
    let r = read_json(&json);
    assert_eq!(r["run"]["stage"], "echo-cancel");
    assert_eq!(r["frames"].as_array().unwrap().len(), 5);
    // The canceller's time is the frame's; no model stage runs, no weight is read.
    assert!(num(&r, "stages.total_ms.p50") > 0.0);
    for stage in [
        "mimi_encode_ms",
        "lm_temporal_ms",
        "lm_depformer_ms",
        "mimi_decode_ms",
    ] {
        assert_eq!(num(&r, &format!("stages.{stage}.max")), 0.0, "{stage}");
    }
    assert_eq!(num(&r, "weights.read_per_frame_bytes"), 0.0);
}

#[test]
fn tiny_checkpoint_runs_each_stage() {
    let model = tiny_a_dir().display().to_string();
    for (quant, stage, mimi_weights) in [
        ("q4", "depformer", "f32"),
        ("bf16", "mimi", "q8"),
        ("q8", "all", "bf16"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("bench.json");
        let out = bench(&[
            "--model",
            &model,
            "--quant",
            quant,
            "--stage",
            stage,
            "--mimi-weights",
            mimi_weights,
            "--frames",
            "2",
            "--json",
            json.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{quant} {stage}: {}",
            stderr_text(&out)
        );
        let r = read_json(&json);
        assert_eq!(
            (r["run"]["weights"].as_str(), r["run"]["quant"].as_str()),
            (Some("checkpoint"), Some(quant))
        );
        assert_eq!(r["run"]["mimi_weights"], mimi_weights);
        assert_eq!(r["frames"].as_array().unwrap().len(), 2);
        let depformer = num(&r, "stages.lm_depformer_ms.p50");
        let mimi = num(&r, "stages.mimi_encode_ms.p50");
        match stage {
            "depformer" => assert!(
                depformer > 0.0 && mimi == 0.0 && num(&r, "stages.lm_temporal_ms.max") == 0.0
            ),
            "mimi" => assert!(
                depformer == 0.0 && mimi > 0.0 && num(&r, "weights.read_per_frame_bytes") == 0.0
            ),
            _ => assert!(depformer > 0.0 && mimi > 0.0),
        }
    }
}

#[test]
fn random_group_size_is_labelled_and_shrinks_the_weights() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config();
    let resident = |group: Option<&str>| {
        let json = dir
            .path()
            .join(format!("g{}.json", group.unwrap_or("default")));
        let mut args = vec![
            "--random-weights",
            "--config",
            &config,
            "--stage",
            "lm",
            "--frames",
            "1",
            "--json",
            json.to_str().unwrap(),
        ];
        if let Some(g) = group {
            args.extend(["--group-size", g]);
        }
        let out = bench(&args);
        assert!(out.status.success(), "{}", stderr_text(&out));
        let r = read_json(&json);
        (
            r["run"]["quant"].as_str().unwrap().to_owned(),
            num(&r, "weights.resident_bytes"),
        )
    };
    let (label_32, bytes_32) = resident(None);
    let (label_32_explicit, bytes_32_explicit) = resident(Some("32"));
    let (label_64, bytes_64) = resident(Some("64"));
    assert_eq!(
        (label_32.as_str(), label_32_explicit.as_str()),
        ("q4", "q4")
    );
    assert_eq!(label_64, "q4g64");
    assert_eq!(bytes_32, bytes_32_explicit);
    // Half as many bf16 scales and biases: 4.5 instead of 5 bits per packed weight.
    assert!(bytes_64 < bytes_32, "{bytes_64} vs {bytes_32}");
}

#[test]
fn a_group_size_that_cannot_apply_is_refused() {
    let config = tiny_config();
    let refused = |args: &[&str], expected: &[&str]| {
        let out = bench(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = stderr_text(&out);
        assert!(expected.iter().all(|e| err.contains(e)), "{args:?}: {err}");
    };
    let tiny_random = ["--random-weights", "--config", &config, "--frames", "1"];
    refused(
        &[&tiny_random[..], &["--quant", "bf16", "--group-size", "64"]].concat(),
        &["--group-size 64", "bf16 weights have no groups"],
    );
    refused(
        &[&tiny_random[..], &["--group-size", "48"]].concat(),
        &["--group-size 48", "[32, 64, 128]"],
    );
    // tiny-a's gating output is 704 wide: not a whole number of 128-wide groups.
    refused(
        &[&tiny_random[..], &["--group-size", "128"]].concat(),
        &["gating.linear_out", "704", "group size 128"],
    );
    refused(
        &[
            "--model",
            tiny_a_dir().to_str().unwrap(),
            "--group-size",
            "64",
            "--frames",
            "1",
        ],
        &["--group-size 64 applies to --random-weights only"],
    );
}

#[test]
fn kv_prefill_fills_the_window_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("prefill.json");
    let config = tiny_config();
    // 10 prefilled positions, 2 timed frames, with `kv_cache` caches: the report.
    let prefilled = |kv_cache: &str| {
        let out = bench(&[
            "--random-weights",
            "--config",
            &config,
            "--stage",
            "lm",
            "--kv-prefill",
            "10",
            "--kv-cache",
            kv_cache,
            "--frames",
            "2",
            "--json",
            json.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr_text(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("prefilled with 10 random positions"));
        read_json(&json)
    };
    let r = prefilled("f32");
    assert_eq!(r["run"]["kv_prefill_positions"], 10);
    assert_eq!(r["run"]["kv_cache"], "f32");
    // 10 prefilled positions, then one LM step per frame: after 1 warm-up frame the 2 timed
    // frames attend over 12 and 13 positions (tiny-a's context is 16).
    let kv_layer = num(&r, "weights.kv_cache_layer_read_bytes");
    assert_eq!(kv_layer, 2.0 * 4.0 * 256.0 * 12.5);
    // bf16 caches: the same positions, half the bytes.
    let r = prefilled("bf16");
    assert_eq!(r["run"]["kv_cache"], "bf16");
    assert_eq!(num(&r, "weights.kv_cache_layer_read_bytes"), kv_layer / 2.0);

    let tiny = ["--random-weights", "--config", &config, "--frames", "1"];
    refused(
        &[&tiny[..], &["--kv-prefill", "17"]].concat(),
        "--kv-prefill 17 is above the config's context of 16 positions",
    );
    refused(
        &[&tiny[..], &["--kv-prefill", "4", "--stage", "mimi"]].concat(),
        "it needs --stage all or lm, not mimi",
    );
}

#[test]
fn sessions_share_one_weight_pass_and_count_their_caches() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config();
    // `sessions` sessions, 10 prefilled positions each, 2 timed frames at `stage`: the report.
    let run = |sessions: &str, stage: &str| {
        let json = dir.path().join(format!("sessions-{sessions}-{stage}.json"));
        let out = bench(&[
            "--random-weights",
            "--config",
            &config,
            "--stage",
            stage,
            "--sessions",
            sessions,
            "--kv-prefill",
            "10",
            "--frames",
            "2",
            "--json",
            json.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr_text(&out));
        read_json(&json)
    };
    let one = run("1", "lm");
    let three = run("3", "lm");
    assert_eq!(one["schema_version"], 3);
    assert_eq!(one["run"]["sessions"], 1);
    assert_eq!(three["run"]["sessions"], 3);
    // The weights are read once for all sessions; each session's caches are read.
    assert_eq!(num(&three, "weights.weight_passes_per_frame"), 1.0);
    assert_eq!(
        num(&three, "weights.read_per_frame_bytes"),
        num(&one, "weights.read_per_frame_bytes")
    );
    // After 1 warm-up frame the 2 timed frames attend over 12 and 13 positions (f32 caches).
    let kv_layer_one_session = 2.0 * 4.0 * 256.0 * 12.5;
    assert_eq!(
        num(&one, "weights.kv_cache_layer_read_bytes"),
        kv_layer_one_session
    );
    assert_eq!(
        num(&three, "weights.kv_cache_layer_read_bytes"),
        3.0 * kv_layer_one_session
    );
    // Sessions x 1000 / frame p50 (to the last bits JSON's decimal form keeps).
    let aggregate = num(&three, "aggregate_frames_per_s");
    let expected = 3.0 * 1e3 / num(&three, "stages.total_ms.p50");
    assert!(
        (aggregate - expected).abs() <= 1e-12 * expected,
        "{aggregate} vs {expected}"
    );
    // The whole pipeline: every session's Mimi runs too.
    let all = run("2", "all");
    assert_eq!(all["run"]["sessions"], 2);
    assert!(num(&all, "stages.mimi_encode_ms.p50") > 0.0);

    let tiny = ["--random-weights", "--config", &config, "--frames", "1"];
    refused(
        &[&tiny[..], &["--sessions", "0"]].concat(),
        "--sessions 0: expected 1..=64",
    );
    refused(
        &[&tiny[..], &["--sessions", "65"]].concat(),
        "--sessions 65: expected 1..=64",
    );
    refused(
        &[&tiny[..], &["--sessions", "2", "--stage", "mimi"]].concat(),
        "it needs --stage all or lm, not mimi",
    );
}

/// An LM config whose own Mimi config is missing falls back to the real Mimi's, whose 2048-entry
/// codebooks the tiny LM (card 64) cannot embed: refused up front, naming both and the missing
/// file, not "user code 1806 ... out of range" at every frame (issue #41, item 19).
#[test]
fn an_lm_config_without_its_mimi_config_names_the_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::copy(tiny_config(), &config).unwrap();
    let out = bench(&[
        "--random-weights",
        "--config",
        config.to_str().unwrap(),
        "--frames",
        "1",
    ]);
    assert!(!out.status.success());
    let err = stderr_text(&out);
    assert!(
        err.contains("`card` is 64")
            && err.contains("2048 entries")
            && err.contains("mimi_config.json is not there")
            && !err.contains("out of range"),
        "{err}"
    );
}

/// A text-to-speech config: N streams started together until their first audio (the voices'
/// cross-attention keys and values, the audio's delay), then stepped together; the report's
/// TTS figures are consistent with the model's delays and the voices' shape.
#[test]
fn tts_streams_report_their_first_audio() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("tts.json");
    let config = moshi_test_support::fixture("tiny-tts", "config.json");
    let out = bench(&[
        "--random-weights",
        "--config",
        config.to_str().unwrap(),
        "--sessions",
        "2",
        "--frames",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr_text(&out));
    let r = read_json(&json);
    assert_eq!(num(&r, "run.sessions"), 2.0);
    assert_eq!(num(&r, "run.lm_rows"), 1.0);
    assert_eq!(num(&r, "tts.cfg_coef"), 2.0);
    // 5 speaker slots of a 125-frame voice.
    assert_eq!(num(&r, "tts.source_positions"), 625.0);
    for first in ["tts.first_audio", "tts.first_audio_cold"] {
        // delay_steps 16, the codebooks' delay 2: frame 16 is the first with audio, returned
        // at step 18; the depformer runs from step 16.
        assert_eq!(num(&r, &format!("{first}.steps")), 19.0);
        assert_eq!(num(&r, &format!("{first}.depformer_steps")), 3.0);
        let sum = num(&r, &format!("{first}.setup_ms")) + num(&r, &format!("{first}.steps_ms"));
        assert!((num(&r, &format!("{first}.total_ms")) - sum).abs() < 1e-6);
    }
    // 2 streams x 2 layers x 625 positions x keys and values of 256 f32.
    assert_eq!(
        num(&r, "weights.cross_kv_read_per_frame_bytes"),
        (2 * 2 * 625 * 2 * 256 * 4) as f64
    );
    // 2 layers x 625 positions x a [512, 256] product x 2 FLOP.
    assert!((num(&r, "tts.cross_kv_gflop") - 2.0 * 625.0 * 512.0 * 256.0 * 2.0 / 1e9).abs() < 1e-9);
    // The next voice: its 125 positions only (the 4 empty slots' 500 reused).
    assert!(
        (num(&r, "tts.cross_kv_next_voice_gflop") - 2.0 * 125.0 * 512.0 * 256.0 * 2.0 / 1e9).abs()
            < 1e-9
    );
    assert!(num(&r, "tts.cross_kv_next_voice_ms") > 0.0);
    assert!(num(&r, "tts.first_audio_steps_bound_ms") > 0.0);
    assert!(num(&r, "stages.mimi_decode_ms.p50") > 0.0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("time to first audio"), "{text}");
    assert_eq!(num(&r, "tts.codebooks"), 32.0);

    // 24 of the 32 codebooks: the depformer reads 24/32 of its weights a frame.
    let json24 = dir.path().join("tts24.json");
    let out = bench(&[
        "--random-weights",
        "--config",
        config.to_str().unwrap(),
        "--frames",
        "2",
        "--tts-n-q",
        "24",
        "--json",
        json24.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr_text(&out));
    let r24 = read_json(&json24);
    assert_eq!(num(&r24, "tts.codebooks"), 24.0);
    let dep = |r: &serde_json::Value| num(r, "weights.depformer_bytes");
    assert_eq!(dep(&r24), (dep(&r) as u64 * 24 / 32) as f64);
    assert_eq!(
        num(&r, "weights.read_per_frame_bytes") - num(&r24, "weights.read_per_frame_bytes"),
        dep(&r) - dep(&r24)
    );

    let config = config.to_str().unwrap();
    let tts = ["--random-weights", "--config", config, "--frames", "1"];
    refused(
        &[&tts[..], &["--stage", "lm"]].concat(),
        "text-to-speech model",
    );
    refused(
        &[&tts[..], &["--kv-prefill", "4"]].concat(),
        "--kv-prefill 4",
    );
    refused(&[&tts[..], &["--cfg-coef", "5"]].concat(), "cfg");
}

/// Every bundled model config runs one frame on random weights at its real sizes (one temporal
/// layer, q4): a config the loader reads but the model cannot build (the speech-to-text configs'
/// absent depformer once divided by zero) fails here.
#[test]
fn every_bundled_model_config_runs_a_frame_on_random_weights() {
    let configs = std::fs::read_dir(repo_root().join("configs")).unwrap();
    let mut ran = 0;
    for entry in configs {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // Mimi's config is not a model's.
        if !name.ends_with(".json") || name.starts_with("mimi") {
            continue;
        }
        let out = bench(&[
            "--random-weights",
            "--config",
            path.to_str().unwrap(),
            "--layers",
            "1",
            "--quant",
            "q4",
            "--frames",
            "1",
        ]);
        assert!(out.status.success(), "{name}: {}", stderr_text(&out));
        ran += 1;
    }
    assert!(ran >= 6, "only {ran} model configs in configs/");
}
