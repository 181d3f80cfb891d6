//! The `moshi-rs bench` report: a stable, versioned JSON document (schema in docs/performance.md,
//! "moshi-rs bench --json") and its human-readable rendering.
//!
//! Bump [`BENCH_SCHEMA_VERSION`] whenever a field is renamed, removed or changes meaning; adding
//! a field keeps the version.

use serde::Serialize;

use moshi_runtime::metrics::{FrameRecord, Percentiles};

use crate::frame_probe::ProbesBesideFrames;
use crate::frames::FrameLog;
use crate::tts::FirstAudio;
use moshi_runtime::FRAME_MS;

/// Version of the JSON layout written by `moshi-rs bench --json`.
pub const BENCH_SCHEMA_VERSION: u32 = 3;

/// What was run.
#[derive(Clone, Debug, Serialize)]
pub struct RunInfo {
    /// `"random"` (random weights of the config's shapes) or `"checkpoint"`.
    pub weights: String,
    /// Checkpoint folder or repo (`null` for random weights).
    pub model: Option<String>,
    /// The LM config used (file path or `<built-in ...>`).
    pub config: String,
    /// `bf16`, `q8` or `q4`.
    pub quant: String,
    /// Mimi's weight precision: `f32` (exact), `bf16` or `q8` (`--mimi-weights`).
    pub mimi_weights: String,
    /// The quantized-matrix kernel of q8/q4 products (`moshi_kernels::Kernel::name`, e.g.
    /// `avx512vnni`; `MOSHI_KERNEL` picks another).
    pub quant_kernel: String,
    /// How the q4/q8 products hold their activations: `exact`, `i16` or `i8` (`--activations`).
    pub activations: String,
    /// `all`, `mimi`, `lm` or `depformer`.
    pub stage: String,
    /// Temporal layers actually run.
    pub layers_run: usize,
    /// Temporal layers of the config.
    pub layers_config: usize,
    /// Timed frames.
    pub frames: usize,
    /// Untimed frames run first.
    pub warmup_frames: usize,
    /// Random positions put into every temporal KV cache before the warm-up (`--kv-prefill`).
    pub kv_prefill_positions: usize,
    /// Element type of the temporal KV caches: `f32` or `bf16` (`--kv-cache`).
    pub kv_cache: String,
    /// Worker threads of the compute pool.
    pub threads: usize,
    /// Seed of the random weights, input and sampling.
    pub seed: u64,
    /// Classifier-free guidance coefficient (`--cfg-coef`; 1 = none).
    pub cfg_coef: f64,
    /// Rows the LM runs per step and session: 1, or 2 with guidance (conditioned and negative).
    pub lm_rows: usize,
    /// Conversations stepped together over one set of weights (`--sessions`): every frame is one
    /// batched step of all of them, and the stage times are that step's.
    pub sessions: usize,
}

/// Where it ran.
#[derive(Clone, Debug, Serialize)]
pub struct MachineInfo {
    pub os: String,
    pub arch: String,
    /// Logical CPUs the OS reports.
    pub logical_cpus: usize,
    /// Memory read bandwidth measured in this run with `threads` threads, GB/s (1e9 bytes/s): the
    /// best of the probes in `read_bandwidth_probes_gbps`.
    pub read_bandwidth_gbps: f64,
    /// Every bandwidth probe of the run (before loading the model, after the timed frames).
    pub read_bandwidth_probes_gbps: Vec<f64>,
    /// The kernel's transparent huge page setting (`always`, `madvise` or `never`; `null` where
    /// there is none): at `madvise` or `always` the probe's buffer and the weights are on 2 MiB
    /// pages, at `never` both on 4 KiB pages, which read slower.
    pub transparent_huge_pages: Option<String>,
    /// Peak resident set size of the process at the end of the run (`VmHWM`); `null` where the
    /// OS does not report it.
    pub peak_memory_bytes: Option<u64>,
}

/// min/p50/p95/p99/max/mean milliseconds per frame of every stage.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StageStats {
    pub mimi_encode_ms: Percentiles,
    pub lm_temporal_ms: Percentiles,
    pub lm_depformer_ms: Percentiles,
    pub sampling_ms: Percentiles,
    pub mimi_decode_ms: Percentiles,
    /// The LM step: temporal + depformer + sampling.
    pub lm_step_ms: Percentiles,
    /// The whole frame (wall clock around the stage(s) run).
    pub total_ms: Percentiles,
}

