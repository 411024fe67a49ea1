//! One give-up budget for a whole process: an outage of the object store
//! starts at the first request attempt that fails (a `5xx` or `429`
//! answer, a refused or dropped connection, no answer in time) and ends
//! when the store answers again (any other reply). Every request of the
//! process draws on the same budget ([`crate::objects::Settings::budget`],
//! `ORCH_S3_TIMEOUT_S`): record uploads, the next cells' claims, the retry
//! of spooled records and the final state write all give up together once
//! the outage is older than the budget, instead of each spending a budget
//! of its own one after another. Once spent, a request is a probe of a
//! second (`objects::PROBE`): it fails then, or the store answers and the
//! outage is over; the run stops, and a later command (`--resume`) starts
//! with a budget of its own.
//!
//! What the store answered meanwhile is tallied (`` `503 SlowDown` ×289``,
//! `connection refused ×12`), so the message names it instead of the SDK's
//! last error text. The tally is filled by an SDK interceptor that sees
//! every attempt ([`Tally`]).

use aws_sdk_s3::config::interceptors::FinalizerInterceptorContextRef;
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The outage the process is in, if any, and what the store answered in it.
#[derive(Debug)]
pub struct Outage {
    budget: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The first failed attempt of the current outage.
    since: Option<Instant>,
    /// What the store answered, in the order first seen, with counts.
    answers: Vec<(String, u64)>,
}

impl Outage {
    pub fn new(budget: Duration) -> Outage {
        Outage {
            budget,
            state: Mutex::new(State::default()),
        }
    }

    /// The store answered: the outage, if any, is over.
    pub fn answered(&self) {
        if let Ok(mut s) = self.state.lock() {
            if s.since.is_some() {
                *s = State::default();
            }
        }
    }

    /// An attempt failed with `what` (`503 SlowDown`, `connection refused`).
    pub fn failed(&self, what: &str) {
        if let Ok(mut s) = self.state.lock() {
            s.since.get_or_insert_with(Instant::now);
            match s.answers.iter_mut().find(|(w, _)| w == what) {
                Some((_, n)) => *n += 1,
                None => s.answers.push((what.to_string(), 1)),
            }
        }
    }

    /// When the budget of the current outage runs out; `None`: no outage.
    pub fn deadline(&self) -> Option<Instant> {
        self.state
            .lock()
            .ok()
            .and_then(|s| s.since)
            .map(|t| t + self.budget)
    }

    /// Whether the current outage has outlasted the budget: give up.
    pub fn spent(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() >= d)
    }

    /// How long the current outage has lasted and what the store answered
    /// in it: `` for 61 s: `503 SlowDown` ×289 ``; `None`: no outage seen.
    pub fn describe(&self) -> Option<String> {
        let s = self.state.lock().ok()?;
        let since = s.since?;
        let answers: Vec<String> = s.answers.iter().map(|(w, n)| format!("{w} ×{n}")).collect();
        Some(format!(
            "for {} s: {}",
            since.elapsed().as_secs(),
            answers.join(", ")
        ))
    }

    pub fn budget(&self) -> Duration {
        self.budget
    }
}

/// The SDK interceptor that tells [`Outage`] how each attempt ended.
#[derive(Debug)]
pub(crate) struct Tally {
    pub outage: std::sync::Arc<Outage>,
    /// One attempt's time, for the words of a request that got no answer.
    pub attempt_timeout: Duration,
}

impl Intercept for Tally {
    fn name(&self) -> &'static str {
        "orch-outage-tally"
    }

    fn read_after_attempt(
        &self,
        ctx: &FinalizerInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_s3::error::BoxError> {
        if let Some(r) = ctx.response() {
            let status = r.status().as_u16();
            if status >= 500 || status == 429 {
                let code = r.body().bytes().and_then(code_of);
                let what = match code {
                    Some(c) => format!("`{status} {c}`"),
                    None => format!("`{status}`"),
                };
                self.outage.failed(&what);
            } else {
                self.outage.answered();
            }
            return Ok(());
        }
        let what = match ctx.output_or_error() {
            Some(Err(e)) => {
                let timed_out =
                    e.is_timeout_error() || e.as_connector_error().is_some_and(|c| c.is_timeout());
                if timed_out {
                    format!("no reply within {}", secs(self.attempt_timeout))
                } else {
                    words_of(&aws_sdk_s3::error::DisplayErrorContext(e).to_string())
                }
            }
            _ => return Ok(()),
        };
        self.outage.failed(&what);
        Ok(())
    }
}

/// `2 s`, `0.5 s`.
pub(crate) fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

/// The S3 error code in an XML error body (`<Code>SlowDown</Code>`).
fn code_of(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find("<Code>")? + "<Code>".len();
    let len = text[start..].find("</Code>")?;
    let code = &text[start..start + len];
    (!code.is_empty() && code.len() < 64 && code.chars().all(|c| c.is_ascii_alphanumeric()))
        .then(|| code.to_string())
}

/// Plain words for a failed connection, from the error's text (never the
/// text itself: it can be long and name internals).
pub(crate) fn words_of(text: &str) -> String {
    let t = text.to_ascii_lowercase();
    if t.contains("refused") {
        "connection refused".into()
    } else if t.contains("reset")
        || t.contains("closed")
        || t.contains("incomplete")
        || t.contains("eof")
        || t.contains("broken pipe")
    {
        "connection dropped".into()
    } else if t.contains("dns") || t.contains("resolve") || t.contains("lookup") {
        "host name not found".into()
    } else if t.contains("timed out") || t.contains("timeout") {
        "no reply in time".into()
    } else {
        "connection failed".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_tallied_and_ends_when_the_store_answers() {
        let o = Outage::new(Duration::from_secs(60));
        assert!(o.describe().is_none() && o.deadline().is_none() && !o.spent());
        for _ in 0..289 {
            o.failed("`503 SlowDown`");
        }
        o.failed("connection refused");
        let text = o.describe().unwrap();
        assert!(
            text.ends_with("`503 SlowDown` ×289, connection refused ×1"),
            "{text}"
        );
        assert!(o.deadline().is_some() && !o.spent());
        o.answered();
        assert!(o.describe().is_none() && o.deadline().is_none());
        let short = Outage::new(Duration::from_millis(1));
        short.failed("connection refused");
        std::thread::sleep(Duration::from_millis(5));
        assert!(short.spent());
    }

    #[test]
    fn failures_are_named_in_plain_words() {
        assert_eq!(
            code_of(b"<Error><Code>SlowDown</Code></Error>").as_deref(),
            Some("SlowDown")
        );
        assert_eq!(code_of(b"<Code><x></Code>"), None);
        assert_eq!(
            words_of("dispatch failure: io error: error trying to connect: tcp connect error: Connection refused (os error 111)"),
            "connection refused"
        );
        assert_eq!(
            words_of("dispatch failure: io error: connection closed before message completed"),
            "connection dropped"
        );
        assert_eq!(secs(Duration::from_secs(2)), "2 s");
        assert_eq!(secs(Duration::from_millis(500)), "0.5 s");
    }
}
