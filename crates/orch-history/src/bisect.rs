//! The bisection of `orch bisect`, without IO: which commit to measure next,
//! what a measured step says, when to stop.
//!
//! The commits are the first-parent path from the good commit (excluded) to
//! the bad one (included), oldest first: `commits[n-1]` is the bad commit;
//! the good one sits at the virtual index `-1`. Each step is a paired
//! comparison of one commit against the good commit, classified by
//! [`classify`]: `same` (behaves like good), `differs` (the bad commit:
//! `faster`, `slower`, `output_mismatch` or `flagged`; a later commit: its
//! ratio nearer the bad one's than 1, or gated), `skip`
//! (the commit's variant could not be built, installed or served: the way
//! `git bisect skip` marks it), or `fatal` (the good commit's own variant
//! failed: nothing can be compared).
//!
//! [`Bisection::next`] derives everything from the recorded steps, so a
//! state read back after a kill continues where it was:
//!
//! 1. the bad commit is measured first; `same` ends with
//!    [`Outcome::NoChange`], `skip` with [`Outcome::BadUnmeasurable`];
//! 2. `lo` is the latest `same` commit before `hi`, the earliest `differs`
//!    commit (the good commit and the bad one to begin with);
//! 3. when `hi` directly follows `lo` (no commit between) the culprit is
//!    `hi` ([`Outcome::Culprit`]);
//! 4. otherwise the unskipped commit between them nearest the middle is
//!    next (the lower one on a tie); when every commit between them was
//!    skipped, the first differing commit is one of them or `hi`
//!    ([`Outcome::Ambiguous`], as `git bisect` says "only skipped commits
//!    left to test").
//!
//! A measurement that contradicts the order (a `same` commit after a
//! `differs` one, from noise or a change that came and went) is kept but
//! does not move `lo` past `hi`. The number of steps is at most
//! `1 + ceil(log2(n))` without skips.

use serde::{Deserialize, Serialize};

/// What one step's comparison says of its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// No significant difference from the good commit.
    Same,
    /// Differs from the good commit (slower, faster, or gated).
    Differs,
    /// The commit could not be measured (build, install or server failed).
    Skip,
    /// The good commit itself could not be measured.
    Fatal,
}

impl Class {
    /// The class of a pair's verdict (`faster`, `slower`, `same`,
    /// `output_mismatch`, `flagged`); `None` for one this version does not
    /// know.
    pub fn of(verdict: &str) -> Option<Class> {
        match verdict {
            "same" => Some(Class::Same),
            "faster" | "slower" | "output_mismatch" | "flagged" => Some(Class::Differs),
            _ => None,
        }
    }
}

/// The class of a step from its effect. The bad commit's (`bad: None`) is
/// its verdict's: it must differ significantly, else there is nothing to
/// find. A later commit's is decided against the bad commit's effect: a
/// gated verdict (`output_mismatch`, `flagged`) differs when the bad one was
/// gated too; otherwise the commit differs when its ratio is nearer the bad
/// commit's ratio than 1 (on the log scale: the midpoint rule, as `asv find`
/// compares with both ends). Asking every step for significance instead
/// would turn a noisy step's `same` (its interval holding both 1 and the
/// bad ratio) into a wrong turn.
pub fn classify(effect: &Effect, bad: Option<&Effect>) -> Option<Class> {
    let gated = |v: &str| matches!(v, "output_mismatch" | "flagged");
    let verdict = Class::of(&effect.verdict)?;
    let Some(bad) = bad else { return Some(verdict) };
    if gated(&bad.verdict) {
        return Some(verdict);
    }
    if gated(&effect.verdict) {
        return Some(Class::Differs);
    }
    let (r, b) = (effect.ratio.ln(), bad.ratio.ln());
    if !r.is_finite() || !b.is_finite() {
        return Some(verdict);
    }
    Some(if (r - b).abs() < r.abs() {
        Class::Differs
    } else {
        Class::Same
    })
}

/// The effect of a commit against the good one (the pair's primary metric).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    pub metric: String,
    /// `faster`, `slower`, `same`, `output_mismatch` or `flagged`.
    pub verdict: String,
    /// Geometric mean of the per-round ratios candidate / good.
    pub ratio: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    /// Paired rounds.
    pub n: u32,
}

/// One measured (or skipped) commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Index in [`Bisection::commits`].
    pub index: usize,
    pub commit: String,
    pub class: Class,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    /// Why the step was skipped or fatal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// The run in the store that measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Its cost in US dollars (0 when unpriced).
    #[serde(default)]
    pub cost_usd: f64,
    /// Wall time of the step in seconds.
    #[serde(default)]
    pub wall_s: f64,
}