impl StageStats {
    /// `(name, percentiles)` in pipeline order, for tables.
    pub fn rows(&self) -> [(&'static str, &Percentiles); 7] {
        [
            ("mimi encode", &self.mimi_encode_ms),
            ("lm temporal", &self.lm_temporal_ms),
            ("lm depformer", &self.lm_depformer_ms),
            ("sampling", &self.sampling_ms),
            ("mimi decode", &self.mimi_decode_ms),
            ("lm step", &self.lm_step_ms),
            ("frame total", &self.total_ms),
        ]
    }
}

/// Time of the LM step of one frame: temporal + depformer + sampling.
pub fn lm_step_ms(r: &FrameRecord) -> f64 {
    r.stages.lm_temporal_ms + r.stages.lm_depformer_ms + r.stages.sampling_ms
}

/// LM weight bytes held and read per frame.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WeightBytes {
    /// All LM weights in memory (whole embedding tables included).
    pub resident_bytes: u64,
    /// Read by one frame: every matrix of the stages run (embedding rows are negligible and not
    /// counted), `weight_passes_per_frame` times. For `--stage mimi` this is 0 (Mimi's own
    /// weights are not counted).
    pub read_per_frame_bytes: u64,
    /// Times a frame reads the LM weights: 1 (every row of every session, guidance's second
    /// rows included, runs in one batched step over the weights).
    pub weight_passes_per_frame: u64,
    /// One temporal layer (mean over the layers present).
    pub temporal_layer_bytes: u64,
    /// `out_norm` + the text head.
    pub text_head_bytes: u64,
    /// All depformer steps of a frame.
    pub depformer_bytes: u64,
    /// Keys and values (of the `--kv-cache` element type) one temporal layer's attention reads
    /// per frame, mean over the timed frames, every row's cache of every session: frame `i` of the run (warm-up included) attends over
    /// `min(i + 1, context)` positions. 0 when the temporal transformer does not run.
    pub kv_cache_layer_read_bytes: u64,
    /// The same for all temporal layers run. The bound counts it with the weights.
    pub kv_cache_read_per_frame_bytes: u64,
    /// Keys and values of the cross-attention sources (a TTS stream's voice: f32, every source
    /// position) all temporal layers run read per frame, every session's; 0 without
    /// cross-attention. The bound counts it with the weights.
    pub cross_kv_read_per_frame_bytes: u64,
}

impl WeightBytes {
    /// Weights and keys and values read per frame: what the bound divides by the read
    /// bandwidth.
    pub fn lm_read_per_frame_bytes(&self) -> u64 {
        self.read_per_frame_bytes
            + self.kv_cache_read_per_frame_bytes
            + self.cross_kv_read_per_frame_bytes
    }

    /// What a frame reads when the depformer makes only `codebooks` of its `dep_q` sub-steps
    /// (a TTS's `n_q`): each sub-step reads the same bytes (one weight set of the schedule).
    pub fn make_codebooks(&mut self, codebooks: usize, dep_q: usize) {
        let kept = self.depformer_bytes * codebooks.min(dep_q) as u64 / dep_q.max(1) as u64;
        self.read_per_frame_bytes -= self.depformer_bytes - kept;
        self.depformer_bytes = kept;
    }
}

