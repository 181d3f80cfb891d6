//! The flags the peer benchmarks' whole-step contests share (`scripts/peer-candle step`,
//! `scripts/peer-ggml step`): threads, rounds, how many of Moshi 7B's layers, steps a round.

/// Moshi 7B's temporal layers: the most a contest can build.
const MOSHI_7B_LAYERS: usize = 32;

/// The shared flags of a whole-step contest, with each peer's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepFlags {
    pub threads: usize,
    pub rounds: usize,
    pub layers: usize,
    pub steps: usize,
}

impl StepFlags {
    /// Takes `flag` with `value` if it is one of these flags (`Ok(true)`), else leaves it to the
    /// caller (`Ok(false)`); an error names the flag, the value and what was expected.
    pub fn take(&mut self, flag: &str, value: &str) -> Result<bool, String> {
        match flag {
            "--threads" => self.threads = positive(flag, value)?,
            "--rounds" => self.rounds = positive(flag, value)?,
            "--layers" => {
                self.layers = positive(flag, value)?;
                if self.layers > MOSHI_7B_LAYERS {
                    return Err(format!(
                        "--layers {value}: Moshi 7B has {MOSHI_7B_LAYERS} layers"
                    ));
                }
            }
            "--steps" => self.steps = positive(flag, value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// `value` of `flag` as a positive integer, or an error naming both.
pub fn positive(flag: &str, value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag} {value}: expected a positive integer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_flags_are_taken_checked_and_others_left() {
        let mut flags = StepFlags {
            threads: 2,
            rounds: 7,
            layers: 8,
            steps: 4,
        };
        assert_eq!(flags.take("--layers", "32"), Ok(true));
        assert_eq!(flags.take("--rounds", "3"), Ok(true));
        assert_eq!((flags.layers, flags.rounds), (32, 3));
        assert_eq!(flags.take("--formats", "q4_0"), Ok(false));
        let too_many = flags.take("--layers", "33").unwrap_err();
        assert!(too_many.contains("--layers 33") && too_many.contains("32 layers"));
        let zero = flags.take("--steps", "0").unwrap_err();
        assert!(zero.contains("--steps 0") && zero.contains("positive integer"));
        assert!(flags.take("--threads", "two").is_err());
    }
}
