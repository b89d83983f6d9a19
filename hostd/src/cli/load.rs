//! The command line's side of loading a model: sizes the global rayon pool from `--threads`,
//! names the expertd client after the subcommand, and hands the flags to
//! [`crate::load::load_model`].

use crate::load::LoadOptions;
use crate::model::Model;

/// Sets up the thread pool, then validates and maps the checkpoint and builds the model.
pub fn load_model(opts: &LoadOptions) -> anyhow::Result<Model> {
    if let Some(n) = opts.threads.filter(|&n| n >= 1) {
        // Fails only if a pool already exists; the first setting stands.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global();
    }
    let client_name = format!("hostd {}", std::env::args().nth(1).unwrap_or_default());
    Ok(crate::load::load_model(opts, &client_name)?)
}
