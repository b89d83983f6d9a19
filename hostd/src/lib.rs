//! sluice host library: tokenizer, chat template, the model's forward pass and the expert
//! boundary (in-process backends and the expertd client), and the command-line tools built on
//! them.

pub mod chat_template;
pub mod cli;
pub mod constraint;
pub mod engine;
pub mod eval;
pub mod expert_client;
pub mod experts;
pub mod generate;
pub mod http;
pub mod load;
pub mod model;
pub mod plan;
pub mod prefix_cache;
pub mod prefix_store;
pub mod profile;
pub mod sampling;
pub mod tokenizer;
pub mod tool_calls;
