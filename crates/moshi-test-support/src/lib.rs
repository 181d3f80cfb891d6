//! Fixtures and helpers shared by the tests of every moshi-rs crate (a dev-dependency only, never
//! published): where the checked-in fixtures are, reading reference files, deterministic
//! pseudo-random numbers and running a built binary. Helpers panic with the file or command at
//! fault: they are for tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod broadband_voice;
pub use broadband_voice::write_tiny_a_with_broadband_voice;

/// The workspace root (the folder holding `assets/`, `configs/`, `scripts/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `assets/<name>`: a fixture folder (`tiny-a`, `tiny-hibiki`).
pub fn fixture_dir(name: &str) -> PathBuf {
    repo_root().join("assets").join(name)
}

/// A file of the fixture folder `name`, e.g. `fixture("tiny-hibiki", "config.json")`.
pub fn fixture(name: &str, relative: &str) -> PathBuf {
    fixture_dir(name).join(relative)
}

/// `assets/tiny-a`: the tiny random-weight checkpoints in every layout and the official
/// reference outputs (`ref/`).
pub fn tiny_a_dir() -> PathBuf {
    fixture_dir("tiny-a")
}

/// A file of `assets/tiny-a`, e.g. `tiny_a("ref/lm_greedy.json")`.
pub fn tiny_a(relative: &str) -> PathBuf {
    fixture("tiny-a", relative)
}

/// Copies the files `names` of `assets/tiny-a` into `dir` under the same names.
pub fn copy_tiny_a_files(dir: &Path, names: &[&str]) {
    for name in names {
        let to = dir.join(name);
        if let Err(e) = std::fs::copy(tiny_a(name), &to) {
            panic!("cannot copy tiny-a's {name} to {}: {e}", to.display());
        }
    }
}

/// `path` as `&str` (fixture and temporary paths are UTF-8).
/// The names of the entries of `dir`, sorted (to see what a run left behind).
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

pub fn path_str(path: &Path) -> &str {
    path.to_str()
        .unwrap_or_else(|| panic!("path {} is not UTF-8", path.display()))
}

/// The JSON document in `path`.
pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

/// The JSON Lines document in `path`, one value per line.
pub fn read_json_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{} line {}: not JSON: {e}", path.display(), i + 1))
        })
        .collect()
}

/// The files of `fuzz/<kind>/<target>` (`kind`: `seeds` or `regressions`), sorted, without the
/// `.gitkeep` that keeps an empty folder in git.
pub fn fuzz_inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = repo_root().join("fuzz").join(kind).join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.is_file() && p.file_name().is_some_and(|n| n != ".gitkeep"));
    files.sort();
    files
}

/// Runs a fuzz target's code on each of its seeds (there must be one) and kept regression
/// inputs; a panic fails the calling test.
pub fn replay_fuzz_inputs(target: &str, run: fn(&[u8])) {
    let seeds = fuzz_inputs("seeds", target);
    assert!(!seeds.is_empty(), "no seeds for {target}");
    for path in seeds.iter().chain(&fuzz_inputs("regressions", target)) {
        let bytes = std::fs::read(path).unwrap();
        eprintln!("{target}: {}", path.display());
        run(&bytes);
    }
}

/// Runs the built binary `program` (e.g. `env!("CARGO_BIN_EXE_moshi-rs")`) with `args`, offline
/// (`HF_HUB_OFFLINE=1`: a test never downloads), and returns what it did.
pub fn run_binary(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

/// Whether `program` is on the PATH (for tests that skip, saying why, when a tool is missing).
pub fn command_exists(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Whether every one of `tools` is installed, for `test`. Missing ones: on a developer machine
/// the test is skipped with `SKIPPED <test>: ...` (false); where the env var `CI` is set (CI
/// installs them with `setup`, e.g. `bash scripts/setup.sh --audio-e2e`) the test fails instead
/// of passing without checking anything.
pub fn tools_present(test: &str, tools: &[&str], setup: &str) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|p| !command_exists(p))
        .collect();
    missing_tools_verdict(test, &missing, setup, std::env::var_os("CI").is_some())
}

