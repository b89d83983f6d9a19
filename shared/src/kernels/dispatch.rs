//! Choosing the instruction set: what this CPU supports (`detect`), what the process uses
//! (`active`, honouring `SLUICE_KERNEL_ISA`), and why an override was not honoured — for the
//! dense kernels' [`Isa`], defined here, and the int8 kernels' `Int8Isa` (`int8/dispatch.rs`).
//!
//! The two enums differ in their members and in how each is detected; reading the variable,
//! resolving it against the detected set and wording the warning are written once, here, over
//! [`KernelIsa`] ([`Selection`], [`OverrideProblem`]).
//!
//! This module only decides; it never logs (`shared` has no tracing dependency). The daemon
//! calls [`Isa::selection`] once at startup, logs [`IsaSelection::active`] at INFO and
//! [`IsaSelection::warning`] at WARN when it is `Some`.

use std::fmt;
use std::sync::OnceLock;

/// The environment variable that overrides the detected instruction set:
/// `scalar`, `avx2` or `avx512` (case-insensitive; empty means unset).
pub const ISA_ENV_VAR: &str = "SLUICE_KERNEL_ISA";

/// An instruction set the dense kernels are written for, ordered from least to most capable.
///
/// Any value can be constructed, but the kernels panic when handed one this CPU does not
/// support (see [`Isa::is_available`]); take the value from [`Isa::active`] or [`Isa::detect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust, the reference; always available, and the only choice off x86_64.
    Scalar,
    /// x86_64 AVX2 + FMA, 8 f32 lanes.
    Avx2,
    /// x86_64 AVX-512 F + BW + VL (with AVX2 and FMA), 16 f32 lanes.
    Avx512,
}

impl Isa {
    /// Every variant, from least to most capable.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// The lower-case name, as `SLUICE_KERNEL_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the kernels for `self`. Cheap: std caches the CPUID results,
    /// so this is a few atomic loads.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && Isa::Avx2.is_available()
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
        }
    }

    /// The most capable instruction set this CPU supports, ignoring `SLUICE_KERNEL_ISA`.
    pub fn detect() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| isa.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// The instruction set the process uses: [`Isa::detect`], unless `SLUICE_KERNEL_ISA` names a
    /// supported one. Read once and cached for the life of the process.
    pub fn active() -> Isa {
        Isa::selection().active
    }

    /// The cached outcome of reading `SLUICE_KERNEL_ISA` against [`Isa::detect`], for logging
    /// at startup.
    pub fn selection() -> &'static IsaSelection {
        static SELECTION: OnceLock<IsaSelection> = OnceLock::new();
        SELECTION.get_or_init(|| IsaSelection::from_env(Isa::detect()))
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl KernelIsa for Isa {
    const NAMES: &'static str = "scalar, avx2, avx512";
    const FOR_KERNELS: &'static str = "";
    const USING: &'static str = "using";

    /// Parses a name as [`Isa::name`] writes it, ignoring case and surrounding whitespace.
    fn from_name(name: &str) -> Option<Isa> {
        let name = name.trim();
        Isa::ALL
            .into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(name))
    }
}

/// An instruction-set enum that [`ISA_ENV_VAR`] pins, ordered from least to most capable:
/// [`Isa`] or [`Int8Isa`](super::int8::Int8Isa). What [`Selection`] needs of it.
pub trait KernelIsa: Copy + Ord + fmt::Display + fmt::Debug + 'static {
    /// The values of the variable that name a member, as the warning lists them.
    const NAMES: &'static str;
    /// Which kernels the warnings speak of: empty for the dense kernels.
    const FOR_KERNELS: &'static str;
    /// How the unrecognised-value warning names the fallback it uses (`using avx2`, `int8
    /// kernels use avx2`).
    const USING: &'static str;

    /// Parses a value of the variable, ignoring case and surrounding whitespace.
    fn from_name(name: &str) -> Option<Self>;
}

/// Which instruction set the process runs, what the CPU offers, and what went wrong with the
/// override, if anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection<I> {
    /// The instruction set the kernels use.
    pub active: I,
    /// The most capable instruction set the CPU supports.
    pub detected: I,
    /// Why `SLUICE_KERNEL_ISA` was not honoured, or `None` when it was honoured or unset.
    pub override_problem: Option<OverrideProblem<I>>,
}

/// Why the `SLUICE_KERNEL_ISA` override was not honoured. In both cases the detected
/// instruction set is used instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverrideProblem<I> {
    /// The variable names an instruction set this CPU does not support.
    Unsupported(I),
    /// The variable names none of the instruction sets ([`KernelIsa::NAMES`]).
    Unrecognized(String),
}

/// The dense kernels' selection.
pub type IsaSelection = Selection<Isa>;
/// Why the override was not honoured for the dense kernels.
pub type IsaOverrideProblem = OverrideProblem<Isa>;

impl<I: KernelIsa> Selection<I> {
    /// Resolves an override value (the variable's content, `None` when unset) against the
    /// detected instruction set. Pure, so tests need not touch the environment.
    pub fn resolve(value: Option<&str>, detected: I) -> Selection<I> {
        let value = value.map(str::trim).filter(|v| !v.is_empty());
        let (active, override_problem) = match value {
            None => (detected, None),
            Some(v) => match I::from_name(v) {
                Some(isa) if isa <= detected => (isa, None),
                Some(isa) => (detected, Some(OverrideProblem::Unsupported(isa))),
                None => (detected, Some(OverrideProblem::Unrecognized(v.to_owned()))),
            },
        };
        Selection {
            active,
            detected,
            override_problem,
        }
    }

    /// [`Selection::resolve`] on the process's [`ISA_ENV_VAR`], for the enums' cached
    /// `selection()`.
    pub(crate) fn from_env(detected: I) -> Selection<I> {
        Selection::resolve(std::env::var(ISA_ENV_VAR).ok().as_deref(), detected)
    }

    /// A sentence for the caller to log at WARN when the override was not honoured.
    pub fn warning(&self) -> Option<String> {
        let (detected, active, kernels) = (self.detected, self.active, I::FOR_KERNELS);
        Some(match self.override_problem.as_ref()? {
            OverrideProblem::Unsupported(isa) => format!(
                "{ISA_ENV_VAR}={isa} requested, but this CPU supports at most {detected}{kernels}; using {active}"
            ),
            OverrideProblem::Unrecognized(v) => {
                format!(
                    "{ISA_ENV_VAR}={v:?} is not one of {}; {} {active}",
                    I::NAMES,
                    I::USING
                )
            }
        })
    }
}
