//! The benches' settings from environment variables (`MOSHI_BENCH_*`), parsed one way.

/// `name` parsed, or `default` when unset.
///
/// # Panics
/// If `name` is set to a value that does not parse, naming the variable and the value.
pub fn var_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value}: cannot parse this value")),
        Err(_) => default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_variable_gives_the_default_and_a_set_one_its_value() {
        assert_eq!(var_or("MOSHI_BENCH_TEST_UNSET_VARIABLE", 7usize), 7);
        std::env::set_var("MOSHI_BENCH_TEST_SET_VARIABLE", "12");
        assert_eq!(var_or("MOSHI_BENCH_TEST_SET_VARIABLE", 7usize), 12);
    }

    #[test]
    #[should_panic(expected = "MOSHI_BENCH_TEST_BAD_VARIABLE=x2: cannot parse")]
    fn a_value_that_does_not_parse_names_the_variable() {
        std::env::set_var("MOSHI_BENCH_TEST_BAD_VARIABLE", "x2");
        var_or("MOSHI_BENCH_TEST_BAD_VARIABLE", 7usize);
    }
}
