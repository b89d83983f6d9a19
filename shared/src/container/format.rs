//! The expert formats a container can hold ([`ExpertFormat`]): today's INT8 (format version 1)
//! and the k-quant presets of version 2, with the names each is known by (CLI value, header
//! `quant_scheme`, per-expert index code).

use crate::kernels::kquant::KQuantKind;
use std::fmt;

/// How every expert of a container is quantised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ExpertFormat {
    /// Symmetric per-row INT8, R16C4-packed, f32 scales (format v1; 8 bits per weight).
    #[default]
    Int8,
    /// gate/up and down in ggml `Q4_K` blocks (format v2; 4.5 bits per weight).
    Q4K,
    /// gate/up in `Q4_K`, down in `Q6_K` (format v2; 5.19 bits per weight on average).
    Q4KQ6K,
}

/// ggml's type id of `Q4_K` (its GGUF `ggml_type`), used in v2 index entries.
pub const GGML_TYPE_Q4_K: u16 = 12;
/// ggml's type id of `Q6_K`.
pub const GGML_TYPE_Q6_K: u16 = 14;

impl ExpertFormat {
    /// Every format, the default first.
    pub const ALL: [ExpertFormat; 3] =
        [ExpertFormat::Int8, ExpertFormat::Q4K, ExpertFormat::Q4KQ6K];

    /// The name on the command line (`expertd prepare --format`) and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            ExpertFormat::Int8 => "int8",
            ExpertFormat::Q4K => "q4k",
            ExpertFormat::Q4KQ6K => "q4k-q6k",
        }
    }

    /// The header's `quant_scheme` string.
    pub const fn scheme(self) -> &'static str {
        match self {
            ExpertFormat::Int8 => "w8-sym-per-row-r16c4",
            ExpertFormat::Q4K => "ggml-q4k",
            ExpertFormat::Q4KQ6K => "ggml-q4k-gate-up-q6k-down",
        }
    }

    /// The container format version that holds it.
    pub const fn version(self) -> u32 {
        match self {
            ExpertFormat::Int8 => 1,
            ExpertFormat::Q4K | ExpertFormat::Q4KQ6K => 2,
        }
    }

    /// The block format of gate/up and of down, `None` for INT8.
    pub const fn kquant(self) -> Option<(KQuantKind, KQuantKind)> {
        match self {
            ExpertFormat::Int8 => None,
            ExpertFormat::Q4K => Some((KQuantKind::Q4K, KQuantKind::Q4K)),
            ExpertFormat::Q4KQ6K => Some((KQuantKind::Q4K, KQuantKind::Q6K)),
        }
    }

    /// The per-expert code a v2 index entry stores: gate/up's ggml type in the low 16 bits,
    /// down's in the high 16 (0 for INT8, which v1 entries do not record).
    pub const fn index_code(self) -> u32 {
        const fn ggml(k: KQuantKind) -> u32 {
            match k {
                KQuantKind::Q4K => GGML_TYPE_Q4_K as u32,
                KQuantKind::Q6K => GGML_TYPE_Q6_K as u32,
            }
        }
        match self.kquant() {
            None => 0,
            Some((gu, dn)) => ggml(gu) | (ggml(dn) << 16),
        }
    }

    /// The format whose `quant_scheme` is `scheme` (the field's bytes up to the first NUL).
    pub fn from_scheme(scheme: &[u8]) -> Option<ExpertFormat> {
        ExpertFormat::ALL
            .into_iter()
            .find(|f| f.scheme().as_bytes() == scheme)
    }

    /// The format named `name` ([`ExpertFormat::name`]).
    pub fn from_name(name: &str) -> Option<ExpertFormat> {
        ExpertFormat::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The format a handshake's `expert_format` names: empty (a daemon from before format v2)
    /// is INT8; `None` for a name this build does not know.
    pub fn from_wire(name: &str) -> Option<ExpertFormat> {
        if name.is_empty() {
            Some(ExpertFormat::Int8)
        } else {
            ExpertFormat::from_name(name)
        }
    }

    /// Approximate bits per weight of the expert matrices (gate and up are twice down's size).
    pub fn bits_per_weight(self) -> f64 {
        match self.kquant() {
            None => 8.0,
            Some((gu, dn)) => {
                let bits = |k: KQuantKind| (k.block_bytes() * 8) as f64 / 256.0;
                (2.0 * bits(gu) + bits(dn)) / 3.0
            }
        }
    }
}

impl fmt::Display for ExpertFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
