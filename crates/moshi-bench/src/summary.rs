//! Summaries of per-round samples for the benchmarks that alternate contestants round by round
//! (the peer benchmarks in `scripts/`): the median and the range, and the two as a table cell.

/// The median of `values` (the upper middle of an even count).
///
/// # Panics
/// If `values` is empty (caller bug: no rounds ran).
pub fn median(values: &[f64]) -> f64 {
    assert!(!values.is_empty(), "median of no values");
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// The smallest and the largest of `values` (`(inf, 0)` for none).
pub fn range(values: &[f64]) -> (f64, f64) {
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    (low, values.iter().copied().fold(0.0, f64::max))
}

/// `median [low-high]` of `values`, each with `decimals` decimals: a table cell of the rounds.
pub fn median_and_range(values: &[f64], decimals: usize) -> String {
    let (low, high) = range(values);
    let median = median(values);
    format!("{median:.decimals$} [{low:.decimals$}-{high:.decimals$}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_range_of_rounds() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(range(&[2.5, 0.5, 9.0]), (0.5, 9.0));
        assert_eq!(median_and_range(&[2.5, 0.5, 9.0], 1), "2.5 [0.5-9.0]");
    }
}
