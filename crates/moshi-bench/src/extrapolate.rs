//! From a run with `N` temporal layers to the config's full depth: every missing layer adds the
//! measured median time and the byte counts (weights, KV cache) of one layer. The result is
//! labelled extrapolated.

use moshi_runtime::metrics::LatencyStats;
use moshi_runtime::FRAME_MS;

use crate::report::{BandwidthBound, Extrapolation, StageStats, WeightBytes};

/// Figures for `full_layers` temporal layers from a run of `run_layers` layers whose frames took
/// `stats`, whose temporal layers took `layer_ms` each (the statistics of one mean per frame),
/// reading `weights`.
/// `None` when nothing is missing or no layer time was measured.
pub fn extrapolate_to_full_depth(
    stats: &StageStats,
    layer_ms: &LatencyStats,
    weights: &WeightBytes,
    run_layers: usize,
    full_layers: usize,
    read_bandwidth_gbps: f64,
) -> Option<Extrapolation> {
    if full_layers <= run_layers || layer_ms.count() == 0 {
        return None;
    }
    // Each layer runs `weight_passes_per_frame` times a frame (1: all rows of all sessions in
    // one batched step; the measured layer time is that step's).
    let passes = weights.weight_passes_per_frame.max(1);
    let missing = (full_layers - run_layers) as f64;
    let per_layer = layer_ms.percentiles();
    let add_ms = missing * passes as f64 * per_layer.p50;
    let add_resident_bytes = (full_layers - run_layers) as u64 * weights.temporal_layer_bytes;
    let add_bytes = passes * add_resident_bytes;
    let add_kv_bytes = (full_layers - run_layers) as u64 * weights.kv_cache_layer_read_bytes;
    let lm_step_p50_ms = stats.lm_step_ms.p50 + add_ms;
    let read_per_frame_bytes = weights.read_per_frame_bytes + add_bytes;
    let kv_cache_read_per_frame_bytes = weights.kv_cache_read_per_frame_bytes + add_kv_bytes;
    // The cross-attention sources' keys and values: the same bytes in every layer.
    let cross_kv_read_per_frame_bytes =
        weights.cross_kv_read_per_frame_bytes / run_layers.max(1) as u64 * full_layers as u64;
    Some(Extrapolation {
        note: format!(
            "extrapolated, not measured: {run_layers} of {full_layers} temporal layers were run; each missing layer \
             adds {passes} x the measured median layer time {:.3} ms, {passes} x {} weight bytes and {} KV-cache bytes read",
            per_layer.p50, weights.temporal_layer_bytes, weights.kv_cache_layer_read_bytes
        ),
        layers: full_layers,
        per_layer_p50_ms: per_layer.p50,
        lm_temporal_p50_ms: stats.lm_temporal_ms.p50 + add_ms,
        lm_step_p50_ms,
        total_p50_ms: stats.total_ms.p50 + add_ms,
        real_time_factor: (stats.total_ms.mean + missing * passes as f64 * per_layer.mean) / FRAME_MS,
        resident_bytes: weights.resident_bytes + add_resident_bytes,
        read_per_frame_bytes,
        kv_cache_read_per_frame_bytes,
        cross_kv_read_per_frame_bytes,
        bound: BandwidthBound::new(
            read_per_frame_bytes + kv_cache_read_per_frame_bytes + cross_kv_read_per_frame_bytes,
            read_bandwidth_gbps,
            lm_step_p50_ms,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshi_runtime::metrics::Percentiles;

    fn layers(ms: &[f64]) -> LatencyStats {
        let mut stats = LatencyStats::default();
        ms.iter().for_each(|&v| stats.push(v));
        stats
    }

    fn flat(v: f64) -> Percentiles {
        Percentiles {
            min: v,
            p50: v,
            p95: v,
            p99: v,
            max: v,
            mean: v,
        }
    }

    #[test]
    fn adds_one_measured_layer_per_missing_layer() {
        let stats = StageStats {
            lm_temporal_ms: flat(30.0),
            lm_step_ms: flat(50.0),
            total_ms: flat(60.0),
            ..Default::default()
        };
        let weights = WeightBytes {
            resident_bytes: 3_000,
            read_per_frame_bytes: 2_000,
            temporal_layer_bytes: 500,
            kv_cache_layer_read_bytes: 100,
            kv_cache_read_per_frame_bytes: 200,
            ..Default::default()
        };
        let x =
            extrapolate_to_full_depth(&stats, &layers(&[9.0, 10.0, 11.0]), &weights, 2, 32, 1.0)
                .unwrap();
        assert_eq!(x.layers, 32);
        assert_eq!(x.per_layer_p50_ms, 10.0);
        assert_eq!(x.lm_temporal_p50_ms, 30.0 + 300.0);
        assert_eq!(x.lm_step_p50_ms, 50.0 + 300.0);
        assert_eq!(x.total_p50_ms, 60.0 + 300.0);
        assert!((x.real_time_factor - 360.0 / 80.0).abs() < 1e-12);
        assert_eq!(x.read_per_frame_bytes, 2_000 + 30 * 500);
        assert_eq!(x.kv_cache_read_per_frame_bytes, 200 + 30 * 100);
        // The KV caches are read, not held beyond the run's: only weights add to the resident set.
        assert_eq!(x.resident_bytes, 3_000 + 30 * 500);
        assert!(x.note.contains("extrapolated"));
        // 17 kB of weights + 3.2 kB of KV caches at 1 GB/s = 0.0202 ms.
        assert!((x.bound.lm_bound_ms - 0.0202).abs() < 1e-12);
        assert!(
            extrapolate_to_full_depth(&stats, &layers(&[1.0]), &weights, 32, 32, 1.0).is_none()
        );
        // Guidance: each layer runs (and is read) once per row; the weights are held once.
        let guided = WeightBytes {
            weight_passes_per_frame: 2,
            ..weights.clone()
        };
        let x = extrapolate_to_full_depth(&stats, &layers(&[9.0, 10.0, 11.0]), &guided, 2, 32, 1.0)
            .unwrap();
        assert_eq!(x.lm_step_p50_ms, 50.0 + 600.0);
        assert_eq!(x.read_per_frame_bytes, 2_000 + 2 * 30 * 500);
        assert_eq!(x.kv_cache_read_per_frame_bytes, 200 + 30 * 100);
        assert_eq!(x.resident_bytes, 3_000 + 30 * 500);
        assert!(extrapolate_to_full_depth(&stats, &layers(&[]), &weights, 2, 32, 1.0).is_none());
        // A TTS voice's keys and values: read in every layer, so 16 x the 2 layers' bytes.
        let voiced = WeightBytes {
            cross_kv_read_per_frame_bytes: 2 * 1_000,
            ..weights.clone()
        };
        let x = extrapolate_to_full_depth(&stats, &layers(&[10.0]), &voiced, 2, 32, 1.0).unwrap();
        assert_eq!(x.cross_kv_read_per_frame_bytes, 32 * 1_000);
        assert!((x.bound.lm_bound_ms - 0.0522).abs() < 1e-12);
    }
}
