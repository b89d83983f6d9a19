//! `tidy`: ARCHITECTURE.md's code-level invariants as checks over every tracked `.rs` file
//! (modelled on rust-analyzer's `xtask/src/tidy.rs`). Each rule is a pure function of a file's
//! workspace-relative path and its text that returns one message per violation; the unit tests
//! below feed each rule a bad sample to show that it fails when its invariant is broken. A
//! second check keeps the map honest: every repository path ARCHITECTURE.md names in backticks
//! exists.
//!
//! Rules look at code with `//` comments stripped (a rough cut: a `//` inside a string literal also
//! ends the line, which can only hide a violation, never invent one). Needles that would match
//! this file itself are spelled with `concat!`, so tidy checks its own source like any other.

use std::path::Path;
use std::process::Command;

/// Files allowed past [`MAX_LINES`]: today's offenders, each to be split, never to grow.
const LONG_FILE_ALLOWLIST: &[&str] = &[];

/// House style: aim for files under about 800 lines, counted as rustfmt writes them (100 columns,
/// rustfmt.toml; scripts/lint fails CI on any file that is not formatted).
const MAX_LINES: usize = 800;

const STD_ARCH: &str = concat!("std", "::arch");
const CORE_ARCH: &str = concat!("core", "::arch");
const SAFETY: &str = concat!("SAF", "ETY");

/// A violation message for `path`.
fn violation(path: &str, line: usize, what: &str) -> String {
    format!("{path}:{line}: {what}")
}

/// `(1-based line number, code part of the line)` for every line, `//` comments removed.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.split("//").next().unwrap_or("")))
}

/// Every line whose code contains one of `needles`, unless `allowed(path)`.
fn forbid(path: &str, text: &str, needles: &[&str], allowed: bool, what: &str) -> Vec<String> {
    if allowed {
        return Vec::new();
    }
    code_lines(text)
        .filter(|(_, code)| needles.iter().any(|n| code.contains(n)))
        .map(|(n, _)| violation(path, n, what))
        .collect()
}

/// Only `shared/src/kernels/` contains SIMD intrinsics.
fn check_arch(path: &str, text: &str) -> Vec<String> {
    let allowed = path.starts_with("shared/src/kernels/");
    forbid(
        path,
        text,
        &[STD_ARCH, CORE_ARCH],
        allowed,
        "SIMD intrinsics outside shared/src/kernels/",
    )
}

/// Only `expertd/src/io/uring.rs` touches io_uring (the `io-uring` crate).
fn check_io_uring(path: &str, text: &str) -> Vec<String> {
    let needles = [
        concat!("io_uring", "::"),
        concat!("use ", "io_uring"),
        concat!("crate ", "io_uring"),
    ];
    forbid(
        path,
        text,
        &needles,
        path == "expertd/src/io/uring.rs",
        "io_uring used outside expertd/src/io/uring.rs",
    )
}

/// `anyhow` only in the command-line layers of the binaries and in tests (ARCHITECTURE.md,
/// "Errors"); library code returns one `thiserror` enum per boundary.
fn check_anyhow(path: &str, text: &str) -> Vec<String> {
    let allowed = path.starts_with("hostd/src/cli/")
        || path.ends_with("/src/main.rs")
        || path == "expertd/src/cli.rs"
        || path == "expertd/src/stats_client.rs"
        || path.starts_with("tests/");
    let needles = [concat!("anyhow", "::"), concat!("use ", "anyhow")];
    forbid(
        path,
        text,
        &needles,
        allowed,
        "anyhow outside the CLI layers and tests",
    )
}

/// `shared` is IO-free except for the checkpoint reader, the container's reader and identity, the
/// GGUF file opener, and the /proc readers.
fn check_shared_fs(path: &str, text: &str) -> Vec<String> {
    let allowed = !path.starts_with("shared/src/")
        || matches!(
            path,
            "shared/src/checkpoint.rs"
                | "shared/src/container/reader.rs"
                | "shared/src/container/identity.rs"
                | "shared/src/gguf/file.rs"
                | "shared/src/procfs.rs"
                | "shared/src/skip.rs"
        );
    forbid(
        path,
        text,
        &[concat!("std", "::fs")],
        allowed,
        "filesystem access in shared/ outside checkpoint.rs, container/{reader,identity}.rs, gguf/file.rs, procfs.rs and skip.rs",
    )
}

