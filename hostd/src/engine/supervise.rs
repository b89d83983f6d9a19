//! The scheduler thread's panic supervision: an iteration that panics fails what it was
//! running and the loop goes on, unless panics come faster than a budget allows (then the
//! engine stops so that a supervisor restarts hostd).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

/// Panics the scheduler survives within [`PANIC_WINDOW`]; one more exits the process.
pub(super) const PANIC_BUDGET: usize = 3;
/// The window [`PANIC_BUDGET`] counts over.
pub(super) const PANIC_WINDOW: Duration = Duration::from_secs(60);
/// hostd's exit status when the scheduler panicked more than [`PANIC_BUDGET`] times in
/// [`PANIC_WINDOW`] (EX_SOFTWARE, an internal software error).
pub(super) const EXIT_ENGINE_PANICS: u8 = 70;

/// How [`supervise`] ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Supervised {
    /// `iteration` returned false.
    Finished,
    /// This many panics fell within the window, more than the budget.
    PanicBudgetSpent(usize),
}

/// Runs `iteration` until it returns false. A panic in it is caught and handed to `recover`
/// (with its message), and the loop goes on, unless it is more than `budget` panics within
/// `window`.
pub(super) fn supervise<S>(
    state: &mut S,
    iteration: fn(&mut S) -> bool,
    recover: fn(&mut S, &str),
    budget: usize,
    window: Duration,
) -> Supervised {
    let mut panics: Vec<Instant> = Vec::new();
    loop {
        match catch_unwind(AssertUnwindSafe(|| iteration(state))) {
            Ok(true) => {}
            Ok(false) => return Supervised::Finished,
            Err(payload) => {
                recover(state, &panic_text(payload.as_ref()));
                let now = Instant::now();
                panics.retain(|t| now.duration_since(*t) < window);
                panics.push(now);
                if panics.len() > budget {
                    return Supervised::PanicBudgetSpent(panics.len());
                }
            }
        }
    }
}

/// A panic's message, for the log.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop state: `script[i]` says what iteration `i` does (`None` panics).
    struct Script {
        steps: Vec<Option<bool>>,
        at: usize,
        recovered: Vec<String>,
    }

    fn step(s: &mut Script) -> bool {
        let what = s.steps[s.at];
        s.at += 1;
        what.unwrap_or_else(|| panic!("step {} broke", s.at - 1))
    }

    fn recover(s: &mut Script, what: &str) {
        s.recovered.push(what.to_string());
    }

    fn script(steps: &[Option<bool>]) -> Script {
        Script {
            steps: steps.to_vec(),
            at: 0,
            recovered: Vec::new(),
        }
    }

    #[test]
    fn a_panicking_iteration_is_recovered_and_the_loop_goes_on() {
        let mut s = script(&[Some(true), None, Some(true), None, Some(true), Some(false)]);
        let ended = supervise(&mut s, step, recover, 3, Duration::from_secs(60));
        assert_eq!(ended, Supervised::Finished);
        assert_eq!(s.at, 6, "every iteration after the panics ran");
        assert_eq!(s.recovered, ["step 1 broke", "step 3 broke"]);
    }

    #[test]
    fn more_panics_than_the_budget_within_the_window_end_the_loop() {
        let mut s = script(&[None, Some(true), None, None, None, Some(true), Some(false)]);
        let ended = supervise(&mut s, step, recover, 3, Duration::from_secs(60));
        assert_eq!(ended, Supervised::PanicBudgetSpent(4));
        assert_eq!(s.at, 5, "the loop stopped at the fourth panic");
        assert_eq!(s.recovered.len(), 4, "each panic was recovered first");
    }

    #[test]
    fn panics_outside_the_window_do_not_count() {
        let mut s = script(&[None, None, None, None, None, Some(false)]);
        let ended = supervise(&mut s, step, recover, 3, Duration::ZERO);
        assert_eq!(
            ended,
            Supervised::Finished,
            "a zero window forgets every panic"
        );
        assert_eq!(s.recovered.len(), 5);
    }
}
