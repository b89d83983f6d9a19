//! sluice's end-to-end test binary: one executable, one module per area.

mod bad_input;
mod inspect;
mod locator;
mod parity;
mod synth;
mod tokenizer;