/// Where a bisection ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The bad commit does not differ significantly from the good one.
    NoChange { effect: Option<Effect> },
    /// The first commit that differs from the good one.
    Culprit {
        commit: String,
        index: usize,
        effect: Option<Effect>,
    },
    /// Skipped commits hide which one is first: it is one of these
    /// (oldest first; the last one is known to differ).
    Ambiguous { commits: Vec<String> },
    /// The bad commit could not be measured.
    BadUnmeasurable { cause: String },
    /// The good commit could not be measured.
    GoodUnmeasurable { cause: String },
    /// The cost cap stopped it before the next step; the first differing
    /// commit is one of these.
    Budget { commits: Vec<String>, why: String },
}

impl Outcome {
    /// One line for people.
    pub fn summary(&self) -> String {
        let short = |c: &str| c.chars().take(12).collect::<String>();
        match self {
            Outcome::NoChange { effect } => match effect {
                Some(e) => format!(
                    "no significant change: bad vs good {} x{:.3} [{:.3}, {:.3}] ({})",
                    e.metric, e.ratio, e.ci_low, e.ci_high, e.verdict
                ),
                None => "no significant change".into(),
            },
            Outcome::Culprit { commit, effect, .. } => match effect {
                Some(e) => format!(
                    "first differing commit: {} ({} {} x{:.3}, 95% CI [{:.3}, {:.3}], n={})",
                    short(commit),
                    e.verdict,
                    e.metric,
                    e.ratio,
                    e.ci_low,
                    e.ci_high,
                    e.n
                ),
                None => format!("first differing commit: {}", short(commit)),
            },
            Outcome::Ambiguous { commits } => format!(
                "the first differing commit is one of {} (the others could not be measured): {}",
                commits.len(),
                commits.iter().map(|c| short(c)).collect::<Vec<_>>().join(" ")
            ),
            Outcome::BadUnmeasurable { cause } => format!("the bad commit could not be measured: {cause}"),
            Outcome::GoodUnmeasurable { cause } => format!("the good commit could not be measured: {cause}"),
            Outcome::Budget { commits, why } => format!(
                "stopped by the budget ({why}); the first differing commit is one of {}: {}",
                commits.len(),
                commits.iter().map(|c| short(c)).collect::<Vec<_>>().join(" ")
            ),
        }
    }
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Compare this commit (index in `commits`) with the good one.
    Measure {
        index: usize,
        commit: String,
    },
    Done(Outcome),
}

/// A bisection's state: the path and the steps so far. Serialised as the
/// `bisect/<id>.json` file of `orch bisect`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bisection {
    pub good: String,
    /// Good (excluded) to bad (included), oldest first.
    pub commits: Vec<String>,
    pub steps: Vec<Step>,
}

impl Bisection {
    /// A bisection of `commits` (good excluded, bad last); `None` when empty
    /// (the bad commit is the good one or before it).
    pub fn new(good: String, commits: Vec<String>) -> Option<Bisection> {
        (!commits.is_empty()).then_some(Bisection {
            good,
            commits,
            steps: Vec::new(),
        })
    }

    /// The bad commit's measured effect, once measured.
    pub fn bad_effect(&self) -> Option<&Effect> {
        self.step_at(self.commits.len() - 1)
            .and_then(|s| s.effect.as_ref())
    }

    pub fn bad(&self) -> &str {
        // `new` refuses an empty path.
        self.commits.last().map(String::as_str).unwrap_or("")
    }

    /// Record a step (a later step of the same commit replaces it).
    pub fn record(&mut self, step: Step) {
        self.steps.retain(|s| s.index != step.index);
        self.steps.push(step);
    }

    fn step_at(&self, index: usize) -> Option<&Step> {
        self.steps.iter().find(|s| s.index == index)
    }

    /// `lo` (latest `same` before `hi`; -1: good) and `hi` (earliest
    /// `differs`), as signed indices.
    fn bounds(&self) -> (i64, i64) {
        let hi = self
            .steps
            .iter()
            .filter(|s| s.class == Class::Differs)
            .map(|s| s.index as i64)
            .min()
            .unwrap_or(self.commits.len() as i64 - 1);
        let lo = self
            .steps
            .iter()
            .filter(|s| s.class == Class::Same && (s.index as i64) < hi)
            .map(|s| s.index as i64)
            .max()
            .unwrap_or(-1);
        (lo, hi)
    }

    /// The commits the first differing one may still be (oldest first).
    pub fn remaining(&self) -> Vec<String> {
        let (lo, hi) = self.bounds();
        ((lo + 1)..=hi)
            .map(|i| self.commits[i as usize].clone())
            .collect()
    }

