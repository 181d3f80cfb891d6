//! The instruction-set variants of every kernel of this crate, which of them this CPU runs, and
//! the one choice (detected once, overridable by environment) that dense and quantized products
//! alike follow.
//!
//! Adding an architecture: a variant here, its `is_available` test, and one arm per kernel
//! family where the variant has an implementation (`dense::matvec`, `dense::accumulate`,
//! `dense::gemm`, `dense::activations`, `q8_small` and the quantized plans of `quant`); the
//! other arms fall back to the portable code.

use std::sync::OnceLock;

/// Environment variable naming the kernel [`Kernel::detect`] returns (`portable`, `avx2`,
/// `avx2int`, `avx512`, `avx512vnni`, `neon`, `neondot`).
pub const KERNEL_ENV: &str = "MOSHI_KERNEL";

/// The variable's former name (when the crate held only the quantized kernels), still honoured
/// when [`KERNEL_ENV`] is not set.
pub const LEGACY_KERNEL_ENV: &str = "MOSHI_QUANT_KERNEL";

/// What a process's quantized products mostly are. Where the fastest kernel differs, it decides
/// [`Kernel::detect`]'s default: on x86-64 with AVX2 but no AVX-512, the 7B's LM step for one
/// session took 0.71-0.86x of the f32 kernel's time with the integer kernel
/// ([`Kernel::Avx2Int`]), but 1.6-2.1x of it for 4 sessions, whose 4-row products share the f32
/// kernel's decode (Zen 3, `moshi-rs bench --layers 2`, docs/performance.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// One activation row per product: one conversation (`chat`, `file`). The default.
    OneRow,
    /// Several rows per product: a server's batched step over its sessions.
    Batched,
}

impl Workload {
    /// The workload of products of `rows` activation rows: a session's one row, or the rows of
    /// several sessions, or of guidance's conditioned and unconditioned passes.
    pub fn of_rows(rows: usize) -> Workload {
        if rows > 1 {
            Workload::Batched
        } else {
            Workload::OneRow
        }
    }
}

/// The declared workload ([`Kernel::set_workload`]).
static WORKLOAD: OnceLock<Workload> = OnceLock::new();

/// The kernel every product uses, once [`Kernel::detect`] has chosen it.
static CHOSEN: OnceLock<Kernel> = OnceLock::new();

/// An instruction-set variant of the kernels. Every variant exists on every target (so names
/// parse and print anywhere); only the current architecture's can be available, and only its
/// code is compiled in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Plain Rust, any target (the compiler may still auto-vectorize it).
    Portable,
    /// x86-64 AVX2 + FMA, 8 lanes.
    Avx2,
    /// [`Kernel::Avx2`] with 4-bit products as integer products of the codes with 24-bit
    /// fixed-point activations (see `quant::avx2int`), the arithmetic of [`Kernel::Avx512Vnni`]
    /// in AVX2 instructions. Everything else (8-bit products, dense products, activations the
    /// fixed point cannot hold) runs the [`Kernel::Avx2`] code.
    Avx2Int,
    /// x86-64 AVX-512 (F and BW) with AVX2 and FMA, 16 lanes.
    Avx512,
    /// [`Kernel::Avx512`] plus VNNI: 4-bit products as integer dot products of the codes with
    /// 24-bit fixed-point activations (see `quant::vnni`). Everything else (8-bit products, dense
    /// products, activations the fixed point cannot hold) runs the [`Kernel::Avx512`] code.
    Avx512Vnni,
    /// aarch64 Advanced SIMD (NEON, part of every aarch64 CPU), 4 lanes.
    Neon,
    /// [`Kernel::Neon`] plus the dot-product extension (`sdot`; Armv8.4, optional from Armv8.2,
    /// every Apple M-series core): 4-bit products as integer dot products of the codes with
    /// 24-bit fixed-point activations (see `quant::dotprod`), like [`Kernel::Avx512Vnni`].
    /// Everything else runs the [`Kernel::Neon`] code.
    NeonDot,
}

impl Kernel {
    /// All variants; within each architecture, slowest first.
    pub const ALL: [Kernel; 7] = [
        Kernel::Portable,
        Kernel::Avx2,
        Kernel::Avx2Int,
        Kernel::Avx512,
        Kernel::Avx512Vnni,
        Kernel::Neon,
        Kernel::NeonDot,
    ];

