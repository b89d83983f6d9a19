//! sluice host library: tokenizer, chat template, the model's forward pass and the expert
//! boundary, and the command-line tools built on them.

pub mod chat_template;
pub mod cli;
pub mod engine;
pub mod experts;
pub mod generate;
pub mod http;
pub mod model;
pub mod prefix_cache;
pub mod sampling;
pub mod synth;
pub mod tokenizer;