/// A text-to-speech run's time to first audio and setup (`moshi-rs bench` on a TTS config).
#[derive(Clone, Debug, Default, Serialize)]
pub struct TtsFigures {
    /// Streams started together and stepped together (`--sessions`).
    pub streams: usize,
    /// The `cfg` condition of the distilled model (`--cfg-coef`).
    pub cfg_coef: f64,
    /// Audio codebooks each stream generates (`--tts-n-q`, else all).
    pub codebooks: usize,
    /// Cross-attention source positions per stream (speaker slots x voice frames).
    pub source_positions: usize,
    /// The first streams after the model was built (first use of the weights and buffers).
    pub first_audio_cold: FirstAudio,
    /// Fresh streams on the model already used (a server's next request); these streams run
    /// the timed frames.
    pub first_audio: FirstAudio,
    /// `first_audio.setup_ms / streams`.
    pub setup_per_stream_ms: f64,
    /// One voice's cross-attention keys and values for every temporal layer run, computed alone
    /// (most of a stream's setup), ms.
    pub cross_kv_ms: f64,
    /// Its multiply-adds x 2, GFLOP.
    pub cross_kv_gflop: f64,
    /// `cross_kv_gflop / cross_kv_ms`, GFLOP/s.
    pub cross_kv_gflops: f64,
    /// The next voice's keys and values (its own source positions computed, the empty speaker
    /// slots' reused from the previous voice), ms.
    pub cross_kv_next_voice_ms: f64,
    /// Its multiply-adds x 2, GFLOP.
    pub cross_kv_next_voice_gflop: f64,
    /// Bytes the first-audio steps read (the temporal weights at every step, the depformer's at
    /// the steps that run it, the voices' keys and values) / read bandwidth, ms.
    pub first_audio_steps_bound_ms: f64,
}

/// The measured LM time next to the memory-bandwidth lower bound.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BandwidthBound {
    /// Bytes read per frame (LM weights + temporal KV caches) / read bandwidth: no
    /// implementation can be faster on this machine.
    pub lm_bound_ms: f64,
    /// Median measured time of the LM stages run (temporal + depformer + sampling).
    pub lm_measured_p50_ms: f64,
    /// `lm_measured_p50_ms / lm_bound_ms` (1.0 = at the physical limit); 0 when nothing is read.
    pub ratio_to_bound: f64,
    /// Bytes read per frame / `lm_measured_p50_ms`, GB/s.
    pub effective_gbps: f64,
    /// The probes taken between the timed frames and each frame against its own probe's bound
    /// (`--probe-every`); `None` without them.
    pub beside_frames: Option<ProbesBesideFrames>,
}

impl BandwidthBound {
    pub fn new(
        read_per_frame_bytes: u64,
        read_bandwidth_gbps: f64,
        lm_measured_p50_ms: f64,
    ) -> Self {
        let lm_bound_ms = if read_bandwidth_gbps > 0.0 {
            read_per_frame_bytes as f64 / (read_bandwidth_gbps * 1e6)
        } else {
            0.0
        };
        let ratio_to_bound = if lm_bound_ms > 0.0 {
            lm_measured_p50_ms / lm_bound_ms
        } else {
            0.0
        };
        let effective_gbps = if lm_measured_p50_ms > 0.0 {
            read_per_frame_bytes as f64 / (lm_measured_p50_ms * 1e6)
        } else {
            0.0
        };
        Self {
            lm_bound_ms,
            lm_measured_p50_ms,
            ratio_to_bound,
            effective_gbps,
            beside_frames: None,
        }
    }
}

/// Figures for the config's full depth, from a run with fewer temporal layers. EXTRAPOLATED, not
/// measured: the temporal time grows by the measured time of one layer per missing layer.
#[derive(Clone, Debug, Serialize)]
pub struct Extrapolation {
    /// Human-readable statement of what was extrapolated from what.
    pub note: String,
    /// Full depth the figures are for.
    pub layers: usize,
    /// Median measured time of one temporal layer (from the `lm_temporal_layer` spans).
    pub per_layer_p50_ms: f64,
    /// Temporal transformer per frame at full depth.
    pub lm_temporal_p50_ms: f64,
    /// Whole LM step at full depth.
    pub lm_step_p50_ms: f64,
    /// Whole frame at full depth.
    pub total_p50_ms: f64,
    /// Mean frame time at full depth / 80 ms.
    pub real_time_factor: f64,
    /// LM weights held at full depth.
    pub resident_bytes: u64,
    /// LM weights read per frame at full depth.
    pub read_per_frame_bytes: u64,
    /// Temporal KV caches read per frame at full depth.
    pub kv_cache_read_per_frame_bytes: u64,
    /// Cross-attention keys and values read per frame at full depth.
    pub cross_kv_read_per_frame_bytes: u64,
    pub bound: BandwidthBound,
}

