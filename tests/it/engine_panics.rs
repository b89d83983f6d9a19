//! A panic in hostd's scheduler (issue 37, item 3), with the real engine and model over an
//! expert backend that panics on command: the request being generated when it panics fails
//! (`Event::Failed`, the HTTP layer's 500), the engine goes on and serves the next request to
//! the end, and one panic more than the budget within its window stops the engine for good:
//! `on_fatal` gets an `EngineFatal` (on which `hostd serve` drains and exits 70 for a
//! supervisor) and later submissions are refused — never an engine that looks alive but
//! answers nothing.

use hostd::engine::metrics::Metrics;
use hostd::engine::{self, EngineConfig, EngineFatal, Event, GenRequest};
use hostd::experts::bf16::Bf16Experts;
use hostd::experts::{ExpertBackend, ExpertError, MoeCall};
use hostd::model::Model;
use hostd::model::linear::DenseFormat;
use hostd::model::weights::MappedCheckpoint;
use hostd::profile::Profiler;
use hostd::sampling::SamplingParams;
use hostd::tokenizer::Tokenizer;
use shared::kernels::Isa;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tests::model_dir;

/// The model's own BF16 experts, except that the next `armed` calls panic.
struct Panicky {
    inner: Bf16Experts,
    armed: Arc<AtomicUsize>,
}

impl ExpertBackend for Panicky {
    fn name(&self) -> &'static str {
        "panicky"
    }

    fn moe_layer_profiled(
        &self,
        call: &MoeCall<'_>,
        out: &mut [f32],
        profiler: Option<&Profiler>,
    ) -> Result<(), ExpertError> {
        if self
            .armed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            panic!("injected: the expert backend panicked");
        }
        self.inner.moe_layer_profiled(call, out, profiler)
    }

    fn results_identity(&self) -> Option<String> {
        self.inner.results_identity()
    }
}

/// Submits a greedy request of a few tokens and waits for how it ends: `Ok(tokens)` when it
/// finished, `Err(message)` when it failed.
fn generate(handle: &engine::EngineHandle, id: usize) -> Result<usize, String> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    handle
        .submit(GenRequest {
            request_id: format!("panic-test-{id}"),
            span: tracing::Span::none(),
            prompt: vec![1, 2, 3, 4, 5],
            cache_final_state: false,
            sampling: SamplingParams::default(),
            max_tokens: 4,
            stop: Vec::new(),
            stop_ids: Vec::new(),
            split_reasoning: false,
            reasoning: false,
            skip_special_tokens: false,
            constraint: None,
            received: Instant::now(),
            events: tx,
        })
        .map_err(|e| format!("refused: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "request {id} never ended");
        match rx.blocking_recv() {
            Some(Event::Done { usage, .. }) => return Ok(usage.completion_tokens),
            Some(Event::Failed(f)) => return Err(f.message),
            Some(Event::Delta(_)) => {}
            None => return Err("the engine dropped the request without an answer".into()),
        }
    }
}

#[test]
fn a_scheduler_panic_fails_its_request_and_one_too_many_stops_the_engine() {
    let dir = model_dir("tiny");
    let mapped = MappedCheckpoint::open(&dir).expect("checkpoint");
    let isa = Isa::selection().active;
    let armed = Arc::new(AtomicUsize::new(0));
    let experts = Panicky {
        inner: Bf16Experts::new(&mapped, isa).expect("experts"),
        armed: Arc::clone(&armed),
    };
    let model = Model::load(&mapped, Arc::new(experts), isa, DenseFormat::Bf16).expect("model");
    let tokenizer = Arc::new(Tokenizer::from_model_dir(&dir).expect("tokenizer"));
    let config = EngineConfig {
        max_queue: 8,
        max_queued_tokens: 1 << 16,
        max_batch: 1,
        state_cache_bytes: 0,
        state_dir: None,
        checkpoint_every: 0,
        prefill_chunk: 64,
        prefill_budget: 64,
        max_context: 256,
        fault_panic_in_step: false,
    };
    let (fatal_tx, fatal_rx) = std::sync::mpsc::channel::<EngineFatal>();
    let (handle, thread) = engine::start(
        model,
        tokenizer,
        config,
        Arc::new(Metrics::new()),
        None,
        move |f| {
            let _ = fatal_tx.send(f);
        },
    )
    .expect("engine");

    let healthy = generate(&handle, 0).expect("a request before any panic");
    assert_eq!(healthy, 4);
    // Within the budget (3 panics a minute): each panicking request fails, the next one is
    // served in full.
    for i in 1..=3 {
        armed.store(1, Ordering::Release);
        let failed = generate(&handle, 10 * i).expect_err("the request that panicked");
        assert!(!failed.is_empty());
        assert_eq!(
            generate(&handle, 10 * i + 1),
            Ok(4),
            "the engine did not serve the request after panic {i}"
        );
        assert!(
            fatal_rx.try_recv().is_err(),
            "the engine stopped after {i} panics"
        );
    }
    // The fourth within the window: the engine stops and says so.
    armed.store(1, Ordering::Release);
    assert!(generate(&handle, 40).is_err());
    let fatal = fatal_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("EngineFatal after one panic too many");
    assert!(fatal.to_string().contains("status 70"), "{fatal}");
    thread.join().expect("the scheduler thread ends");
    let after = generate(&handle, 50);
    assert!(
        after.as_ref().is_err_and(|e| e.starts_with("refused")),
        "a stopped engine took a request: {after:?}"
    );
}