    /// The next commit to measure, or where the bisection ended.
    pub fn next(&self) -> Next {
        if let Some(f) = self.steps.iter().find(|s| s.class == Class::Fatal) {
            return Next::Done(Outcome::GoodUnmeasurable {
                cause: f.cause.clone().unwrap_or_default(),
            });
        }
        let last = self.commits.len() - 1;
        match self.step_at(last) {
            None => {
                return Next::Measure {
                    index: last,
                    commit: self.commits[last].clone(),
                }
            }
            Some(s) if s.class == Class::Same => {
                return Next::Done(Outcome::NoChange {
                    effect: s.effect.clone(),
                })
            }
            Some(s) if s.class == Class::Skip => {
                return Next::Done(Outcome::BadUnmeasurable {
                    cause: s.cause.clone().unwrap_or_default(),
                })
            }
            Some(_) => {}
        }
        let (lo, hi) = self.bounds();
        if hi - lo <= 1 {
            let index = hi as usize;
            return Next::Done(Outcome::Culprit {
                commit: self.commits[index].clone(),
                index,
                effect: self.step_at(index).and_then(|s| s.effect.clone()),
            });
        }
        let mid = lo + (hi - lo) / 2;
        let open = |i: i64| i > lo && i < hi && self.step_at(i as usize).is_none();
        // Nearest the middle first, the lower one on a tie.
        for d in 0..(hi - lo) {
            for i in [mid - d, mid + d] {
                if open(i) {
                    let index = i as usize;
                    return Next::Measure {
                        index,
                        commit: self.commits[index].clone(),
                    };
                }
            }
        }
        Next::Done(Outcome::Ambiguous {
            commits: self.remaining(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commits(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("c{i:02}")).collect()
    }

    /// Run a bisection against an oracle of the class of every index.
    fn drive(n: usize, class: impl Fn(usize) -> Class) -> (Outcome, Vec<usize>) {
        let mut b = Bisection::new("good".into(), commits(n)).unwrap();
        let mut order = Vec::new();
        loop {
            match b.next() {
                Next::Measure { index, commit } => {
                    assert_eq!(commit, b.commits[index]);
                    assert!(!order.contains(&index), "{index} measured twice");
                    order.push(index);
                    b.record(Step {
                        index,
                        commit,
                        class: class(index),
                        effect: None,
                        cause: (class(index) == Class::Skip).then(|| "no server".into()),
                        run: None,
                        cost_usd: 0.0,
                        wall_s: 0.0,
                    });
                }
                Next::Done(o) => return (o, order),
            }
            assert!(order.len() <= n + 1, "no end: {order:?}");
        }
    }

    fn shift_at(k: usize) -> impl Fn(usize) -> Class {
        move |i| if i >= k { Class::Differs } else { Class::Same }
    }

    #[test]
    fn finds_every_planted_commit_in_log2_steps() {
        for n in [1usize, 2, 3, 5, 8, 31, 32, 100] {
            let bound = 1 + (n as f64).log2().ceil() as usize;
            for k in 0..n {
                let (o, order) = drive(n, shift_at(k));
                match o {
                    Outcome::Culprit {
                        index, ref commit, ..
                    } => {
                        assert_eq!(index, k, "n={n} k={k}");
                        assert_eq!(commit, &format!("c{:02}", k + 1));
                    }
                    other => panic!("n={n} k={k}: {other:?}"),
                }
                assert!(
                    order.len() <= bound,
                    "n={n} k={k}: {} steps {order:?}",
                    order.len()
                );
                assert_eq!(order[0], n - 1, "the bad commit first");
            }
        }
    }

    #[test]
    fn no_change_when_bad_is_same() {
        let (o, order) = drive(31, |_| Class::Same);
        assert!(matches!(o, Outcome::NoChange { .. }), "{o:?}");
        assert_eq!(order, vec![30]);
        assert!(o.summary().starts_with("no significant change"));
    }

    #[test]
    fn a_skipped_commit_is_stepped_around() {
        // The culprit is 20; 14 (the first middle) fails to build.
        let (o, order) = drive(31, |i| match i {
            14 => Class::Skip,
            i if i >= 20 => Class::Differs,
            _ => Class::Same,
        });
        assert!(matches!(o, Outcome::Culprit { index: 20, .. }), "{o:?}");
        assert_eq!(order[..3], [30, 14, 13]);
        assert!(order.len() <= 7, "{order:?}");
    }

    #[test]
    fn a_skipped_culprit_candidate_leaves_an_ambiguous_range() {
        // 10 differs first but cannot be measured: 9 same, 11 differs.
        let (o, _) = drive(31, |i| match i {
            10 => Class::Skip,
            i if i >= 10 => Class::Differs,
            _ => Class::Same,
        });
        assert_eq!(
            o,
            Outcome::Ambiguous {
                commits: vec!["c11".into(), "c12".into()]
            }
        );
    }

    #[test]
    fn unmeasurable_ends() {
        let (o, order) = drive(8, |_| Class::Skip);
        assert!(matches!(o, Outcome::BadUnmeasurable { .. }), "{o:?}");
        assert_eq!(order.len(), 1);
        let (o, _) = drive(8, |_| Class::Fatal);
        assert!(matches!(o, Outcome::GoodUnmeasurable { .. }), "{o:?}");
    }

    #[test]
    fn a_contradicting_step_does_not_pass_hi() {
        // 5 differs (noise), 20 is the true start; 25 measured `same` later
        // would contradict: lo never passes hi.
        let mut b = Bisection::new("g".into(), commits(32)).unwrap();
        let step = |index: usize, class| Step {
            index,
            commit: format!("c{:02}", index + 1),
            class,
            effect: None,
            cause: None,
            run: None,
            cost_usd: 0.0,
            wall_s: 0.0,
        };
        b.record(step(31, Class::Differs));
        b.record(step(5, Class::Differs));
        b.record(step(25, Class::Same));
        assert_eq!(b.remaining().len(), 6);
        assert_eq!(
            b.next(),
            Next::Measure {
                index: 2,
                commit: "c03".into()
            }
        );
    }

    #[test]
    fn resume_from_the_serialised_state_redoes_nothing() {
        let k = 17;
        let mut b = Bisection::new("good".into(), commits(32)).unwrap();
        // Three steps, then "killed": the state goes through JSON.
        for _ in 0..3 {
            let Next::Measure { index, commit } = b.next() else {
                panic!()
            };
            b.record(Step {
                index,
                commit,
                class: shift_at(k)(index),
                effect: None,
                cause: None,
                run: Some(format!("run-{index}")),
                cost_usd: 0.0,
                wall_s: 1.0,
            });
        }
        let done: Vec<usize> = b.steps.iter().map(|s| s.index).collect();
        let text = serde_json::to_string(&b).unwrap();
        let mut back: Bisection = serde_json::from_str(&text).unwrap();
        assert_eq!(back, b);
        let mut more = 0;
        loop {
            match back.next() {
                Next::Measure { index, commit } => {
                    assert!(!done.contains(&index), "{index} redone");
                    more += 1;
                    back.record(Step {
                        index,
                        commit,
                        class: shift_at(k)(index),
                        effect: None,
                        cause: None,
                        run: None,
                        cost_usd: 0.0,
                        wall_s: 0.0,
                    });
                }
                Next::Done(o) => {
                    assert!(matches!(o, Outcome::Culprit { index: 17, .. }), "{o:?}");
                    break;
                }
            }
        }
        assert!(more >= 1 && more + 3 <= 6, "{more}");
    }

    #[test]
    fn later_steps_are_classified_by_the_nearer_end() {
        let e = |verdict: &str, ratio: f64| Effect {
            metric: "m".into(),
            verdict: verdict.into(),
            ratio,
            ci_low: ratio - 0.1,
            ci_high: ratio + 0.1,
            n: 3,
        };
        let bad = e("slower", 0.90);
        assert_eq!(classify(&bad, None), Some(Class::Differs));
        assert_eq!(classify(&e("same", 0.99), None), Some(Class::Same));
        // A noisy `same` nearer the bad ratio differs; a `slower` nearer 1 does not.
        assert_eq!(classify(&e("same", 0.93), Some(&bad)), Some(Class::Differs));
        assert_eq!(classify(&e("slower", 0.97), Some(&bad)), Some(Class::Same));
        assert_eq!(classify(&e("faster", 1.02), Some(&bad)), Some(Class::Same));
        assert_eq!(
            classify(&e("output_mismatch", 1.0), Some(&bad)),
            Some(Class::Differs)
        );
        let gated = e("output_mismatch", 1.0);
        assert_eq!(classify(&e("same", 1.0), Some(&gated)), Some(Class::Same));
        assert_eq!(classify(&e("x", 1.0), Some(&bad)), None);
    }

    #[test]
    fn verdicts_classify() {
        assert_eq!(Class::of("same"), Some(Class::Same));
        for v in ["faster", "slower", "output_mismatch", "flagged"] {
            assert_eq!(Class::of(v), Some(Class::Differs));
        }
        assert_eq!(Class::of("unknown"), None);
        assert!(Bisection::new("g".into(), vec![]).is_none());
    }
}
