//! Admission before work: what a generation request must pass before the server spends memory
//! or CPU on it. The body is read under a size cap and a time limit; message content and the
//! rendered prompt are capped in bytes; a bound from the prompt's byte length refuses prompts
//! that cannot fit the context without tokenising them; and tokenisation runs off the async
//! runtime in a small bounded pool, so a large prompt never stalls `/health` or other requests.
//!
//! Why: tokenising a 4 MB message on an HTTP thread cost ~530 MB of RSS and 6 s, and four at
//! once stalled `/health` for seconds (issue 14). The caps bound each request's cost, the pool
//! bounds how many are paid at once.

use super::error::ApiError;
use crate::tokenizer::Tokenizer;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Default request body limit (bytes): twice the prompt cap, room for JSON escaping.
pub const MAX_BODY_BYTES_DEFAULT: usize = 2 << 20;
/// Default cap on one message's content and on the rendered prompt (bytes): about the text
/// of a full 262,144-token context at ~4 bytes per token.
pub const MAX_PROMPT_BYTES_DEFAULT: usize = 1 << 20;
/// Default number of prompts tokenised at once.
pub const TOKENIZE_THREADS_DEFAULT: usize = 2;
/// Default wait for a tokeniser slot before answering 503.
pub const TOKENIZE_WAIT_DEFAULT: Duration = Duration::from_secs(10);
/// Default limit on receiving a request body.
pub const BODY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// Most bytes of a refused body read and discarded before the connection closes.
pub const DRAIN_MAX_BYTES: usize = 16 << 20;
/// Longest time spent discarding a refused body.
pub const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads and discards what is left of a refused body, within [`DRAIN_MAX_BYTES`] and
/// [`DRAIN_TIME`]; nothing is kept.
fn drain(mut body: Body) {
    tokio::spawn(async move {
        let discard = async {
            let mut seen = 0usize;
            while let Some(Ok(frame)) = body.frame().await {
                seen += frame.data_ref().map_or(0, Bytes::len);
                if seen > DRAIN_MAX_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(DRAIN_TIME, discard).await;
    });
}

/// NFC normalisation (which the tokenizer applies first) shrinks text by at most this factor
/// in UTF-8 bytes (three Hangul jamo of 3 bytes each compose into one 3-byte syllable).
const NFC_MAX_SHRINK: usize = 3;

/// Limits of the admission step (set by `hostd serve` flags).
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// Largest accepted request body (`--max-body-bytes`).
    pub max_body_bytes: usize,
    /// Largest message content and rendered prompt in bytes (`--max-prompt-bytes`).
    pub max_prompt_bytes: usize,
    /// Time to receive a whole body (`--body-timeout`).
    pub body_timeout: Duration,
    /// Prompts tokenised at once (`--tokenize-threads`).
    pub tokenize_threads: usize,
    /// Longest wait for a tokeniser slot (`--tokenize-wait`).
    pub tokenize_wait: Duration,
    /// Prompt bytes being tokenised at once, over all slots (`--tokenize-budget-bytes`): the
    /// tokeniser's transient memory is roughly proportional to it.
    pub tokenize_budget_bytes: usize,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_body_bytes: MAX_BODY_BYTES_DEFAULT,
            max_prompt_bytes: MAX_PROMPT_BYTES_DEFAULT,
            body_timeout: BODY_TIMEOUT_DEFAULT,
            tokenize_threads: TOKENIZE_THREADS_DEFAULT,
            tokenize_wait: TOKENIZE_WAIT_DEFAULT,
            tokenize_budget_bytes: MAX_PROMPT_BYTES_DEFAULT,
        }
    }
}

/// The admission state shared by the handlers: the limits and the tokeniser pool's slots.
pub struct Admission {
    config: AdmissionConfig,
    slots: Arc<Semaphore>,
    /// The byte budget in KiB permits.
    budget_kib: Arc<Semaphore>,
}

impl Admission {
    /// Admission with these limits.
    pub fn new(config: AdmissionConfig) -> Admission {
        let slots = Arc::new(Semaphore::new(config.tokenize_threads.max(1)));
        let budget_kib = Arc::new(Semaphore::new(
            config
                .tokenize_budget_bytes
                .div_ceil(1024)
                .clamp(1, Semaphore::MAX_PERMITS),
        ));
        Admission {
            config,
            slots,
            budget_kib,
        }
    }

