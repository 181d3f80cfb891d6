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
/// `avx512`, `avx512vnni`, `neon`, `neondot`).
pub const KERNEL_ENV: &str = "MOSHI_KERNEL";

/// The variable's former name (when the crate held only the quantized kernels), still honoured
/// when [`KERNEL_ENV`] is not set.
pub const LEGACY_KERNEL_ENV: &str = "MOSHI_QUANT_KERNEL";

/// An instruction-set variant of the kernels. Every variant exists on every target (so names
/// parse and print anywhere); only the current architecture's can be available, and only its
/// code is compiled in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Plain Rust, any target (the compiler may still auto-vectorize it).
    Portable,
    /// x86-64 AVX2 + FMA, 8 lanes.
    Avx2,
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
    pub const ALL: [Kernel; 6] = [
        Kernel::Portable,
        Kernel::Avx2,
        Kernel::Avx512,
        Kernel::Avx512Vnni,
        Kernel::Neon,
        Kernel::NeonDot,
    ];

    /// Short name (`"portable"`, `"avx2"`, `"avx512"`, `"avx512vnni"`, `"neon"`, `"neondot"`).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
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
            Kernel::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
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
            Kernel::Avx2 | Kernel::Avx512 | Kernel::Avx512Vnni => false,
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

    /// The fastest variant this CPU can run.
    pub fn fastest() -> Kernel {
        *Kernel::available().last().unwrap_or(&Kernel::Portable)
    }

    /// The kernel every product uses (decided once): the one named by [`KERNEL_ENV`] (or, when
    /// that is not set, [`LEGACY_KERNEL_ENV`]) where this CPU runs it (e.g. `avx512` for the f32
    /// kernel on a VNNI machine, `portable` for the plain-Rust code), otherwise
    /// [`Kernel::fastest`]. An unknown or unavailable name is reported with a warning and ignored.
    pub fn detect() -> Kernel {
        static CHOSEN: OnceLock<Kernel> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let chosen = [KERNEL_ENV, LEGACY_KERNEL_ENV]
                .into_iter()
                .find_map(|var| std::env::var(var).ok().map(|name| (var, name)));
            match chosen {
                Some((var, name)) => Kernel::from_override(var, &name),
                None => Kernel::fastest(),
            }
        })
    }

    /// The kernel an override `var=name` asks for, or the fastest one with a warning saying why
    /// not.
    fn from_override(var: &str, name: &str) -> Kernel {
        let fastest = Kernel::fastest();
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
    fn every_variant_implies_the_ones_before_it_on_its_architecture() {
        // 0: any target; 1: x86-64; 2: aarch64.
        let architecture = |k: Kernel| match k {
            Kernel::Portable => 0,
            Kernel::Avx2 | Kernel::Avx512 | Kernel::Avx512Vnni => 1,
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
