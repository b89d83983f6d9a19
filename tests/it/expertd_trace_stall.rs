//! A route trace whose file stalls never stalls a call (issue 37 (e)): the daemon records its
//! trace into a FIFO that a reader holds open but does not read, so every write blocks once the
//! pipe is full. Calls keep completing (each within a bound far below the stall), and once the
//! reader drains the FIFO and the daemon stops, the trace holds every call.

use super::expertd::{raw_session, rt, valid_call, whole_container};
use expertd::server::ServeConfig;
use std::io::Read;
use std::time::{Duration, Instant};
use tests::{InProcessDaemon, work_with_container};

/// Calls made while the trace is stalled: their lines (about 2 MB) are far more than the
/// writer's 1 MiB buffer and the 64 KiB pipe hold, and their events fewer than the journal's cap.
const CALLS: usize = 12_000;

#[test]
fn a_stalled_route_trace_never_stalls_a_call() {
    let (work, container) = work_with_container("tiny");
    let fifo = work.path().join("trace.fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .expect("mkfifo");
    // The read end, open and unread: the daemon's opening for write does not block, its writes
    // block once the pipe is full.
    let reader = rustix::fs::open(
        &fifo,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK,
        rustix::fs::Mode::empty(),
    )
    .expect("open the FIFO's read end");
    let daemon = InProcessDaemon::unix(ServeConfig {
        route_trace: Some(fifo.clone()),
        ..whole_container(&container)
    });
    let slowest = rt().block_on(async {
        let (mut c, sid) = raw_session(daemon.socket()).await;
        let mut slowest = Duration::ZERO;
        for i in 0..CALLS {
            let t = Instant::now();
            tokio::time::timeout(Duration::from_secs(5), c.moe_layer(valid_call(sid)))
                .await
                .unwrap_or_else(|_| panic!("call {i} waited 5 s for the stalled trace"))
                .expect("call");
            slowest = slowest.max(t.elapsed());
        }
        slowest
    });
    eprintln!("{CALLS} calls with the trace stalled; the slowest took {slowest:?}");

    // Drain the FIFO (blocking reads now) while the daemon stops and finishes the trace.
    rustix::fs::fcntl_setfl(&reader, rustix::fs::OFlags::empty()).expect("blocking");
    let drain = std::thread::spawn(move || {
        let mut text = String::new();
        std::fs::File::from(reader)
            .read_to_string(&mut text)
            .expect("read the trace");
        text
    });
    daemon
        .stop()
        .expect("the daemon stops and finishes its trace");
    let text = drain.join().expect("drain");
    let acquires = text.lines().filter(|l| l.contains("\"acquire\"")).count();
    assert_eq!(
        acquires,
        CALLS,
        "the trace holds {acquires} calls of {CALLS}; its first lines:\n{}",
        text.lines().take(3).collect::<Vec<_>>().join("\n")
    );
}