    /// The limits.
    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// Reads the whole body: 413 at once when `Content-Length` exceeds the cap, 413 as soon as
    /// the bytes received exceed it (never buffering more), 408 when it takes too long.
    ///
    /// A refused body's remainder is read and discarded in the background for a short while
    /// ([`DRAIN_MAX_BYTES`], [`DRAIN_TIME`]): closing a socket with unread input resets it, and
    /// the reset can destroy the 413 before a client that is still sending reads it.
    pub async fn read_body(&self, headers: &HeaderMap, mut body: Body) -> Result<Bytes, ApiError> {
        let limit = self.config.max_body_bytes;
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            drain(body);
            return Err(ApiError::BodyTooLarge { limit_bytes: limit });
        }
        let collect = async {
            let mut buf = Vec::with_capacity(declared.map_or(0, |n| n as usize));
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| ApiError::InvalidRequest {
                    message: format!("Could not read the request body: {e}"),
                    param: None,
                    code: "invalid_body",
                })?;
                if let Ok(data) = frame.into_data() {
                    if buf.len() + data.len() > limit {
                        return Err(ApiError::BodyTooLarge { limit_bytes: limit });
                    }
                    buf.extend_from_slice(&data);
                }
            }
            Ok(Bytes::from(buf))
        };
        let result = match tokio::time::timeout(self.config.body_timeout, collect).await {
            Err(_) => Err(ApiError::BodyTimeout {
                limit_s: self.config.body_timeout.as_secs().max(1),
            }),
            Ok(r) => r,
        };
        if matches!(result, Err(ApiError::BodyTooLarge { .. })) {
            drain(body);
        }
        result
    }

    /// 400 naming `param` when `text` is over the prompt cap.
    pub fn check_prompt_bytes(&self, text: &str, param: &str) -> Result<(), ApiError> {
        let cap = self.config.max_prompt_bytes;
        if text.len() > cap {
            return Err(ApiError::InvalidRequest {
                message: format!(
                    "{param} is {} bytes; this server accepts at most {cap} bytes of prompt text (--max-prompt-bytes).",
                    text.len()
                ),
                param: Some(param.to_string()),
                code: "prompt_too_large",
            });
        }
        Ok(())
    }

    /// Runs `work` (tokenisation of `text_bytes` bytes) on a blocking thread once one of the
    /// pool's slots and that much of its byte budget are free (a text over the whole budget
    /// waits for all of it); 503 with `Retry-After` when they do not free within
    /// `--tokenize-wait`. After a large text, freed heap is handed back to the system.
    pub async fn tokenize<T: Send + 'static>(
        &self,
        text_bytes: usize,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let wait = self.config.tokenize_wait;
        let kib = u32::try_from(text_bytes.div_ceil(1024).max(1))
            .unwrap_or(u32::MAX)
            .min(self.budget_kib_total());
        let acquire = async {
            let slot = Arc::clone(&self.slots).acquire_owned().await?;
            let budget = Arc::clone(&self.budget_kib).acquire_many_owned(kib).await?;
            Ok::<_, tokio::sync::AcquireError>((slot, budget))
        };
        let permit = match tokio::time::timeout(wait, acquire).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => {
                return Err(ApiError::Unavailable(
                    "The tokeniser pool is closed.".to_string(),
                ));
            }
            Err(_) => {
                return Err(ApiError::Busy {
                    message: format!(
                        "The tokeniser pool ({} slots, {} bytes of prompt text at once) stayed busy for {} s.",
                        self.config.tokenize_threads,
                        self.config.tokenize_budget_bytes,
                        wait.as_secs_f32()
                    ),
                    retry_after_s: 1,
                });
            }
        };
        tokio::task::spawn_blocking(move || {
            let out = work();
            if text_bytes >= TRIM_AFTER_BYTES {
                release_free_heap();
            }
            drop(permit);
            out
        })
        .await
        .map_err(|e| ApiError::Internal(format!("the tokeniser task failed: {e}")))
    }
}

impl Admission {
    fn budget_kib_total(&self) -> u32 {
        u32::try_from(
            self.config
                .tokenize_budget_bytes
                .div_ceil(1024)
                .clamp(1, Semaphore::MAX_PERMITS),
        )
        .unwrap_or(u32::MAX)
    }
}

/// Texts from this size on hand their freed heap back after tokenisation.
const TRIM_AFTER_BYTES: usize = 256 << 10;

/// Returns free heap pages to the system: tokenising a large text allocates ~100× its size in
/// small blocks on the blocking thread's malloc arena, which glibc otherwise keeps (issue 14:
/// 450 MB stayed resident after one 4 MB message).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_heap() {
    // SAFETY: malloc_trim only walks glibc's own arenas under their locks and releases free
    // pages; it takes no pointers from us and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators and platforms: nothing to do.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_heap() {}