/// The whole report (`moshi-rs bench --json`).
#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub schema_version: u32,
    /// `"moshi-rs bench"`.
    pub tool: String,
    /// moshi-rs version.
    pub version: String,
    pub run: RunInfo,
    pub machine: MachineInfo,
    /// The frame budget: 80 ms (24 kHz, 1920 samples).
    pub frame_budget_ms: f64,
    pub stages: StageStats,
    /// Mean frame time / 80 ms; below 1 is faster than real time.
    pub real_time_factor: f64,
    /// Conversation frames computed per second: sessions x 1000 / frame p50 ms (80 ms frames:
    /// 12.5 per second and session keep real time).
    pub aggregate_frames_per_s: f64,
    pub weights: WeightBytes,
    pub bound: BandwidthBound,
    /// Present only when `layers_run < layers_config`.
    pub extrapolated: Option<Extrapolation>,
    /// Present only for a text-to-speech config.
    pub tts: Option<TtsFigures>,
    /// Every timed frame, as in the `--profile` JSON Lines files (`[]` unless the run kept
    /// them: `BenchOptions::keep_frames`), read back from disk as the report is written.
    #[serde(serialize_with = "frames_or_none")]
    pub frames: Option<FrameLog>,
}

/// The frame records, or an empty list.
fn frames_or_none<S: serde::Serializer>(
    frames: &Option<FrameLog>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match frames {
        Some(log) => log.serialize(serializer),
        None => serializer.collect_seq(std::iter::empty::<FrameRecord>()),
    }
}

/// `sessions` frames per frame time p50, per second.
pub fn aggregate_frames_per_s(stats: &StageStats, sessions: usize) -> f64 {
    if stats.total_ms.p50 > 0.0 {
        sessions as f64 * 1e3 / stats.total_ms.p50
    } else {
        0.0
    }
}

/// Mean total / 80 ms.
pub fn real_time_factor(stats: &StageStats) -> f64 {
    stats.total_ms.mean / FRAME_MS
}

fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.1} kB", b / 1e3)
    }
}

impl BenchReport {
    /// The console rendering.
    pub fn to_text(&self) -> String {
        let r = &self.run;
        let mut s = format!(
            "moshi-rs bench: {} weights, {}, Mimi {}, stage {}, {} of {} temporal layers, {} frames after {} warm-up, {} threads\n",
            r.weights, r.quant, r.mimi_weights, r.stage, r.layers_run, r.layers_config, r.frames, r.warmup_frames, r.threads
        );
        if r.sessions > 1 {
            s += &format!(
                "{} sessions in one batched step per frame (weights read once for all): {:.1} conversation frames/s (12.5 per session keep real time)\n",
                r.sessions, self.aggregate_frames_per_s
            );
        }
        if r.lm_rows > 1 {
            s += &format!(
                "classifier-free guidance {}: {} LM rows per session in one batched step, weights read {} time(s) per frame\n",
                r.cfg_coef, r.lm_rows, self.weights.weight_passes_per_frame
            );
        }
        if r.activations != "exact" {
            let bits = if r.activations == "i16" { 16 } else { 8 };
            s += &format!(
                "activations of the q4/q8 products: {} (rounded to {bits} bits per quantization group)\n",
                r.activations
            );
        }
        if r.kv_prefill_positions > 0 || r.kv_cache != "f32" {
            s += &format!(
                "temporal KV caches: {}, prefilled with {} random positions\n",
                r.kv_cache, r.kv_prefill_positions
            );
        }
        s += &format!(
            "{:<13} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            "stage (ms)", "min", "p50", "p95", "p99", "max", "mean"
        );
        for (name, p) in self.stages.rows() {
            s += &format!(
                "{:<13} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}\n",
                name, p.min, p.p50, p.p95, p.p99, p.max, p.mean
            );
        }
        s += &format!(
            "real-time factor {:.3} (mean frame time / {} ms budget; < 1 is faster than real time)\n",
            self.real_time_factor, self.frame_budget_ms
        );
        let w = &self.weights;
        let b = &self.bound;
        let cross = match w.cross_kv_read_per_frame_bytes {
            0 => String::new(),
            n => format!("; cross-attention keys and values: {}", human_bytes(n)),
        };
        s += &format!(
            "LM weights: {} resident, {} read per frame; temporal KV caches: {} read per frame{cross} -> {:.2} GB/s effective\n",
            human_bytes(w.resident_bytes),
            human_bytes(w.read_per_frame_bytes),
            human_bytes(w.kv_cache_read_per_frame_bytes),
            b.effective_gbps
        );
        let pages = match self.machine.transparent_huge_pages.as_deref() {
            Some("always" | "madvise") => "2 MiB pages",
            _ => "4 KiB pages",
        };
        s += &format!(
            "memory read bandwidth {:.2} GB/s ({pages}) -> LM lower bound {:.2} ms/frame; measured LM p50 {:.2} ms = {:.2}x the bound\n",
            self.machine.read_bandwidth_gbps, b.lm_bound_ms, b.lm_measured_p50_ms, b.ratio_to_bound
        );
        if let Some(f) = &b.beside_frames {
            let (g, r) = (&f.probes_gbps, &f.ratio_to_bound);
            s += &format!(
                "beside the frames (a probe of {} before every {} frames): {:.1}-{:.1} GB/s (p50 {:.1}); \
                 each frame's LM step / its probe's bound: p50 {:.2}x (min {:.2}, p95 {:.2}, max {:.2})\n",
                human_bytes(f.probe_bytes),
                f.every_frames,
                g.min,
                g.max,
                g.p50,
                r.p50,
                r.min,
                r.p95,
                r.max
            );
        }
        if let Some(t) = &self.tts {
            s += &t.to_text();
        }
        match self.machine.peak_memory_bytes {
            Some(p) => s += &format!("peak memory (VmHWM) {}\n", human_bytes(p)),
            None => s += "peak memory: not reported by this OS\n",
        }
        if let Some(x) = &self.extrapolated {
            s += &format!(
                "EXTRAPOLATED to {} layers ({}): temporal p50 {:.2} ms, LM step p50 {:.2} ms, frame p50 {:.2} ms, \
                 real-time factor {:.3}; {} of weights + {} of KV caches read per frame, bound {:.2} ms = {:.2}x; \
                 {} resident\n",
                x.layers,
                x.note,
                x.lm_temporal_p50_ms,
                x.lm_step_p50_ms,
                x.total_p50_ms,
                x.real_time_factor,
                human_bytes(x.read_per_frame_bytes),
                human_bytes(x.kv_cache_read_per_frame_bytes),
                x.bound.lm_bound_ms,
                x.bound.ratio_to_bound,
                human_bytes(x.resident_bytes)
            );
        }
        s
    }
}