/// The decision of [`tools_present`]: panics on `ci` when tools are missing.
pub fn missing_tools_verdict(test: &str, missing: &[&str], setup: &str, ci: bool) -> bool {
    if missing.is_empty() {
        return true;
    }
    let message = format!("{test}: {missing:?} not installed (run `{setup}`)");
    assert!(!ci, "CI is set, so the tools must be installed: {message}");
    eprintln!("SKIPPED {message}");
    false
}

/// Normalised cross-correlation of `a` and `b` over their common length (1: the same signal up
/// to a gain).
pub fn ncc(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len().min(b.len());
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a[..n].iter().zip(&b[..n]) {
        ab += f64::from(x) * f64::from(y);
        aa += f64::from(x).powi(2);
        bb += f64::from(y).powi(2);
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-12)
}

/// What a finished command wrote to stderr, as text.
pub fn stderr_text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Marsaglia's xorshift64 (shifts 13, 7, 17): a deterministic stream from a non-zero state.
#[derive(Clone, Debug)]
pub struct XorShift64(u64);

impl XorShift64 {
    /// The generator whose first state is `state` (must not be 0).
    pub fn new(state: u64) -> Self {
        assert_ne!(state, 0, "xorshift64 needs a non-zero state");
        Self(state)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1) with 24 bits.
    pub fn uniform_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [0, 1) with 53 bits.
    pub fn uniform_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Vigna's xorshift64*: a deterministic stream from a non-zero seed.
#[derive(Clone, Debug)]
pub struct XorShift64Star(u64);

impl XorShift64Star {
    /// The generator seeded with `seed` (must not be 0).
    pub fn new(seed: u64) -> Self {
        assert_ne!(seed, 0, "xorshift64* needs a non-zero seed");
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [lo, hi) with 24 bits.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// `n` values in [-0.5, 0.5) from a multiplicative hash of the index (Knuth's 2654435761) offset
/// by `seed`, keeping the top 24 bits: cheap and deterministic. Seeds that differ only in their
/// low 8 bits give the same values.
pub fn hashed_uniform(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32
                / (1 << 24) as f32
                - 0.5
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tools_skip_on_a_developer_machine_and_fail_on_ci() {
        assert!(missing_tools_verdict("t", &[], "setup", true));
        assert!(!missing_tools_verdict("t", &["sox"], "setup", false));
        let on_ci =
            std::panic::catch_unwind(|| missing_tools_verdict("t", &["sox"], "setup", true));
        assert!(on_ci.is_err(), "a missing tool must fail the test on CI");
    }

    #[test]
    fn fixtures_are_found() {
        assert!(tiny_a("config.json").is_file());
        assert!(tiny_a_dir().join("ref").is_dir());
        assert!(repo_root().join("Cargo.toml").is_file());
        assert_eq!(read_json(&tiny_a("config.json"))["dim"], 256);
    }

    #[test]
    fn generators_repeat_their_streams() {
        let a: Vec<u64> = (0..4)
            .scan(XorShift64::new(1), |g, _| Some(g.next_u64()))
            .collect();
        // The first outputs of xorshift64 (13, 7, 17) from state 1.
        assert_eq!(a[0], 1_082_269_761);
        assert_eq!(
            a,
            (0..4)
                .scan(XorShift64::new(1), |g, _| Some(g.next_u64()))
                .collect::<Vec<_>>()
        );
        let mut star = XorShift64Star::new(7);
        let u: Vec<f32> = (0..1000).map(|_| star.uniform(-1.0, 1.0)).collect();
        assert!(u.iter().all(|v| (-1.0..1.0).contains(v)));
        let mean = u.iter().sum::<f32>() / u.len() as f32;
        assert!(mean.abs() < 0.1, "mean {mean}");
        let h = hashed_uniform(100, 3);
        assert_eq!(h, hashed_uniform(100, 3));
        assert_eq!(
            h,
            hashed_uniform(100, 4),
            "the low 8 bits of the seed are dropped"
        );
        assert_ne!(h, hashed_uniform(100, 3 + 256));
        assert!(h.iter().all(|v| (-0.5..0.5).contains(v)));
    }
}
