//! The kernels of this crate along their two axes, which of them this CPU runs, and the one choice
//! (made once per process, overridable by environment) that dense and quantized products alike
//! follow.
//!
//! **The two axes.** A [`Kernel`] is an [`InstructionSet`] (the SIMD code a product is compiled
//! for) and a [`QuantAlgorithm`] (how 4-bit quantized products are summed: in f32, or as integer
//! dot products of the codes with fixed-point activations). Only the quantized products look at
//! the algorithm; every other kernel family (dense products, attention's accumulation, Mimi's
//! few-row products, activations) asks only [`Kernel::instruction_set`]. The seven kernels keep
//! their user-facing names ([`Kernel::name`], the values of [`KERNEL_ENV`]); [`Kernel::pair`]
//! is the one table from a name to its two axes.
//!
//! Adding an instruction set: an [`InstructionSet`] variant with its `is_available` and
//! `has_integer_dot` tests, its kernels in [`Kernel`] (`ALL`, `name`, `pair`), and one arm per
//! family where it has code (`dense::matvec`, `dense::accumulate`, `dense::gemm`,
//! `dense::activations`, `dense::panels`, and `quant`'s `lane_rows` / `digit_rows` /
//! `digit_activations`); the other families fall back to the portable code. Adding an algorithm:
//! a [`QuantAlgorithm`] variant, its kernels in [`Kernel`], and its arm in `quant`'s plan; the
//! dense families do not change.
//!
//! **Choosing once.** Products do not take a kernel argument: the model's layers call them from
//! many places, and every product of a process must use the same kernel (a session's output must
//! not depend on who shares its batch). So the kernel is process-wide state, fixed once. What is
//! explicit is the workload that picks the default: a binary that knows its products have several
//! activation rows calls [`Kernel::init`] with that [`Workload`] before its first product and gets
//! back the kernel every product will use. Without it, the first product fixes the one-row
//! default ([`Kernel::detect`]). A later [`Kernel::init`] whose workload selects another kernel
//! than the one fixed is an error ([`KernelAlreadyChosen`]) that names both, rather than a
//! declaration silently dropped; one that selects the same kernel succeeds.
//! [`Kernel::select`] is the same choice without fixing anything.

use std::fmt;
use std::sync::OnceLock;

use crate::KernelAlreadyChosen;

/// Environment variable naming the kernel every product uses (`portable`, `avx2`, `avx2int`,
/// `avx512`, `avx512vnni`, `neon`, `neondot`).
pub const KERNEL_ENV: &str = "MOSHI_KERNEL";

/// The variable's former name (when the crate held only the quantized kernels), still honoured
/// when [`KERNEL_ENV`] is not set.
pub const LEGACY_KERNEL_ENV: &str = "MOSHI_QUANT_KERNEL";

/// What a process's quantized products mostly are. Where the fastest kernel differs, it decides
/// [`Kernel::select`]'s default: on x86-64 with AVX2 but no AVX-512, the integer kernel
/// ([`Kernel::Avx2Int`]) shares no work between activation rows where the f32 kernel shares its
/// decode, so it is the faster for one row and the slower for several (measured in
/// docs/performance.md, "AVX2-only hosts").
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

/// The kernel every product uses, once [`Kernel::init`] or [`Kernel::detect`] has fixed it.
static CHOSEN: OnceLock<Kernel> = OnceLock::new();

/// The instruction set a kernel's code is compiled for. Every variant exists on every target (so
/// kernel names parse and print anywhere); only the current architecture's can be available, and
/// only its code is compiled in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstructionSet {
    /// Plain Rust, any target (the compiler may still auto-vectorize it).
    Portable,
    /// x86-64 AVX2 + FMA, 8 lanes.
    Avx2,
    /// x86-64 AVX-512 (F and BW) with AVX2 and FMA, 16 lanes.
    Avx512,
    /// aarch64 Advanced SIMD (NEON, part of every aarch64 CPU), 4 lanes.
    Neon,
}

