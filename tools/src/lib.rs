//! sluice-tools: developer tooling that is not part of either daemon, kept out of the product
//! crates: [`synth`], the synthetic-checkpoint writer behind `hostd synth`; [`bench`], the
//! benchmark harness behind `hostd bench`, with the probes it measures the machine by
//! ([`probe`]) and the facts about the machine it records ([`machine`]). hostd's command-line
//! layer is its only product-side user.

pub mod bench;
pub mod machine;
pub mod probe;
pub mod synth;
