//! sluice host library: tokenizer, chat template, the model's forward pass and the expert
//! boundary, and the command-line tools built on them.

pub mod chat_template;
pub mod cli;
pub mod experts;
pub mod generate;
pub mod model;
pub mod synth;
pub mod tokenizer;
