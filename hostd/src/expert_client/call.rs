//! The calls of an [`ExpertdClient`]: one MoE layer through the session's call ring (shared
//! memory and a futex, no RPC) or as a `MoeLayer` RPC (activations in the segment or inline),
//! under the call's deadline and the reconnect-once-on-unknown-session policy, plus the ring's
//! echo for benchmarks and the prefetch recall count.

use super::session::Session;
use super::{ExpertClientError, ExpertdClient, RING_SLICE, shm};
use crate::experts::MoeCall;
use crate::profile::Profiler;
use proto::convert::{f32s_to_le_bytes, le_bytes_into_f32s};
use proto::v1::{self as pb, moe_layer_request, moe_layer_response};
use shared::call_cost::CallCost;
use shared::ids::LayerId;
use shared::ring::{self, RingView, Submission};
use shm::ClientSegment;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// One MoE call as it passes through the client: its session, the call, the client step it
/// belongs to and when it is abandoned.
#[derive(Clone, Copy)]
struct CallCtx<'c, 'm> {
    s: &'c Session,
    call: &'c MoeCall<'m>,
    step: u64,
    deadline: Instant,
}

impl ExpertdClient {
    fn next_step(&self, layer: LayerId) -> u64 {
        let prev = self.last_layer.swap(layer.index(), Ordering::Relaxed);
        if prev == usize::MAX || layer.index() <= prev {
            self.step.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.step.load(Ordering::Relaxed)
        }
    }

    /// One `MoeLayer` call on session `cx.s`, abandoned at `cx.deadline`. When it fails in a
    /// way that leaves the daemon possibly still working on it, its slot is quarantined.
    fn call_on(
        &self,
        cx: CallCtx<'_, '_>,
        out: &mut [f32],
        during: &mut dyn FnMut(),
    ) -> Result<CallCost, ExpertClientError> {
        // PERF-CRITICAL: one round trip per MoE layer per step.
        let CallCtx { s, call, .. } = cx;
        let segment = s
            .segment
            .as_deref()
            .filter(|seg| s.info.shared_memory && seg.fits(call.n_rows));
        let mut slot = segment.and_then(ClientSegment::try_slot);
        let result = self.call_on_slot(cx, out, segment, slot.as_ref(), during);
        if let (Err(e), Some(slot)) = (&result, slot.as_mut())
            && !e.answered_by_daemon()
        {
            slot.quarantine();
        }
        result
    }

    fn call_on_slot(
        &self,
        cx: CallCtx<'_, '_>,
        out: &mut [f32],
        segment: Option<&ClientSegment>,
        slot: Option<&shm::Slot<'_>>,
        during: &mut dyn FnMut(),
    ) -> Result<CallCost, ExpertClientError> {
        let CallCtx {
            s,
            call,
            step,
            deadline,
        } = cx;
        let n_values = call.n_rows * self.opts.hidden;
        if let (Some(seg), Some(slot)) = (segment, slot)
            && let Some(ring) = seg
                .ring()
                .filter(|r| s.info.ring_entries > 0 && call.ids.len() <= r.layout().cells as usize)
        {
            let sub = Submission {
                op: ring::OP_MOE,
                seq: 0,
                layer: call.layer,
                n_rows: call.n_rows as u32,
                top_k: call.top_k as u32,
                step,
                input_offset: 0,
                output_offset: 0,
            };
            // A pending prefetch hint rides with the call when its cells fit; otherwise it goes
            // in the hint entry, after the call (see `prefetch`).
            let hint = self
                .pending_hint
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            let (riding, apart) = match hint {
                Some(h) if call.ids.len() + h.1.len() <= ring.layout().cells as usize => {
                    (Some(h), None)
                }
                other => (None, other),
            };
            let riding_ref = riding.as_ref().map(|(l, e)| (*l, e.as_slice()));
            let mut during_and_hint = || {
                if let Some((layer, experts)) = &apart {
                    self.send_hint_entry(s, *layer, experts);
                }
                during();
            };
            return self.ring_call(
                s,
                seg,
                slot,
                &ring,
                sub,
                call.x,
                call.ids,
                call.weights,
                riding_ref,
                out,
                deadline,
                &mut during_and_hint,
            );
        }
        let (input, output_shm) = match (segment, slot) {
            (Some(seg), Some(slot)) => {
                let id = s.link.segment_id;
                let input = seg.write_input(slot, id, call.x);
                (
                    moe_layer_request::Input::InputShm(input.into()),
                    Some(pb::ShmSlice::from(seg.output_slice(slot, id, n_values))),
                )
            }
            _ => (
                moe_layer_request::Input::InputInlineF32Le(f32s_to_le_bytes(call.x)),
                None,
            ),
        };
        let req = pb::MoeLayerRequest {
            session_id: s.info.session_id,
            request_id: self.next_request.fetch_add(1, Ordering::Relaxed),
            step,
            layer_idx: call.layer.get(),
            n_tokens: call.n_rows as u32,
            top_k: call.top_k as u32,
            expert_ids: call.ids.to_vec(),
            weights: call.weights.to_vec(),
            input: Some(input),
            output_shm,
        };
        let mut client = s.link.client.clone();
        let ep = self.endpoint.clone();
        let timeout = deadline.saturating_duration_since(Instant::now());
        let late = self.late(deadline);
        let resp = self
            .block_on(async move {
                match tokio::time::timeout(timeout, client.moe_layer(req)).await {
                    Ok(r) => r.map_err(|st| ExpertClientError::from_status(&ep, &st)),
                    Err(_) => Err(late),
                }
            })
            .ok_or_else(|| self.lost("the client runtime stopped"))??
            .into_inner();
        let protocol = |reason: &str| ExpertClientError::Protocol {
            endpoint: self.endpoint.clone(),
            reason: reason.to_string(),
        };
        let cost = CallCost::from(&resp);
        match (resp.output, segment, slot) {
            (Some(moe_layer_response::Output::OutputInlineF32Le(bytes)), _, _) => {
                le_bytes_into_f32s("output_inline_f32_le", &bytes, out)
                    .map_err(|e| protocol(&e.to_string()))?;
            }
            (Some(moe_layer_response::Output::OutputShm(_)), Some(seg), Some(slot)) => {
                seg.read_output(slot, out);
            }
            (Some(moe_layer_response::Output::OutputShm(_)), _, _) => {
                return Err(protocol("shared-memory output for an inline call"));
            }
            (None, _, _) => return Err(protocol("the response carries no output")),
        }
        tracing::trace!(
            queue_ns = cost.queue_ns,
            io_wait_ns = cost.io_wait_ns,
            compute_ns = cost.compute_ns,
            hits = cost.hits,
            misses = cost.misses,
            bytes_read = cost.bytes_read,
            "expertd call"
        );
        Ok(cost)
    }