/// The longest token of the vocabulary in bytes (special tokens included): no token covers
/// more of the text than this.
pub fn max_token_bytes(tokenizer: &Tokenizer) -> usize {
    (0..tokenizer.vocab_size() as u32)
        .filter_map(|id| tokenizer.token_bytes(id))
        .map(<[u8]>::len)
        .max()
        .unwrap_or(1)
        .max(1)
}

/// A lower bound on the tokens of `text_bytes` bytes of text: each token covers at most
/// `max_token_bytes` bytes of the normalised text, which is at least a third of the input.
pub fn min_tokens(text_bytes: usize, max_token_bytes: usize) -> usize {
    text_bytes.div_ceil(NFC_MAX_SHRINK * max_token_bytes.max(1))
}

/// 400 `context_length_exceeded` when a prompt of `text_bytes` bytes cannot fit `max_context`
/// tokens together with at least one completion token, decided without tokenising it.
pub fn check_fits(
    text_bytes: usize,
    max_token_bytes: usize,
    max_context: usize,
    param: &'static str,
) -> Result<(), ApiError> {
    let at_least = min_tokens(text_bytes, max_token_bytes);
    if at_least >= max_context {
        return Err(ApiError::InvalidRequest {
            message: format!(
                "This model's maximum context length is {max_context} tokens. However, the prompt is {text_bytes} bytes, which is at least {at_least} tokens. Please reduce the length of the prompt."
            ),
            param: Some(param.to_string()),
            code: "context_length_exceeded",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_refuses_only_what_cannot_fit() {
        // 16-byte tokens at most: 3 × 16 = 48 bytes of input per token at most.
        assert_eq!(min_tokens(48, 16), 1);
        assert_eq!(min_tokens(49, 16), 2);
        assert!(check_fits(48 * 63, 16, 64, "messages").is_ok());
        let e = check_fits(48 * 64, 16, 64, "messages").expect_err("cannot fit");
        assert_eq!(
            (e.status().as_u16(), e.code()),
            (400, "context_length_exceeded")
        );
    }

    #[test]
    fn prompt_cap_names_the_param() {
        let a = Admission::new(AdmissionConfig {
            max_prompt_bytes: 4,
            ..AdmissionConfig::default()
        });
        assert!(a.check_prompt_bytes("abcd", "messages").is_ok());
        let e = a
            .check_prompt_bytes("abcde", "messages[2].content")
            .expect_err("over the cap");
        assert_eq!(e.body()["error"]["param"], "messages[2].content");
        assert_eq!(e.code(), "prompt_too_large");
    }

    #[tokio::test]
    async fn a_full_pool_answers_busy() {
        let a = Admission::new(AdmissionConfig {
            tokenize_threads: 1,
            tokenize_wait: Duration::from_millis(50),
            ..AdmissionConfig::default()
        });
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let a = Arc::new(a);
        let a2 = Arc::clone(&a);
        let held = tokio::spawn(async move { a2.tokenize(10, move || rx.recv().is_ok()).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let e = a
            .tokenize(10, || 1)
            .await
            .expect_err("the only slot is taken");
        assert_eq!((e.status().as_u16(), e.code()), (503, "server_busy"));
        let _ = tx.send(());
        assert_eq!(held.await.ok().and_then(Result::ok), Some(true));
        assert_eq!(a.tokenize(10, || 7).await.ok(), Some(7));
    }

    #[tokio::test]
    async fn the_byte_budget_is_shared() {
        // Two slots but a 4 KiB budget: a 3 KiB text leaves no room for another 3 KiB one.
        let cfg = AdmissionConfig {
            tokenize_threads: 2,
            tokenize_budget_bytes: 4096,
            tokenize_wait: Duration::from_millis(50),
            ..AdmissionConfig::default()
        };
        let a = Arc::new(Admission::new(cfg));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let a2 = Arc::clone(&a);
        let held = tokio::spawn(async move { a2.tokenize(3072, move || rx.recv().is_ok()).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            a.tokenize(3072, || 1).await.map_err(|e| e.code()),
            Err("server_busy")
        );
        assert_eq!(a.tokenize(1024, || 2).await.ok(), Some(2));
        let _ = tx.send(());
        assert_eq!(held.await.ok().and_then(Result::ok), Some(true));
        // A text over the whole budget waits for all of it rather than forever.
        assert_eq!(a.tokenize(1 << 20, || 3).await.ok(), Some(3));
    }
}
