//! The configurations under test and the order their runs go in: `--config 'NAME: FLAGS'`
//! parsed into a [`Config`] (its environment words, its `hostd profile` flags, the executable
//! its runs use), and the interleaved [`schedule`].

use super::{BenchArgs, BenchError};
use std::path::PathBuf;

/// Order of the configs within each round of `hostd bench`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Every round in the order the configs were given.
    Forward,
    /// Odd rounds in the given order, even rounds reversed.
    Alternate,
}

/// One configuration under test.
#[derive(Debug, Clone)]
pub(super) struct Config {
    pub name: String,
    /// `NAME=VALUE` words before the flags: the environment of this config's runs.
    pub env: Vec<(String, String)>,
    pub flags: Vec<String>,
    /// `--container DIR` among the flags.
    pub container: Option<PathBuf>,
    /// The hostd executable whose `profile` subcommand runs this config (`--exe NAME=PATH`;
    /// default: the bench's own).
    pub exe: PathBuf,
}

/// Flags the bench itself sets on every child.
const MANAGED: &[&str] = &[
    "--model",
    "--out",
    "--prompt-tokens",
    "--prefill-chunk",
    "--decode-steps",
    "--bandwidth-bytes",
    "--no-warmup",
];

/// The interleaved schedule, `(config index, round label)`: `runs` rounds of every config in
/// `order`, then the drift check (config 0 once more).
pub(super) fn schedule(n_configs: usize, runs: usize, order: Order) -> Vec<(usize, String)> {
    let mut s: Vec<(usize, String)> = (1..=runs)
        .flat_map(|r| {
            let reversed = order == Order::Alternate && r % 2 == 0;
            (0..n_configs)
                .map(move |c| (if reversed { n_configs - 1 - c } else { c }, r.to_string()))
        })
        .collect();
    s.push((0, "drift".to_string()));
    s
}

fn usage(msg: String) -> BenchError {
    BenchError::Usage(msg)
}

/// Parses `NAME: [ENV=VALUE …] FLAGS`; its runs use `exe`.
pub(super) fn parse_config(spec: &str, exe: PathBuf) -> Result<Config, BenchError> {
    let (name, flags) = spec
        .split_once(':')
        .ok_or_else(|| usage(format!("--config {spec:?}: expected `NAME: FLAGS`")))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(usage(format!("--config {spec:?}: empty name")));
    }
    let mut words = flags.split_whitespace().peekable();
    let mut env = Vec::new();
    while let Some((k, v)) = words.peek().and_then(|w| env_word(w)) {
        env.push((k, v));
        words.next();
    }
    let flags: Vec<String> = words.map(str::to_string).collect();
    if let Some(f) = flags.iter().find(|f| {
        MANAGED
            .iter()
            .any(|m| f.as_str() == *m || f.starts_with(&format!("{m}=")))
    }) {
        return Err(usage(format!(
            "--config {name}: {f} is set by hostd bench itself"
        )));
    }
    let container =
        flags
            .iter()
            .enumerate()
            .find_map(|(i, f)| match f.strip_prefix("--container") {
                Some("") => flags.get(i + 1).map(PathBuf::from),
                Some(rest) => rest.strip_prefix('=').map(PathBuf::from),
                None => None,
            });
    Ok(Config {
        name: name.to_string(),
        env,
        flags,
        container,
        exe,
    })
}

