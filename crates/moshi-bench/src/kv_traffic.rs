//! Keys and values the temporal attention reads per frame. Each frame adds one position to every
//! temporal layer's KV cache, up to the context (3000 positions, 4 minutes for moshiko), so late
//! in a conversation the caches are read as many bytes per frame as a q4 layer's weights.

/// Bytes of keys and values (`position_bytes` each per position: values and any scales) one
/// temporal layer reads per frame, averaged over frames `warmup..warmup + frames` of a run from an
/// empty cache whose first frame takes `first_frame_steps` LM steps and every later frame one:
/// frame `i` (from 0) attends over `min(first_frame_steps + i, context)` positions (at its last
/// step).
pub fn kv_read_per_layer_bytes(
    position_bytes: usize,
    context: usize,
    first_frame_steps: usize,
    warmup: usize,
    frames: usize,
) -> u64 {
    if frames == 0 {
        return 0;
    }
    let positions: u64 = (warmup..warmup + frames)
        .map(|i| (first_frame_steps + i).min(context) as u64)
        .sum();
    // Keys and values; rounded to whole bytes after the mean.
    2 * position_bytes as u64 * positions / frames as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_the_frames_up_to_the_context() {
        // Frames 1, 2, 3 (after one warm-up frame) attend over 2, 3, 4 positions: mean 3.
        assert_eq!(
            kv_read_per_layer_bytes(4 * 256, 3000, 1, 1, 3),
            2 * 4 * 256 * 3
        );
        // bf16 caches: half the bytes.
        assert_eq!(
            kv_read_per_layer_bytes(2 * 256, 3000, 1, 1, 3),
            2 * 2 * 256 * 3
        );
        // A first frame of two steps (the pipeline's) shifts every frame by one position.
        assert_eq!(
            kv_read_per_layer_bytes(4 * 256, 3000, 2, 1, 3),
            2 * 4 * 256 * 4
        );
        // A full window: every timed frame reads the whole context.
        assert_eq!(
            kv_read_per_layer_bytes(4 * 4096, 3000, 1, 3000, 20),
            2 * 4 * 4096 * 3000
        );
        // Crossing the context: frames 2..6 attend over 3, 4, 4, 4 positions (context 4).
        assert_eq!(
            kv_read_per_layer_bytes(4 * 8, 4, 1, 2, 4),
            2 * 4 * 8 * 15 / 4
        );
        assert_eq!(kv_read_per_layer_bytes(4 * 8, 4, 1, 2, 0), 0);
    }
}