    /// One call through the session's ring: activations into the slot, the call into the
    /// slot's entry, a doorbell, `during` (the caller's own work, overlapping the daemon's),
    /// then a short spin and a futex sleep until the daemon's worker answers. No gRPC, no
    /// runtime, no other thread. `sub` carries the op and the routing scalars; the sequence
    /// number and slot offsets are filled in here.
    #[allow(clippy::too_many_arguments)]
    fn ring_call(
        &self,
        s: &Session,
        seg: &ClientSegment,
        slot: &shm::Slot<'_>,
        ring: &RingView,
        mut sub: Submission,
        x: &[f32],
        ids: &[u32],
        weights: &[f32],
        hint: Option<(LayerId, &[u32])>,
        out: &mut [f32],
        deadline: Instant,
        during: &mut dyn FnMut(),
    ) -> Result<CallCost, ExpertClientError> {
        // PERF-CRITICAL: one round trip per MoE layer per step.
        let id = s.link.segment_id;
        let entry = ring.entry(slot.index() as u32);
        sub.seq = self.next_request.fetch_add(1, Ordering::Relaxed) as u32;
        sub.input_offset = seg.write_input(slot, id, x).offset_bytes;
        sub.output_offset = seg.output_slice(slot, id, out.len()).offset_bytes;
        let (hint_layer, hint_experts) = hint.unwrap_or((LayerId::new(0), &[]));
        entry.submit_with_hint(&sub, ids, weights, hint_layer, hint_experts);
        ring.ring_doorbell();
        during();
        let alive = || ring.daemon_gone().load(Ordering::SeqCst) == 0 && !s.link.watch.is_closed();
        if !entry.wait_finished(self.opts.ring_spin, RING_SLICE, || {
            alive() && Instant::now() < deadline
        }) {
            // The daemon went away or ran past the deadline mid-call. This session (and its
            // segment, which the worker might still write into) is abandoned, the slot
            // quarantined by the caller; the next call reconnects.
            if !alive() {
                return Err(self.lost("expertd stopped serving the call ring (the daemon exited or closed the session) during the call"));
            }
            return Err(self.late(deadline));
        }
        let (done_seq, cost, failure) = entry.result();
        entry.state().store(ring::STATE_FREE, Ordering::Release);
        if done_seq != sub.seq {
            return Err(ExpertClientError::Protocol {
                endpoint: self.endpoint.clone(),
                reason: format!(
                    "ring entry {} answered call {done_seq}, expected {}",
                    slot.index(),
                    sub.seq
                ),
            });
        }
        if let Some((code, message)) = failure {
            // The worker wrote this failure: it is the daemon's answer, not a transport fault.
            let mut status = tonic::Status::new(tonic::Code::from(code as i32), message);
            proto::convert::mark_daemon_status(&mut status, None);
            return Err(ExpertClientError::from_status(&self.endpoint, &status));
        }
        seg.read_output(slot, out);
        Ok(cost)
    }

