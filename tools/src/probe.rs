//! The measurements benchmarks take of the machine beside their runs: storage read bandwidth
//! with `O_DIRECT` and the page-cache drop before a cold run ([`storage`]; the DRAM probe's
//! streaming loop is a SIMD kernel and stays in `shared::kernels::bandwidth`), and a process's
//! physical reads and the busy time of a block device ([`process`]).

pub mod process;
pub mod storage;