impl InstructionSet {
    /// The architecture (`std::env::consts::ARCH`) whose CPUs can run it, `None` for any.
    pub fn target_arch(self) -> Option<&'static str> {
        match self {
            InstructionSet::Portable => None,
            InstructionSet::Avx2 | InstructionSet::Avx512 => Some("x86_64"),
            InstructionSet::Neon => Some("aarch64"),
        }
    }

    /// Whether this CPU runs the instruction set (AVX-512 implies AVX2).
    pub fn is_available(self) -> bool {
        match self {
            InstructionSet::Portable => true,
            #[cfg(target_arch = "x86_64")]
            InstructionSet::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            InstructionSet::Avx512 => {
                InstructionSet::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "aarch64")]
            InstructionSet::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            _ => false,
        }
    }

    /// Whether this CPU has what the instruction set's integer-digit kernel
    /// ([`QuantAlgorithm::IntegerDigits`]) needs beyond the instruction set itself: nothing for
    /// AVX2 (it emulates the dot product with `vpmaddubsw`/`vpmaddwd`), VNNI for AVX-512, the
    /// dot-product extension (`sdot`) for NEON. The portable code has no such kernel.
    fn has_integer_dot(self) -> bool {
        match self {
            InstructionSet::Portable => false,
            #[cfg(target_arch = "x86_64")]
            InstructionSet::Avx2 => true,
            #[cfg(target_arch = "x86_64")]
            InstructionSet::Avx512 => is_x86_feature_detected!("avx512vnni"),
            #[cfg(target_arch = "aarch64")]
            InstructionSet::Neon => std::arch::is_aarch64_feature_detected!("dotprod"),
            _ => false,
        }
    }
}

/// How a kernel computes 4-bit quantized products. Every other product (8-bit and other widths
/// where the integer kernel has no code, dense products, activations the fixed point cannot hold)
/// runs the f32 code of the same instruction set whatever the algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantAlgorithm {
    /// f32 arithmetic: the instruction set's lane kernel (`scale · Σ q x + bias · Σ x` per group,
    /// see `quant::lanes`), or the portable code's dequantized weights.
    F32,
    /// `Σ q x` as exact integer dot products of the codes with 24-bit fixed-point activation
    /// digits (see `quant::fixed_point`): VNNI on AVX-512 (`quant::vnni`), `vpmaddubsw` and
    /// `vpmaddwd` on AVX2 (`quant::avx2int`), `sdot` on NEON (`quant::dotprod`).
    IntegerDigits,
}