/// The developer tooling in `tools/` (crate sluice-tools) stays out of the product: only hostd's
/// command-line layer (`hostd synth`, `hostd bench`, `hostd profile`'s probes), the tests and
/// the fuzz harness use it. sluice-tools itself
/// is library code (no `anyhow`) and may write files: writing model directories is its job.
fn check_tools_use(path: &str, text: &str) -> Vec<String> {
    let allowed = ["tools/", "hostd/src/cli/", "tests/", "fuzz/"]
        .iter()
        .any(|p| path.starts_with(p));
    forbid(
        path,
        text,
        &[concat!("sluice_", "tools")],
        allowed,
        "sluice-tools used outside hostd/src/cli/, tests and fuzz",
    )
}

/// System calls go through `rustix`; `libc` only for glibc's `malloc_trim`, an allocator function
/// that rustix does not wrap (ARCHITECTURE.md, "Dependency direction").
fn check_libc(path: &str, text: &str) -> Vec<String> {
    let (libc, trim) = (concat!("lib", "c::"), concat!("lib", "c::malloc_trim"));
    code_lines(text)
        .filter(|(_, code)| {
            code.replace(trim, "").contains(libc) || code.contains(concat!("use lib", "c"))
        })
        .map(|(n, _)| {
            violation(
                path,
                n,
                "libc used for more than malloc_trim: system calls go through rustix",
            )
        })
        .collect()
}

/// Every file opens with a `//!` saying what it owns.
fn check_module_doc(path: &str, text: &str) -> Vec<String> {
    if text.starts_with("//!") {
        Vec::new()
    } else {
        vec![violation(
            path,
            1,
            "file does not start with a `//!` module doc",
        )]
    }
}

/// Lines a statement may span above its `unsafe` block when rustfmt splits it (the note then
/// sits above the statement's first line).
const MAX_STATEMENT_LINES_ABOVE: usize = 3;

/// A line that continues onto the next one: it opens a call or an initialiser, or ends an
/// argument (rustfmt's split points), and is not a comment.
fn continues(line: &str) -> bool {
    let l = line.trim();
    !l.starts_with("//") && (l.ends_with('(') || l.ends_with(',') || l.ends_with('='))
}

/// Every `unsafe` block and `unsafe impl` has a safety note: on its own line, or in the
/// comment block (attributes may sit between) directly above it, or above the first line of
/// the statement it sits in when rustfmt split that statement (at most
/// [`MAX_STATEMENT_LINES_ABOVE`] lines up). clippy's `undocumented_unsafe_blocks` checks the
/// same on the syntax tree (scripts/lint).
fn check_safety_comments(path: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (n, code) in code_lines(text) {
        if !(has_unsafe_block(code) || code.contains(concat!("unsafe", " impl ")))
            || lines[n - 1].contains(SAFETY)
        {
            continue;
        }
        let mut first = n - 1;
        while first > 0 && n - 1 - first < MAX_STATEMENT_LINES_ABOVE && continues(lines[first - 1])
        {
            first -= 1;
        }
        let mut above = lines[..first]
            .iter()
            .rev()
            .map(|l| l.trim())
            .take_while(|l| l.starts_with("//") || l.starts_with("#["));
        if !above.any(|l| l.contains(SAFETY)) {
            out.push(violation(
                path,
                n,
                "`unsafe` without a safety comment directly above it",
            ));
        }
    }
    out
}