/// `NAME=VALUE` with an upper-case environment name (`SLUICE_KERNEL_ISA=avx2`), else `None`.
fn env_word(w: &str) -> Option<(String, String)> {
    let (k, v) = w.split_once('=')?;
    let mut chars = k.chars();
    let first = chars.next()?;
    let ok = (first.is_ascii_uppercase() || first == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    ok.then(|| (k.to_string(), v.to_string()))
}

/// The configurations of `args`: each `--config`, or one `default` built from the
/// `--experts`/`--container`/`--expertd`/`--expertd-cache-bytes` flags. Runs use `own_exe`
/// unless `--exe NAME=PATH` names another executable for that config.
pub(super) fn configs(args: &BenchArgs, own_exe: PathBuf) -> Result<Vec<Config>, BenchError> {
    let mut exes: Vec<(&str, PathBuf)> = Vec::new();
    for e in &args.exes {
        let (name, path) = e
            .split_once('=')
            .ok_or_else(|| usage(format!("--exe {e:?}: expected `NAME=PATH`")))?;
        if exes.iter().any(|(n, _)| *n == name) {
            return Err(usage(format!("--exe names config {name:?} twice")));
        }
        exes.push((name, PathBuf::from(path)));
    }
    let has_default_flags = args.experts.is_some()
        || args.container.is_some()
        || args.expertd_uri.is_some()
        || args.expertd_cache_bytes.is_some();
    let specs: Vec<String> = if args.configs.is_empty() {
        let mut flags = Vec::new();
        let mut push = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                flags.extend([k.to_string(), v]);
            }
        };
        push("--experts", args.experts.clone());
        push(
            "--container",
            args.container.as_ref().map(|p| p.display().to_string()),
        );
        push("--expertd", args.expertd_uri.clone());
        push(
            "--expertd-cache-bytes",
            args.expertd_cache_bytes.map(|b| b.to_string()),
        );
        vec![format!("default: {}", flags.join(" "))]
    } else if has_default_flags {
        return Err(usage(
            "--experts/--container/--expertd/--expertd-cache-bytes describe the default configuration; with --config put them inside each config".into(),
        ));
    } else {
        args.configs.clone()
    };
    let mut configs: Vec<Config> = Vec::new();
    for spec in &specs {
        let c = parse_config(spec, own_exe.clone())?;
        if configs.iter().any(|o| o.name == c.name) {
            return Err(usage(format!("--config name {:?} given twice", c.name)));
        }
        configs.push(c);
    }
    for (name, path) in exes {
        let c = configs
            .iter_mut()
            .find(|c| c.name == name)
            .ok_or_else(|| usage(format!("--exe {name}=…: no config named {name:?}")))?;
        c.exe = path;
    }
    Ok(configs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_upper_case_assignments_are_the_config_environment() {
        let c = parse_config(
            "isa2: SLUICE_KERNEL_ISA=avx2 _X1=a=b --experts int8 --container /c FOO=bar",
            "h".into(),
        )
        .expect("parses");
        assert_eq!(c.name, "isa2");
        assert_eq!(
            c.env,
            vec![
                ("SLUICE_KERNEL_ISA".to_string(), "avx2".to_string()),
                ("_X1".to_string(), "a=b".to_string())
            ]
        );
        // Only leading words: a later `FOO=bar` is a flag.
        assert_eq!(
            c.flags,
            ["--experts", "int8", "--container", "/c", "FOO=bar"]
        );
        assert_eq!(c.container, Some(PathBuf::from("/c")));
    }

    #[test]
    fn flags_and_lower_case_words_are_not_environment() {
        for w in [
            "--expertd-daemon-arg=--ring-spin-us=5",
            "foo=bar",
            "Foo=bar",
            "=x",
            "1A=x",
            "SLUICE",
        ] {
            assert_eq!(env_word(w), None, "{w}");
        }
        assert_eq!(env_word("A="), Some(("A".to_string(), String::new())));
        let c = parse_config("x: --keep-awake off", "h".into()).expect("parses");
        assert!(c.env.is_empty());
        assert!(
            parse_config("x: --prompt-tokens 3", "h".into()).is_err(),
            "a managed flag"
        );
    }

    #[test]
    fn alternate_order_reverses_even_rounds_and_drift_repeats_the_first_config() {
        let names = |s: Vec<(usize, String)>| {
            s.into_iter()
                .map(|(c, r)| format!("{c}#{r}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(schedule(2, 3, Order::Alternate)),
            ["0#1", "1#1", "1#2", "0#2", "0#3", "1#3", "0#drift"]
        );
        assert_eq!(
            names(schedule(3, 2, Order::Alternate)),
            ["0#1", "1#1", "2#1", "2#2", "1#2", "0#2", "0#drift"]
        );
        assert_eq!(
            names(schedule(2, 2, Order::Forward)),
            ["0#1", "1#1", "0#2", "1#2", "0#drift"]
        );
    }

    #[test]
    fn exe_names_the_executable_of_one_config() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let parse = |words: &[&str]| {
            Cli::try_parse_from(["bench", "--model", "m"].iter().chain(words))
                .expect("flags")
                .bench
        };
        let args = parse(&[
            "--config",
            "old: --experts int8",
            "--config",
            "new: --experts int8",
            "--exe",
            "old=/base/hostd",
        ]);
        let c = configs(&args, "/self/hostd".into()).expect("configs");
        assert_eq!(
            (c[0].exe.to_str(), c[1].exe.to_str()),
            (Some("/base/hostd"), Some("/self/hostd"))
        );
        for bad in [
            &["--config", "a: x", "--exe", "b=/p"][..],
            &["--config", "a: x", "--exe", "a"],
            &["--config", "a: x", "--exe", "a=/p", "--exe", "a=/q"],
        ] {
            assert!(
                matches!(configs(&parse(bad), "/s".into()), Err(BenchError::Usage(_))),
                "{bad:?}"
            );
        }
        let default = configs(&parse(&["--experts", "int8"]), "/s".into()).expect("default");
        assert_eq!(
            (default[0].name.as_str(), default[0].flags.as_slice()),
            (
                "default",
                &["--experts".to_string(), "int8".to_string()][..]
            )
        );
    }
}