impl TtsFigures {
    /// The console lines.
    fn to_text(&self) -> String {
        let line = |what: &str, f: &FirstAudio| {
            format!(
                "time to first audio ({what}): {:.1} ms = setup {:.1} ms + {} LM steps ({} with the depformer) {:.1} ms (temporal {:.1}, depformer {:.1})\n",
                f.total_ms, f.setup_ms, f.steps, f.depformer_steps, f.steps_ms, f.temporal_ms, f.depformer_ms
            )
        };
        let mut s = format!(
            "text to speech: {} stream(s) started together, cfg condition {}, {} codebooks generated, {} cross-attention source positions each\n",
            self.streams, self.cfg_coef, self.codebooks, self.source_positions
        );
        s += &line("fresh streams, warm model", &self.first_audio);
        s += &line("first streams after loading", &self.first_audio_cold);
        s += &format!(
            "setup {:.1} ms per stream; one voice's cross-attention keys and values alone {:.1} ms ({:.1} GFLOP, {:.1} GFLOP/s), the next voice's {:.1} ms ({:.1} GFLOP); first-audio steps' bandwidth bound {:.1} ms\n",
            self.setup_per_stream_ms, self.cross_kv_ms, self.cross_kv_gflop, self.cross_kv_gflops,
            self.cross_kv_next_voice_ms, self.cross_kv_next_voice_gflop, self.first_audio_steps_bound_ms
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_is_bytes_over_bandwidth() {
        // 1 GB at 10 GB/s = 100 ms; measured 150 ms -> 1.5x, 6.67 GB/s effective.
        let b = BandwidthBound::new(1_000_000_000, 10.0, 150.0);
        assert!((b.lm_bound_ms - 100.0).abs() < 1e-9);
        assert!((b.ratio_to_bound - 1.5).abs() < 1e-9);
        assert!((b.effective_gbps - 1e9 / 150e6).abs() < 1e-9);
        let none = BandwidthBound::new(0, 10.0, 5.0);
        assert_eq!((none.lm_bound_ms, none.ratio_to_bound), (0.0, 0.0));
    }
}
