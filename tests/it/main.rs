//! sluice's end-to-end test binary: one executable, one module per area.

mod bad_input;
mod bench;
mod cache_replay;
mod container;
mod expert_io;
mod expertd;
mod expertd_limits;
mod expertd_faults;
mod expertd_ring;
mod expertd_rss;
mod expertd_startup;
mod first_hour;
mod inspect;
mod int8_quality;
mod locator;
mod parity;
mod serve;
mod serve_anthropic;
mod serve_anthropic_tools;
mod serve_fairness;
mod serve_fields;
mod serve_limits;
mod serve_responses;
mod serve_structured;
mod synth;
mod tokenizer;