/// A kernel: an [`InstructionSet`] and a [`QuantAlgorithm`] ([`Kernel::pair`]), under the name a
/// user selects it by ([`Kernel::name`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// [`InstructionSet::Portable`], [`QuantAlgorithm::F32`].
    Portable,
    /// [`InstructionSet::Avx2`], [`QuantAlgorithm::F32`].
    Avx2,
    /// [`InstructionSet::Avx2`], [`QuantAlgorithm::IntegerDigits`]: the arithmetic of
    /// [`Kernel::Avx512Vnni`] in AVX2 instructions.
    Avx2Int,
    /// [`InstructionSet::Avx512`], [`QuantAlgorithm::F32`].
    Avx512,
    /// [`InstructionSet::Avx512`], [`QuantAlgorithm::IntegerDigits`] (VNNI).
    Avx512Vnni,
    /// [`InstructionSet::Neon`], [`QuantAlgorithm::F32`].
    Neon,
    /// [`InstructionSet::Neon`], [`QuantAlgorithm::IntegerDigits`] with the dot-product extension
    /// (`sdot`; Armv8.4, optional from Armv8.2, every Apple M-series core).
    NeonDot,
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Kernel {
    /// All kernels; within each architecture, slowest first (the order [`Kernel::select`] picks
    /// the last available one of).
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

    /// The kernel's two axes: the one table from a kernel to them.
    pub fn pair(self) -> (InstructionSet, QuantAlgorithm) {
        use InstructionSet as I;
        use QuantAlgorithm as A;
        match self {
            Kernel::Portable => (I::Portable, A::F32),
            Kernel::Avx2 => (I::Avx2, A::F32),
            Kernel::Avx2Int => (I::Avx2, A::IntegerDigits),
            Kernel::Avx512 => (I::Avx512, A::F32),
            Kernel::Avx512Vnni => (I::Avx512, A::IntegerDigits),
            Kernel::Neon => (I::Neon, A::F32),
            Kernel::NeonDot => (I::Neon, A::IntegerDigits),
        }
    }

    /// The kernel of `instruction_set` and `algorithm`, if there is one (the portable code has no
    /// integer-digit kernel).
    pub fn of(instruction_set: InstructionSet, algorithm: QuantAlgorithm) -> Option<Kernel> {
        Kernel::ALL
            .into_iter()
            .find(|k| k.pair() == (instruction_set, algorithm))
    }

    /// The instruction set whose code the kernel runs: all that the dense products, attention's
    /// accumulation, Mimi's few-row products and the activations ask.
    #[inline]
    pub fn instruction_set(self) -> InstructionSet {
        self.pair().0
    }

    /// How the kernel sums 4-bit quantized products.
    #[inline]
    pub fn algorithm(self) -> QuantAlgorithm {
        self.pair().1
    }

    /// The f32 kernel of the same instruction set: the kernel itself for [`QuantAlgorithm::F32`],
    /// else the one that runs the products an integer-digit kernel leaves (8-bit codes,
    /// activations the fixed point cannot hold).
    pub fn f32_sibling(self) -> Kernel {
        Kernel::of(self.instruction_set(), QuantAlgorithm::F32)
            .expect("every instruction set has an f32 kernel")
    }

    /// Whether this CPU can run the kernel (every kernel implies the ones before it in
    /// [`Kernel::ALL`] on the same architecture).
    pub fn is_available(self) -> bool {
        let (instruction_set, algorithm) = self.pair();
        instruction_set.is_available()
            && match algorithm {
                QuantAlgorithm::F32 => true,
                QuantAlgorithm::IntegerDigits => instruction_set.has_integer_dot(),
            }
    }

    /// Whether the kernel is the faster choice for `workload`. Only AVX2's integer kernel is not
    /// for [`Workload::Batched`]: without an integer dot-product instruction it spends more
    /// vector operations per row than the f32 kernel, which shares its decode between activation
    /// rows (see [`Workload`]); VNNI and `sdot` do the same sums in fewer.
    fn suits(self, workload: Workload) -> bool {
        workload == Workload::OneRow
            || self.pair() != (InstructionSet::Avx2, QuantAlgorithm::IntegerDigits)
    }

    /// The kernels this CPU can run, slowest first.
    pub fn available() -> Vec<Kernel> {
        Kernel::ALL
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }

    /// The kernel named `name` ([`Kernel::name`]), if any.
    pub fn from_name(name: &str) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The fastest kernel this CPU can run for one activation row at a time.
    pub fn fastest() -> Kernel {
        Kernel::fastest_for(Workload::OneRow)
    }

    /// The fastest kernel this CPU can run for `workload`: the last available one, skipping
    /// for [`Workload::Batched`] those that are fast only for one row ([`Kernel::Avx2Int`]).
    pub fn fastest_for(workload: Workload) -> Kernel {
        Kernel::available()
            .into_iter()
            .rev()
            .find(|k| k.suits(workload))
            .unwrap_or(Kernel::Portable)
    }

    /// The kernel for a process whose products are mostly `workload`, without fixing anything:
    /// the one named by [`KERNEL_ENV`] (or, when that is not set, [`LEGACY_KERNEL_ENV`]) where
    /// this CPU runs it (e.g. `avx512` for the f32 kernel on a VNNI machine, `portable` for the
    /// plain-Rust code), otherwise [`Kernel::fastest_for`] the workload. An unknown or unavailable
    /// name is reported with a warning and ignored.
    pub fn select(workload: Workload) -> Kernel {
        let named = [KERNEL_ENV, LEGACY_KERNEL_ENV]
            .into_iter()
            .find_map(|var| std::env::var(var).ok().map(|name| (var, name)));
        match named {
            Some((var, name)) => Kernel::from_override(var, &name, workload),
            None => Kernel::fastest_for(workload),
        }
    }

    /// Fixes the kernel every product of this process uses to [`Kernel::select`]`(workload)` and
    /// returns it; call it before the first product. Fails if a kernel was fixed already (by an
    /// earlier call, or by a product that ran first with the one-row default) and it is not the
    /// one `workload` selects: products keep the fixed kernel, and the error names both.
    pub fn init(workload: Workload) -> Result<Kernel, KernelAlreadyChosen> {
        let wanted = Kernel::select(workload);
        let chosen = *CHOSEN.get_or_init(|| wanted);
        if chosen == wanted {
            Ok(chosen)
        } else {
            Err(KernelAlreadyChosen {
                chosen,
                wanted,
                workload,
            })
        }
    }

    /// The kernel every product uses: the one [`Kernel::init`] fixed, else (fixing it now)
    /// [`Kernel::select`] for [`Workload::OneRow`].
    pub fn detect() -> Kernel {
        *CHOSEN.get_or_init(|| Kernel::select(Workload::OneRow))
    }

    /// The kernel products will use, without fixing it: the one fixed already, else the one
    /// [`Kernel::detect`] would fix. For choices made before the workload is declared (how a
    /// loader arranges weights: [`crate::QuantPanels`] where this is [`Kernel::Avx512Vnni`], which
    /// every workload selects on a CPU that has it unless [`KERNEL_ENV`] names another).
    pub fn anticipated() -> Kernel {
        CHOSEN
            .get()
            .copied()
            .unwrap_or_else(|| Kernel::select(Workload::OneRow))
    }

    /// The kernel an override `var=name` asks for, or the fastest one for `workload` with a
    /// warning saying why not.
    fn from_override(var: &str, name: &str, workload: Workload) -> Kernel {
        let fastest = Kernel::fastest_for(workload);
        match Kernel::from_name(name) {
            Some(kernel) if kernel.is_available() => kernel,
            Some(_) => {
                tracing::warn!("{var}={name}: this CPU cannot run it; using {fastest}");
                fastest
            }
            None => {
                let names: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
                tracing::warn!(
                    "{var}={name}: unknown kernel (expected one of {}); using {fastest}",
                    names.join(", "),
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
            assert_eq!(k.to_string(), k.name());
        }
        assert_eq!(
            Kernel::from_override("X", "no-such-kernel", Workload::OneRow),
            Kernel::fastest()
        );
        assert_eq!(
            Kernel::from_override("X", "portable", Workload::Batched),
            Kernel::Portable
        );
    }

    #[test]
    fn every_pair_with_an_implementation_is_one_kernel() {
        for k in Kernel::ALL {
            let (instruction_set, algorithm) = k.pair();
            assert_eq!(Kernel::of(instruction_set, algorithm), Some(k));
            assert_eq!(
                k.f32_sibling().pair(),
                (instruction_set, QuantAlgorithm::F32)
            );
            // The f32 sibling runs wherever the kernel does.
            assert!(!k.is_available() || k.f32_sibling().is_available());
        }
        assert_eq!(
            Kernel::of(InstructionSet::Portable, QuantAlgorithm::IntegerDigits),
            None
        );
        let names: Vec<_> = [Kernel::Avx512Vnni, Kernel::Avx2Int, Kernel::NeonDot]
            .map(|k| k.f32_sibling().name())
            .into();
        assert_eq!(names, ["avx512", "avx2", "neon"]);
    }

    #[test]
    fn init_returns_the_kernel_products_use_or_says_which_it_is() {
        // Every other test fixes the one-row choice (or nothing), so this holds whichever runs
        // first.
        let one_row = Kernel::select(Workload::OneRow);
        assert_eq!(Kernel::init(Workload::OneRow), Ok(one_row));
        assert_eq!(Kernel::detect(), one_row);
        let batched = Kernel::select(Workload::Batched);
        match Kernel::init(Workload::Batched) {
            Ok(kernel) => assert_eq!((kernel, batched), (one_row, one_row)),
            Err(e) => {
                assert_eq!((e.chosen, e.wanted), (one_row, batched));
                assert_ne!(one_row, batched);
                assert!(e.to_string().contains(batched.name()), "{e}");
            }
        }
        assert_eq!(Kernel::detect(), one_row);
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
        let architecture = |k: Kernel| k.instruction_set().target_arch();
        let available = Kernel::available();
        for (i, &k) in Kernel::ALL.iter().enumerate() {
            if available.contains(&k) {
                assert!(
                    Kernel::ALL[..i]
                        .iter()
                        .filter(|e| [None, architecture(k)].contains(&architecture(**e)))
                        .all(|e| e.is_available()),
                    "{k:?}"
                );
            }
        }
        // Only this architecture's kernels (and the portable one) can run.
        assert!(available
            .iter()
            .all(|k| { architecture(*k).is_none_or(|arch| arch == std::env::consts::ARCH) }));
        #[cfg(target_arch = "aarch64")]
        assert!(
            Kernel::Neon.is_available(),
            "NEON is part of every aarch64 CPU"
        );
        #[cfg(target_arch = "x86_64")]
        assert!(!Kernel::Neon.is_available() && !Kernel::NeonDot.is_available());
    }
}
