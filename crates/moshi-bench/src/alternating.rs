//! Timing variants side by side in one process: each round runs every variant once, in turn, so
//! that the medians compare however the machine drifts between rounds (the kernel benches'
//! comparisons: two kernels, or one and several activation rows).

use std::time::Instant;

/// Median seconds per call of each of the `N` variants over `rounds` rounds, after one warm-up
/// round that is not counted (pages, caches, the thread team). In each round variant `k` runs
/// `calls` times in a row, `call(k, i)` for `i < calls`.
pub fn medians_per_call<const N: usize>(
    rounds: usize,
    calls: usize,
    mut call: impl FnMut(usize, usize),
) -> [f64; N] {
    assert!(rounds > 0 && calls > 0, "at least one round and one call");
    let mut samples: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(rounds));
    for round in 0..=rounds {
        for (k, samples) in samples.iter_mut().enumerate() {
            let start = Instant::now();
            for i in 0..calls {
                call(k, i);
            }
            if round > 0 {
                samples.push(start.elapsed().as_secs_f64() / calls as f64);
            }
        }
    }
    samples.map(|mut s| {
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_runs_calls_times_a_round_in_turn_and_the_warm_up_is_not_counted() {
        let mut order = Vec::new();
        let medians = medians_per_call::<2>(3, 2, |k, i| order.push((k, i)));
        // One warm-up round and three counted ones, each running variant 0 twice, then 1 twice.
        let round = [(0, 0), (0, 1), (1, 0), (1, 1)];
        assert_eq!(order, round.repeat(4));
        assert!(medians.iter().all(|m| m.is_finite() && *m >= 0.0));
    }

    #[test]
    fn the_median_is_of_the_counted_rounds_per_call() {
        // Variant 1 sleeps 2 ms a call in counted rounds only: its median reflects them, per call.
        let mut round = 0;
        let medians = medians_per_call::<2>(3, 2, |k, i| {
            if k == 0 && i == 0 {
                round += 1;
            }
            if k == 1 && round > 1 {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        });
        assert!(medians[1] >= 0.002, "{medians:?}");
        assert!(medians[0] < medians[1], "{medians:?}");
    }
}
