//! `moshi-rs codec encode/decode` end to end on the tiny-a fixture: reproduces the official
//! streaming codes and decoded PCM, reads every supported WAV variant (any rate, resampled), and
//! rejects bad input with clear errors.

use std::path::Path;

use moshi_loader::npy;
use moshi_test_support::{path_str, run_binary, stderr_text, tiny_a};

fn moshi_rs(args: &[&str]) -> (bool, String) {
    let out = run_binary(env!("CARGO_BIN_EXE_moshi-rs"), args);
    (out.status.success(), stderr_text(&out))
}

fn mimi_args() -> Vec<String> {
    vec![
        "--mimi".into(),
        path_str(&tiny_a("mimi.safetensors")).into(),
        "--mimi-config".into(),
        path_str(&tiny_a("mimi_config.json")).into(),
    ]
}

#[test]
fn encode_reproduces_reference_codes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("codes.npy");
    let input = tiny_a("input.wav");
    let mut args = vec!["codec", "encode", path_str(&input), path_str(&out)];
    let extra = mimi_args();
    args.extend(extra.iter().map(String::as_str));
    let (ok, err) = moshi_rs(&args);
    assert!(ok, "{err}");
    let ours = npy::read_i64(&out).unwrap();
    let reference = npy::read_i64(tiny_a("ref/mimi_codes.npy")).unwrap();
    assert_eq!(ours.shape, reference.shape);
    assert_eq!(ours.data, reference.data);
}

#[test]
fn model_dir_finds_weights_and_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        tiny_a("mimi.safetensors"),
        dir.path().join("tokenizer-test.safetensors"),
    )
    .unwrap();
    std::fs::copy(
        tiny_a("mimi_config.json"),
        dir.path().join("mimi_config.json"),
    )
    .unwrap();
    let out = dir.path().join("codes.npy");
    let (ok, err) = moshi_rs(&[
        "codec",
        "encode",
        path_str(&tiny_a("input.wav")),
        path_str(&out),
        "--model",
        path_str(dir.path()),
        "--codebooks",
        "4",
    ]);
    assert!(ok, "{err}");
    let ours = npy::read_i64(&out).unwrap();
    let reference = npy::read_i64(tiny_a("ref/mimi_codes.npy")).unwrap();
    assert_eq!(ours.shape, vec![4, 43]);
    assert_eq!(
        ours.data[..],
        reference.data[..4 * 43],
        "the first 4 codebooks do not depend on the others"
    );
}

#[test]
fn decode_reproduces_reference_pcm_npy_and_wav() {
    let dir = tempfile::tempdir().unwrap();
    let out_npy = dir.path().join("pcm.npy");
    let codes = tiny_a("ref/mimi_codes.npy");
    let mut args = vec!["codec", "decode", path_str(&codes), path_str(&out_npy)];
    let extra = mimi_args();
    args.extend(extra.iter().map(String::as_str));
    let (ok, err) = moshi_rs(&args);
    assert!(ok, "{err}");
    let ours = npy::read_f32(&out_npy).unwrap().data;
    let reference = npy::read_f32(tiny_a("ref/mimi_decoded.npy")).unwrap().data;
    assert_eq!(ours.len(), reference.len());
    let diff = ours
        .iter()
        .zip(&reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(diff < 1e-4, "max abs diff {diff}");

    let out_wav = dir.path().join("pcm.wav");
    args[3] = path_str(&out_wav);
    let (ok, err) = moshi_rs(&args);
    assert!(ok, "{err}");
    let mut reader = hound::WavReader::open(&out_wav).unwrap();
    let spec = reader.spec();
    assert_eq!(
        (spec.sample_rate, spec.channels, spec.bits_per_sample),
        (24000, 1, 16)
    );
    let samples: Vec<i16> = reader.samples::<i16>().map(Result::unwrap).collect();
    assert_eq!(samples.len(), reference.len());
    for (s, r) in samples.iter().zip(&reference) {
        let expected = (r * 32767.0).clamp(-32768.0, 32767.0) as i16;
        assert!(
            (*s as i32 - expected as i32).abs() <= 1,
            "{s} vs {expected}"
        );
    }
}

fn write_wav(path: &Path, spec: hound::WavSpec, n: usize) {
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for i in 0..n {
        match (spec.sample_format, spec.bits_per_sample) {
            (hound::SampleFormat::Float, _) => {
                w.write_sample((i as f32 * 0.01).sin() * 0.5).unwrap()
            }
            (_, 8) => w.write_sample((i % 100) as i8).unwrap(),
            (_, 16) => w
                .write_sample(((i as f32 * 0.01).sin() * 10000.0) as i16)
                .unwrap(),
            (_, 24) => w
                .write_sample(((i as f32 * 0.01).sin() * 1_000_000.0) as i32)
                .unwrap(),
            _ => w
                .write_sample(((i as f32 * 0.01).sin() * 1e9) as i32)
                .unwrap(),
        }
    }
    w.finalize().unwrap();
}

#[test]
fn wav_formats_and_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let extra = mimi_args();
    let run_encode = |wav: &Path| {
        let out = dir.path().join("c.npy");
        let mut args = vec!["codec", "encode", path_str(wav), path_str(&out)];
        args.extend(extra.iter().map(String::as_str));
        moshi_rs(&args)
    };
    let spec = |ch, rate, bits, fmt| hound::WavSpec {
        channels: ch,
        sample_rate: rate,
        bits_per_sample: bits,
        sample_format: fmt,
    };
    use hound::SampleFormat::{Float, Int};
    // Supported: 8/16/24/32-bit int and 32-bit float, stereo mixed to mono.
    for (i, s) in [
        spec(1, 24000, 16, Int),
        spec(2, 24000, 24, Int),
        spec(1, 24000, 32, Int),
        spec(2, 24000, 32, Float),
    ]
    .into_iter()
    .enumerate()
    {
        let wav = dir.path().join(format!("ok{i}.wav"));
        write_wav(&wav, s, 2 * 1920 * s.channels as usize);
        let (ok, err) = run_encode(&wav);
        assert!(ok, "{s:?}: {err}");
    }
    // 8-bit and other rates are read too (16 kHz is resampled to 24 kHz: 4000 samples -> 6000).
    let eight = dir.path().join("eight.wav");
    write_wav(&eight, spec(1, 24000, 8, Int), 4000);
    let (ok, err) = run_encode(&eight);
    assert!(ok, "8-bit: {err}");
    let rate = dir.path().join("rate.wav");
    write_wav(&rate, spec(1, 16000, 16, Int), 4000);
    let (ok, err) = run_encode(&rate);
    assert!(ok, "16 kHz: {err}");
    let frames = npy::read_i64(dir.path().join("c.npy")).unwrap().shape[1];
    assert_eq!(
        frames,
        6144 / 1920,
        "resampled length (sphn-style whole output chunks) in frames"
    );

    let empty = dir.path().join("empty.wav");
    write_wav(&empty, spec(1, 24000, 16, Int), 0);
    let (ok, err) = run_encode(&empty);
    assert!(
        !ok && err.contains("empty.wav") && err.contains("no audio samples"),
        "{err}"
    );

    let short = dir.path().join("short.wav");
    write_wav(&short, spec(1, 24000, 16, Int), 100);
    let (ok, err) = run_encode(&short);
    assert!(!ok && err.contains("shorter than one"), "{err}");

    let junk = dir.path().join("junk.wav");
    std::fs::write(&junk, b"this is not a wav file at all").unwrap();
    let (ok, err) = run_encode(&junk);
    assert!(
        !ok && err.contains("junk.wav") && err.contains("not a readable WAV"),
        "{err}"
    );
    let missing = dir.path().join("missing.wav");
    let (ok, err) = run_encode(&missing);
    assert!(
        !ok && err.contains("missing.wav") && err.contains("does not exist"),
        "{err}"
    );

    // Out-of-range codes are rejected with the position.
    let codes = dir.path().join("bad_codes.npy");
    let mut data = vec![0i64; 8 * 3];
    data[2 * 3 + 1] = 64;
    npy::write_i64(&codes, &[8, 3], &data).unwrap();
    let out = dir.path().join("x.npy");
    let mut args = vec!["codec", "decode", path_str(&codes), path_str(&out)];
    args.extend(extra.iter().map(String::as_str));
    let (ok, err) = moshi_rs(&args);
    assert!(
        !ok && err.contains("code 64") && err.contains("codebook 2") && err.contains("frame 1"),
        "{err}"
    );
}