/// `unsafe` followed (after optional whitespace) by `{`.
fn has_unsafe_block(code: &str) -> bool {
    code.match_indices("unsafe").any(|(i, m)| {
        let word_start = code[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        word_start && code[i + m.len()..].trim_start().starts_with('{')
    })
}

/// Files over [`MAX_LINES`] lines, unless allowlisted.
fn check_file_length(path: &str, text: &str) -> Vec<String> {
    check_file_length_against(LONG_FILE_ALLOWLIST, path, text)
}

/// [`check_file_length`] with `allowlist` in place of [`LONG_FILE_ALLOWLIST`].
fn check_file_length_against(allowlist: &[&str], path: &str, text: &str) -> Vec<String> {
    let n = text.lines().count();
    if n <= MAX_LINES || allowlist.contains(&path) {
        return Vec::new();
    }
    vec![violation(
        path,
        n,
        &format!("{n} lines, over {MAX_LINES}: split the file along an axis"),
    )]
}

type Rule = fn(&str, &str) -> Vec<String>;
const RULES: &[Rule] = &[
    check_arch,
    check_io_uring,
    check_anyhow,
    check_shared_fs,
    check_tools_use,
    check_libc,
    check_module_doc,
    check_safety_comments,
    check_file_length,
];

/// Workspace-relative paths of the tracked `.rs` files (`git ls-files`), or of every `.rs`
/// file outside `target/` and hidden directories when the tree is not a git checkout.
fn rust_files(root: &Path) -> Vec<String> {
    let git = Command::new("git")
        .args(["ls-files", "-z", "--", "*.rs"])
        .current_dir(root)
        .output();
    if let Some(out) = git.ok().filter(|o| o.status.success()) {
        let listed = String::from_utf8(out.stdout).expect("git ls-files prints UTF-8 paths");
        return listed
            .split('\0')
            .filter(|p| !p.is_empty() && root.join(p).exists())
            .map(str::to_owned)
            .collect();
    }
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("dir entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() && name != "target" && !name.starts_with('.') {
                dirs.push(path);
            } else if name.ends_with(".rs") {
                files.push(
                    path.strip_prefix(root)
                        .expect("under root")
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    files.sort();
    files
}

#[test]
fn tidy() {
    let root = tests::workspace_root();
    let files = rust_files(&root);
    assert!(
        files.len() > 100,
        "found only {} .rs files under {}",
        files.len(),
        root.display()
    );
    let mut violations = Vec::new();
    for path in &files {
        let text =
            std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"));
        violations.extend(RULES.iter().flat_map(|rule| rule(path, &text)));
    }
    for path in LONG_FILE_ALLOWLIST {
        assert!(
            files.iter().any(|f| f == path),
            "allowlisted {path} no longer exists: drop it from LONG_FILE_ALLOWLIST"
        );
    }
    assert!(
        violations.is_empty(),
        "tidy found {} violation(s):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

/// The map whose named paths must exist. `docs/internals.md`, its detailed companion, names
/// modules by their short paths within a crate, so it is not checked.
const MAP: &str = "ARCHITECTURE.md";

/// `token` without a `:LINE` suffix (`a.rs:12` → `a.rs`).
fn strip_line_suffix(token: &str) -> &str {
    match token.rsplit_once(':') {
        Some((path, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => path,
        _ => token,
    }
}

/// The backticked tokens of a Markdown `text` that look like repository paths: they contain a
/// `/` or end in `.rs`, `.md`, `.sh` or `.toml`, and hold no whitespace, `::`, `*`, `<` or `{`
/// (those are code, command lines or patterns). Fenced code blocks are skipped; a `:LINE`
/// suffix and a trailing `/` are dropped.
fn doc_paths(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(strip_line_suffix)
        .filter(|t| {
            let pathy = t.contains('/')
                || [".rs", ".md", ".sh", ".toml"]
                    .iter()
                    .any(|ext| t.ends_with(ext));
            let code = t.chars().any(char::is_whitespace)
                || ["::", "*", "<", "{"].iter().any(|c| t.contains(c));
            pathy && !code
        })
        .map(|t| t.trim_end_matches('/').to_owned())
        .collect()
}

/// One message per path of `paths` that is absolute or names nothing under `root`.
fn missing_paths(root: &Path, paths: &[String]) -> Vec<String> {
    paths
        .iter()
        .filter_map(|p| {
            if Path::new(p).is_absolute() {
                Some(format!(
                    "`{p}` is absolute: name it relative to the workspace root"
                ))
            } else if !root.join(p).exists() {
                Some(format!("`{p}` does not exist"))
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn architecture_md_names_only_paths_that_exist() {
    let root = tests::workspace_root();
    let text =
        std::fs::read_to_string(root.join(MAP)).unwrap_or_else(|e| panic!("read {MAP}: {e}"));
    let paths = doc_paths(&text);
    assert!(
        paths.len() > 50,
        "found only {} paths in {MAP}: is the extraction broken?",
        paths.len()
    );
    let missing = missing_paths(&root, &paths);
    assert!(
        missing.is_empty(),
        "{MAP} names {} path(s) that are not in the repository (fix the path or drop it):\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn doc_paths_are_the_backticked_repository_paths() {
    let text = "`a/b.rs` and `c.md:12`, `d/`, `e.toml`, `f.sh`\n\
        `x::y/z` `a b/c` `*.rs` `<p>/q` `{a,b}/c` `plain` `config.json` `a.rs:x`\n\
        ```sh\n`in/fence.rs`\n```\n`after/fence`\n";
    assert_eq!(
        doc_paths(text),
        ["a/b.rs", "c.md", "d", "e.toml", "f.sh", "after/fence"]
    );
    let root = tests::workspace_root();
    let named = |paths: &[&str]| paths.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert!(missing_paths(&root, &named(&["Cargo.toml", "tests/it"])).is_empty());
    assert_eq!(
        missing_paths(&root, &named(&["tests/it/no_such_file.rs", "/etc"])).len(),
        2
    );
}

/// `rule` reports exactly `expected` violations for `text` at `path`.
fn check(rule: Rule, path: &str, text: &str, expected: usize) {
    let found = rule(path, text);
    assert_eq!(found.len(), expected, "{path}: {found:?}");
}

#[test]
fn arch_only_in_kernels() {
    let bad = format!(
        "//! x\nuse {STD_ARCH}::x86_64::*;\nfn f() {{ {CORE_ARCH}::x86_64::_mm_pause() }}\n"
    );
    check(check_arch, "hostd/src/model/ops.rs", &bad, 2);
    check(check_arch, "shared/src/kernels/avx2.rs", &bad, 0);
    check(
        check_arch,
        "hostd/src/model/ops.rs",
        &format!("//! x\n// {STD_ARCH} in a comment\n"),
        0,
    );
}

#[test]
fn io_uring_only_in_uring_rs() {
    let bad = concat!("//! x\nuse io_", "uring::IoUring;\n");
    check(check_io_uring, "expertd/src/io/pread.rs", bad, 1);
    check(check_io_uring, "expertd/src/io/uring.rs", bad, 0);
    check(
        check_io_uring,
        "expertd/src/io/mod.rs",
        "//! x\nlet name = \"io_uring\";\n",
        0,
    );
}

#[test]
fn anyhow_only_in_cli_and_tests() {
    let bad = concat!("//! x\npub fn f() -> any", "how::Result<()> { Ok(()) }\n");
    check(check_anyhow, "hostd/src/model/mod.rs", bad, 1);
    check(check_anyhow, "shared/src/config.rs", bad, 1);
    check(check_anyhow, "hostd/src/cli/run.rs", bad, 0);
    check(check_anyhow, "expertd/src/cli.rs", bad, 0);
    check(check_anyhow, "tests/it/serve.rs", bad, 0);
    check(check_anyhow, "tools/src/synth/write.rs", bad, 1);
}

#[test]
fn shared_fs_only_in_checkpoint_and_container_reader() {
    let bad = concat!("//! x\nlet b = std::", "fs::read(p)?;\n");
    check(check_shared_fs, "shared/src/config.rs", bad, 1);
    check(check_shared_fs, "shared/src/checkpoint.rs", bad, 0);
    check(check_shared_fs, "hostd/src/model/weights.rs", bad, 0);
    check(check_shared_fs, "tools/src/synth/write.rs", bad, 0);
}

#[test]
fn tools_only_from_the_cli_tests_and_fuzz() {
    let bad = concat!(
        "//! x
use sluice_",
        "tools::synth::Preset;
"
    );
    check(check_tools_use, "hostd/src/engine/mod.rs", bad, 1);
    check(check_tools_use, "expertd/src/cli.rs", bad, 1);
    check(check_tools_use, "shared/src/config.rs", bad, 1);
    check(check_tools_use, "hostd/src/cli/synth.rs", bad, 0);
    check(check_tools_use, "tests/it/synth.rs", bad, 0);
    check(
        check_tools_use,
        "fuzz/harness/src/targets/http_params.rs",
        bad,
        0,
    );
    check(check_tools_use, "tools/src/synth/tests.rs", bad, 0);
}

#[test]
fn libc_only_for_malloc_trim() {
    check(
        check_libc,
        "shared/src/ring.rs",
        concat!(
            "//! x\nunsafe { lib",
            "c::syscall(lib",
            "c::SYS_futex) };\n"
        ),
        1,
    );
    check(
        check_libc,
        "expertd/src/io/mod.rs",
        concat!("//! x\nuse lib", "c::EIO;\n"),
        1,
    );
    check(
        check_libc,
        "hostd/src/http/admission.rs",
        concat!("//! x\nunsafe { lib", "c::malloc_trim(0) };\n"),
        0,
    );
    check(
        check_libc,
        "hostd/src/model/linear.rs",
        "//! x\n// no libc calls here, rustix::mm::madvise instead\n",
        0,
    );
}

#[test]
fn every_file_starts_with_module_doc() {
    check(
        check_module_doc,
        "shared/src/lib.rs",
        "/// item doc\nfn f() {}\n",
        1,
    );
    check(check_module_doc, "shared/src/lib.rs", "\n//! late\n", 1);
    check(check_module_doc, "shared/src/lib.rs", "//! owns x\n", 0);
}

#[test]
fn unsafe_needs_safety_comment() {
    let block = concat!("unsafe", " { p.read() }");
    let imp = concat!("unsafe", " impl Send for T {}");
    check(
        check_safety_comments,
        "a.rs",
        &format!("//! x\nlet v = {block};\n"),
        1,
    );
    check(check_safety_comments, "a.rs", &format!("//! x\n{imp}\n"), 1);
    // A note separated from the block by code does not count.
    check(
        check_safety_comments,
        "a.rs",
        &format!("//! x\n// {SAFETY}: p is valid.\nlet a = 1;\nlet v = {block};\n"),
        1,
    );
    check(
        check_safety_comments,
        "a.rs",
        &format!("//! x\n// {SAFETY}: p is valid\n// for reads.\nlet v = {block};\n"),
        0,
    );
    check(
        check_safety_comments,
        "a.rs",
        &format!("//! x\n// {SAFETY}: T owns no thread-bound state.\n#[allow(x)]\n{imp}\n"),
        0,
    );
    check(
        check_safety_comments,
        "a.rs",
        &format!("//! x\nlet v = {block}; // {SAFETY}: p is valid.\n"),
        0,
    );
    // A statement rustfmt split: the note above its first line covers the block below.
    let split = format!("//! x\n// {SAFETY}: p is valid.\nlet v = f(\n    a,\n    {block},\n);\n");
    check(check_safety_comments, "a.rs", &split, 0);
    // A complete statement between the note and the block breaks it, split or not.
    let after =
        format!("//! x\n// {SAFETY}: p is valid.\nlet a = 1;\nlet v = f(\n    {block},\n);\n");
    check(check_safety_comments, "a.rs", &after, 1);
    // `unsafe fn` and identifiers that merely contain the word are not blocks.
    check(
        check_safety_comments,
        "a.rs",
        concat!("//! x\nunsafe", " fn f() {}\nlet not_unsafe = { 1 };\n"),
        0,
    );
}

#[test]
fn long_files_need_an_allowlist_entry() {
    let long = "//! x\n".to_owned() + &"fn f() {}\n".repeat(MAX_LINES);
    check(check_file_length, "hostd/src/model/mod.rs", &long, 1);
    assert!(
        check_file_length_against(&["a/long.rs"], "a/long.rs", &long).is_empty(),
        "an allowlisted file may be long"
    );
    assert_eq!(
        check_file_length_against(&["a/long.rs"], "b/long.rs", &long).len(),
        1
    );
    check(check_file_length, "hostd/src/model/mod.rs", "//! x\n", 0);
}
