//! The instruction sets of the int8 kernels ([`Int8Isa`]): their names and how each is
//! detected. Reading `SLUICE_KERNEL_ISA`, resolving it and the warning are the dense kernels'
//! code, generic over [`KernelIsa`] (`kernels/dispatch.rs`).
//!
//! Separate from the dense kernels' [`Isa`](crate::kernels::Isa) because the fast int8 path
//! needs AVX-512 VNNI on top of AVX-512 F/BW, which the dense `Isa::Avx512` does not imply.
//! Both read the same variable, [`ISA_ENV_VAR`](crate::kernels::ISA_ENV_VAR):
//!
//! | value        | dense kernels | int8 kernels                               |
//! |--------------|---------------|--------------------------------------------|
//! | `scalar`     | scalar        | scalar                                     |
//! | `avx2`       | avx2          | avx2                                       |
//! | `avx512`     | avx512        | avx512vnni (detected level if no VNNI)     |
//! | `avx512vnni` | unrecognised  | avx512vnni                                 |
//!
//! so `avx512` is the spelling to use when both should be pinned. This module only decides; it
//! never logs. The daemon logs [`Int8IsaSelection::active`] at INFO and
//! [`Int8IsaSelection::warning`] at WARN once at startup.

use std::fmt;
use std::sync::OnceLock;

use crate::kernels::dispatch::{KernelIsa, OverrideProblem, Selection};

/// An instruction set the int8 kernels are written for, from least to most capable.
///
/// Any value can be constructed, but the kernels panic when handed one this CPU does not
/// support; take the value from [`Int8Isa::active`] or [`Int8Isa::detect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Int8Isa {
    /// Portable Rust, the reference; always available, and the only choice off x86_64.
    Scalar,
    /// x86_64 AVX2: bytes widened to i16 and multiplied with `vpmaddwd` (exact, no saturation).
    Avx2,
    /// x86_64 AVX-512 F + BW + VNNI: `vpdpbusd` on 64-byte chunks.
    Avx512Vnni,
}

impl Int8Isa {
    /// Every variant, from least to most capable.
    pub const ALL: [Int8Isa; 3] = [Int8Isa::Scalar, Int8Isa::Avx2, Int8Isa::Avx512Vnni];

    /// The lower-case name: `scalar`, `avx2`, `avx512vnni`.
    pub fn name(self) -> &'static str {
        match self {
            Int8Isa::Scalar => "scalar",
            Int8Isa::Avx2 => "avx2",
            Int8Isa::Avx512Vnni => "avx512vnni",
        }
    }

    /// Whether this CPU can run the kernels for `self` (std caches CPUID, so this is cheap).
    pub fn is_available(self) -> bool {
        match self {
            Int8Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx512Vnni => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Int8Isa::Avx2 | Int8Isa::Avx512Vnni => false,
        }
    }

    /// The most capable instruction set this CPU supports, ignoring `SLUICE_KERNEL_ISA`.
    pub fn detect() -> Int8Isa {
        Int8Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| isa.is_available())
            .unwrap_or(Int8Isa::Scalar)
    }

    /// The instruction set the process uses: [`Int8Isa::detect`], unless `SLUICE_KERNEL_ISA`
    /// names a supported one. Read once and cached for the life of the process.
    pub fn active() -> Int8Isa {
        Int8Isa::selection().active
    }

    /// The cached outcome of reading `SLUICE_KERNEL_ISA` against [`Int8Isa::detect`], for
    /// logging at startup.
    pub fn selection() -> &'static Int8IsaSelection {
        static SELECTION: OnceLock<Int8IsaSelection> = OnceLock::new();
        SELECTION.get_or_init(|| Int8IsaSelection::from_env(Int8Isa::detect()))
    }
}

impl fmt::Display for Int8Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl KernelIsa for Int8Isa {
    const NAMES: &'static str = "scalar, avx2, avx512, avx512vnni";
    const FOR_KERNELS: &'static str = " for int8 kernels";
    const USING: &'static str = "int8 kernels use";

    /// Parses [`Int8Isa::name`] or `avx512` (the dense kernels' spelling, meaning
    /// [`Int8Isa::Avx512Vnni`] here), ignoring case and surrounding whitespace.
    fn from_name(name: &str) -> Option<Int8Isa> {
        let name = name.trim();
        if name.eq_ignore_ascii_case("avx512") {
            return Some(Int8Isa::Avx512Vnni);
        }
        Int8Isa::ALL
            .into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(name))
    }
}

/// Which int8 instruction set the process runs, what the CPU offers, and what went wrong with
/// the override, if anything.
pub type Int8IsaSelection = Selection<Int8Isa>;
/// Why the `SLUICE_KERNEL_ISA` override was not honoured for the int8 kernels.
pub type Int8IsaOverrideProblem = OverrideProblem<Int8Isa>;