    /// Sends `x` (`rows × hidden`) through the call ring and back unchanged (the daemon copies
    /// it in and out, computing nothing): the transport's round trip, for benchmarks. Fails
    /// when this session has no ring.
    pub fn echo(&self, x: &[f32], out: &mut [f32]) -> Result<(), ExpertClientError> {
        let s = self.session()?;
        let rows = x.len() / self.opts.hidden.max(1);
        let protocol = |reason: &str| ExpertClientError::Protocol {
            endpoint: self.endpoint.clone(),
            reason: reason.to_string(),
        };
        if x.len() != out.len() || rows * self.opts.hidden != x.len() || rows == 0 {
            return Err(protocol(
                "echo needs equal input and output lengths, a positive multiple of hidden",
            ));
        }
        let seg = s
            .segment
            .as_deref()
            .filter(|seg| s.info.ring_entries > 0 && seg.fits(rows))
            .ok_or_else(|| protocol("this session has no call ring"))?;
        let ring = seg
            .ring()
            .ok_or_else(|| protocol("this session has no call ring"))?;
        let slot = seg
            .try_slot()
            .ok_or_else(|| protocol("no free shared-memory slot"))?;
        let sub = Submission {
            op: ring::OP_ECHO,
            seq: 0,
            layer: LayerId::new(0),
            n_rows: rows as u32,
            top_k: 1,
            step: 0,
            input_offset: 0,
            output_offset: 0,
        };
        let deadline = Instant::now() + self.opts.call_timeout;
        let mut slot = slot;
        let r = self
            .ring_call(
                &s,
                seg,
                &slot,
                &ring,
                sub,
                x,
                &[],
                &[],
                None,
                out,
                deadline,
                &mut || {},
            )
            .map(|_| ());
        if let Err(e) = &r
            && !e.answered_by_daemon()
        {
            slot.quarantine();
            self.forget(&s);
        }
        r
    }

    /// Prefetch recall for `call`'s layer: how many of its distinct experts the last prediction
    /// for the layer named (profile counters `prefetch.*`).
    pub(super) fn count_recall(&self, call: &MoeCall<'_>, profiler: &Profiler) {
        let predicted = std::mem::take(
            &mut self
                .predicted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)[call.layer.index()],
        );
        if predicted.is_empty() {
            return;
        }
        let mut actual = call.ids.to_vec();
        actual.sort_unstable();
        actual.dedup();
        let found = actual
            .iter()
            .filter(|e| predicted.binary_search(e).is_ok())
            .count();
        profiler.count("prefetch.actual_experts", actual.len() as u64);
        profiler.count("prefetch.predicted_experts", predicted.len() as u64);
        profiler.count("prefetch.predicted_and_used", found as u64);
    }

    /// One layer call with the reconnect policy of the module doc. `during` goes to the ring
    /// call (the caller makes it run-once: a retry may pass it again).
    pub(super) fn call(
        &self,
        call: &MoeCall<'_>,
        out: &mut [f32],
        during: &mut dyn FnMut(),
    ) -> Result<CallCost, ExpertClientError> {
        let step = self.next_step(call.layer);
        let deadline = Instant::now() + self.opts.call_timeout;
        let mut retried = false;
        loop {
            let s = match self.session_by(Some(deadline)) {
                Ok(s) => s,
                Err(e) => {
                    self.note_failure(&e);
                    return Err(e);
                }
            };
            match self.call_on(
                CallCtx {
                    s: &s,
                    call,
                    step,
                    deadline,
                },
                out,
                during,
            ) {
                Ok(cost) => {
                    self.health.ok();
                    return Ok(cost);
                }
                Err(e) => {
                    // A call the daemon did not answer leaves its session unusable: the worker
                    // may still write the quarantined slot, and its ring entry is taken.
                    if e.needs_reconnect() || !e.answered_by_daemon() {
                        self.forget(&s);
                    }
                    self.note_failure(&e);
                    let never_ran = matches!(
                        &e,
                        ExpertClientError::Status {
                            code: tonic::Code::NotFound,
                            ..
                        }
                    );
                    if never_ran && !retried {
                        retried = true;
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }
}