#[test]
fn mimi_weights_flag_selects_the_precision_and_rejects_unknown_values() {
    let dir = tempfile::tempdir().unwrap();
    let input = tiny_a("input.wav");
    let reference = npy::read_i64(tiny_a("ref/mimi_codes.npy")).unwrap();
    let extra = mimi_args();
    // (mode, minimum fraction of codes equal to the exact reference; see mimi_reference.rs)
    for (mode, min_equal) in [("f32", 1.0), ("bf16", 0.95), ("q8", 0.88)] {
        let out = dir.path().join(format!("codes-{mode}.npy"));
        let mut args = vec![
            "codec",
            "encode",
            path_str(&input),
            path_str(&out),
            "--mimi-weights",
            mode,
        ];
        args.extend(extra.iter().map(String::as_str));
        let (ok, err) = moshi_rs(&args);
        assert!(ok, "{mode}: {err}");
        let ours = npy::read_i64(&out).unwrap();
        assert_eq!(ours.shape, reference.shape, "{mode}");
        let equal = ours
            .data
            .iter()
            .zip(&reference.data)
            .filter(|(a, b)| a == b)
            .count() as f64
            / ours.data.len() as f64;
        assert!(
            equal >= min_equal,
            "{mode}: {:.1}% of codes equal",
            100.0 * equal
        );
    }
    let out = dir.path().join("codes-bad.npy");
    let mut args = vec![
        "codec",
        "encode",
        path_str(&input),
        path_str(&out),
        "--mimi-weights",
        "q4",
    ];
    args.extend(extra.iter().map(String::as_str));
    let (ok, err) = moshi_rs(&args);
    assert!(!ok && !out.exists());
    assert!(
        err.contains("--mimi-weights") && err.contains("q4") && err.contains("f32, bf16 or q8"),
        "{err}"
    );
}

/// Codes with more rows than the Mimi quantizer's codebooks are refused naming the .npy file
/// (the error used to say only "mimi: 13 codebooks requested").
#[test]
fn decode_of_too_many_codebooks_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let codes = dir.path().join("thirteen.npy");
    let mut writer = npy::NpyWriter::create_i64(&codes, &[13, 2]).unwrap();
    for _ in 0..13 {
        writer.write_i64(&[0, 0]).unwrap();
    }
    writer.finish().unwrap();
    let out = dir.path().join("o.wav");
    let mut args = vec!["codec", "decode", path_str(&codes), path_str(&out)];
    let extra = mimi_args();
    args.extend(extra.iter().map(String::as_str));
    let (ok, err) = moshi_rs(&args);
    assert!(!ok, "{err}");
    assert!(
        err.contains("thirteen.npy") && err.contains("holds 13 codebooks") && err.contains("1..="),
        "{err}"
    );
    assert!(!out.exists());
}
