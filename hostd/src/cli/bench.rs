//! `hostd bench`: the command line of the benchmark harness `sluice_tools::bench` (tools/):
//! each run a fresh `hostd profile` process of this executable (or of another build, `--exe`),
//! interleaved across configurations, with the rooflines measured beside them. Prints the
//! table and, with `--json`, writes the report.

pub use sluice_tools::bench::BenchArgs;

/// Runs `hostd bench`.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let exe =
        std::env::current_exe().map_err(|e| anyhow::anyhow!("locating this executable: {e}"))?;
    let report = sluice_tools::bench::run(args, exe)?;
    sluice_tools::bench::print_table(&report);
    Ok(())
}
