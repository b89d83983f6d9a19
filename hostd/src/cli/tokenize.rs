//! `hostd tokenize`: read UTF-8 text on stdin and print its token ids (space-separated, or a JSON array).

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::Context;

use crate::tokenizer::Tokenizer;

/// Flags of `hostd tokenize`: where the tokenizer comes from, and the output format.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).multiple(false).args(["model", "tokenizer"])))]
pub struct TokenizeArgs {
    /// Model directory (its `tokenizer.json` is used), or a GGUF file (the tokenizer its
    /// metadata stands for).
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,
    /// A `tokenizer.json` file, or a GGUF file (its tokenizer metadata; a vocabulary-only GGUF
    /// will do).
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Print a JSON array of ids instead of space-separated ids.
    #[arg(long)]
    pub json: bool,
}

/// Run `hostd tokenize`: encode all of stdin (no BOS/EOS, special tokens matched as text) and print the ids.
pub fn run(args: &TokenizeArgs) -> anyhow::Result<()> {
    let tokenizer = match (&args.model, &args.tokenizer) {
        (Some(path), None) | (None, Some(path)) if shared::gguf::is_gguf_path(path) => {
            Tokenizer::from_gguf(path)?
        }
        (Some(dir), None) => Tokenizer::from_model_dir(dir)?,
        (None, Some(file)) => Tokenizer::from_file(file)?,
        _ => anyhow::bail!("exactly one of --model DIR or --tokenizer FILE is required"),
    };
    let mut raw = Vec::new();
    std::io::stdin()
        .read_to_end(&mut raw)
        .context("reading stdin")?;
    let text = String::from_utf8(raw).map_err(|e| {
        anyhow::anyhow!(
            "stdin is not valid UTF-8 (invalid byte sequence at byte offset {})",
            e.utf8_error().valid_up_to()
        )
    })?;
    let ids = tokenizer.encode(&text)?;
    let line = if args.json {
        serde_json::to_string(&ids).context("serialising ids")?
    } else {
        ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").context("writing stdout")?;
    Ok(())
}