    /// Short name (`"portable"`, `"avx2"`, `"avx2int"`, `"avx512"`, `"avx512vnni"`, `"neon"`,
    /// `"neondot"`).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::Avx2Int => "avx2int",
            Kernel::Avx512 => "avx512",
            Kernel::Avx512Vnni => "avx512vnni",
            Kernel::Neon => "neon",
            Kernel::NeonDot => "neondot",
        }
    }

    /// Whether this CPU can run the variant (every variant implies the ones before it on the same
    /// architecture).
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 | Kernel::Avx2Int => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                Kernel::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => {
                Kernel::Avx512.is_available() && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx2 | Kernel::Avx2Int | Kernel::Avx512 | Kernel::Avx512Vnni => false,
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Kernel::NeonDot => {
                Kernel::Neon.is_available() && std::arch::is_aarch64_feature_detected!("dotprod")
            }
            #[cfg(not(target_arch = "aarch64"))]
            Kernel::Neon | Kernel::NeonDot => false,
        }
    }

    /// The variants this CPU can run, slowest first.
    pub fn available() -> Vec<Kernel> {
        Kernel::ALL
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }

    /// The variant named `name` ([`Kernel::name`]), if any.
    pub fn from_name(name: &str) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The fastest variant this CPU can run for one activation row at a time.
    pub fn fastest() -> Kernel {
        Kernel::fastest_for(Workload::OneRow)
    }

    /// The fastest variant this CPU can run for `workload`: the last available one, skipping
    /// for [`Workload::Batched`] those that are fast only for one row ([`Kernel::Avx2Int`]).
    pub fn fastest_for(workload: Workload) -> Kernel {
        Kernel::available()
            .into_iter()
            .rev()
            .find(|k| workload == Workload::OneRow || *k != Kernel::Avx2Int)
            .unwrap_or(Kernel::Portable)
    }

    /// Declares what this process's products will mostly be, before the first of them: it picks
    /// [`Kernel::detect`]'s default. Returns the kernel already chosen if it comes too late (a
    /// product ran first, or it was declared already), so the caller can say so.
    pub fn set_workload(workload: Workload) -> Result<(), Kernel> {
        if let Some(chosen) = CHOSEN.get() {
            return Err(*chosen);
        }
        WORKLOAD.set(workload).map_err(|_| Kernel::detect())
    }

    /// The kernel every product uses (decided once): the one named by [`KERNEL_ENV`] (or, when
    /// that is not set, [`LEGACY_KERNEL_ENV`]) where this CPU runs it (e.g. `avx512` for the f32
    /// kernel on a VNNI machine, `portable` for the plain-Rust code), otherwise
    /// [`Kernel::fastest_for`] the declared [`Workload`] ([`Kernel::set_workload`]; one row if
    /// none was). An unknown or unavailable name is reported with a warning and ignored.
    pub fn detect() -> Kernel {
        *CHOSEN.get_or_init(|| {
            let chosen = [KERNEL_ENV, LEGACY_KERNEL_ENV]
                .into_iter()
                .find_map(|var| std::env::var(var).ok().map(|name| (var, name)));
            match chosen {
                Some((var, name)) => Kernel::from_override(var, &name),
                None => Kernel::fastest_for(*WORKLOAD.get_or_init(|| Workload::OneRow)),
            }
        })
    }

    /// The kernel an override `var=name` asks for, or the fastest one with a warning saying why
    /// not.
    fn from_override(var: &str, name: &str) -> Kernel {
        let fastest = Kernel::fastest_for(*WORKLOAD.get_or_init(|| Workload::OneRow));
        match Kernel::from_name(name) {
            Some(kernel) if kernel.is_available() => kernel,
            Some(_) => {
                tracing::warn!(
                    "{var}={name}: this CPU cannot run it; using {}",
                    fastest.name()
                );
                fastest
            }
            None => {
                let names: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
                tracing::warn!(
                    "{var}={name}: unknown kernel (expected one of {}); using {}",
                    names.join(", "),
                    fastest.name()
                );
                fastest
            }
        }
    }

    /// This kernel if this CPU runs it, else [`Kernel::detect`]'s choice.
    #[inline]
    pub fn or_detected(self) -> Kernel {
        let detected = Kernel::detect();
        if self == detected || self.is_available() {
            self
        } else {
            detected
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detected_kernel_is_available_and_names_round_trip() {
        assert!(Kernel::detect().is_available());
        assert!(Kernel::available().contains(&Kernel::Portable));
        for k in Kernel::ALL {
            assert_eq!(Kernel::from_name(k.name()), Some(k));
        }
        assert_eq!(
            Kernel::from_override("X", "no-such-kernel"),
            Kernel::fastest()
        );
        assert_eq!(Kernel::from_override("X", "portable"), Kernel::Portable);
    }

    #[test]
    fn a_batched_workload_never_defaults_to_a_one_row_kernel() {
        let available = Kernel::available();
        assert_eq!(
            Kernel::fastest_for(Workload::OneRow),
            *available.last().unwrap()
        );
        let batched = Kernel::fastest_for(Workload::Batched);
        assert!(available.contains(&batched) && batched != Kernel::Avx2Int);
        if Kernel::Avx2.is_available() && !Kernel::Avx512.is_available() {
            assert_eq!(Kernel::fastest(), Kernel::Avx2Int);
            assert_eq!(batched, Kernel::Avx2);
        }
    }

    #[test]
    fn every_variant_implies_the_ones_before_it_on_its_architecture() {
        // 0: any target; 1: x86-64; 2: aarch64.
        let architecture = |k: Kernel| match k {
            Kernel::Portable => 0,
            Kernel::Avx2 | Kernel::Avx2Int | Kernel::Avx512 | Kernel::Avx512Vnni => 1,
            Kernel::Neon | Kernel::NeonDot => 2,
        };
        let available = Kernel::available();
        for (i, &k) in Kernel::ALL.iter().enumerate() {
            if available.contains(&k) {
                assert!(
                    Kernel::ALL[..i]
                        .iter()
                        .filter(|e| [0, architecture(k)].contains(&architecture(**e)))
                        .all(|e| e.is_available()),
                    "{k:?}"
                );
            }
        }
        #[cfg(target_arch = "aarch64")]
        assert!(
            Kernel::Neon.is_available(),
            "NEON is part of every aarch64 CPU"
        );
        #[cfg(target_arch = "x86_64")]
        assert!(!Kernel::Neon.is_available() && !Kernel::NeonDot.is_available());
        #[cfg(target_arch = "aarch64")]
        assert!(Kernel::available().iter().all(|k| architecture(*k) != 1));
    }
}
