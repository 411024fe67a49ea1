//! Performance over time: the series of every cell's metrics across a
//! suite's runs, the points where a series changed level, and a new run
//! judged against its history (issue 33's `orch history`; the CLI lives in
//! `crates/orch`).
//!
//! # What a series is
//!
//! One series per (benchmark, cell params, metric, **testbed**). The testbed
//! is the backend plus the hardware the cell got: GPU model, GPU count and
//! driver version, as the agent read them (`CellView::hardware`); an H100
//! and an H200 run of one suite are never one series. A cell with no
//! hardware identity keys on its GPU request string (`gpu: H100:8`). Each
//! point is one run: its id, `created_at`, the git commit of its manifest's
//! repository, and the value, or the failure (status and diagnosis kind)
//! when the cell did not succeed; failures sit on the same time line as the
//! values and never enter the statistics ([`series`]).
//!
//! # Change points: E-divisive means
//!
//! The method Apache Otava (formerly Hunter) uses, after Matteson & James,
//! "A nonparametric approach for multiple change point analysis of
//! multivariate data", JASA 2014 ([`changepoints`]):
//!
//! - divergence: for a split of a segment into `X` (size `m`) and `Y` (size
//!   `n`), the energy statistic with α = 1,
//!   `Ê = 2/(mn) Σ|xᵢ−yⱼ| − C(m,2)⁻¹ Σ|xᵢ−xₖ| − C(n,2)⁻¹ Σ|yⱼ−yₖ|`, weighted
//!   `Q = mn/(m+n) · Ê`; the split of a segment is the one with the largest
//!   `Q` among those leaving at least `min_size` (3) points on each side;
//! - recursive bisection: every current segment proposes its best split,
//!   the largest `Q` over all segments is the candidate;
//! - significance: a permutation test. The values are shuffled within each
//!   current segment (a seeded RNG: the same input gives the same answer)
//!   and the largest `Q` recomputed, `R` times (199); the p-value is
//!   `(1 + #{Q_perm ≥ Q}) / (R + 1)`. A candidate with `p < 0.05` is
//!   accepted and the search goes on in the new segments; the first one that
//!   is not ends it. (Hunter, Otava's predecessor, swapped the permutation
//!   test for Student's t to be deterministic; the seeded permutation test
//!   here is deterministic as it is, and needs no normality.)
//! - location: each accepted change point is then moved to the best
//!   least-squares mean-shift split within `min_size` points of it, inside
//!   its two segments (`Options::refine`, on by default): with α = 1 the
//!   energy statistic places a pure level shift less precisely (a planted
//!   10% shift in 3% noise: within ±1 point 95% of the time unrefined, 98%
//!   refined, in the tests); it never adds or removes a change point;
//! - each change point is stated with the mean of the segment before and
//!   after it (between its neighbouring change points), the relative shift
//!   `(after − before) / before`, and a 95% interval of that shift from
//!   Welch's t on the two segments (the difference's interval divided by the
//!   mean before), and its permutation p-value.
//!
//! Measured by the tests (`cargo test -p orch-history -- --nocapture`):
//! false alarms on flat 100-point series with 3% noise: 4.5% (9 of 200);
//! one 10% level shift followed by 20 points: exactly one change point in
//! 91 of 100 series (a further split is tested at 5% each time); a history
//! growing after one shift keeps exactly that change point in 302 of 320
//! analyses.
//!
//! In 1-D with α = 1 the sums of distances for every split come from a
//! Fenwick tree over ranks, so one pass over a segment of `L` points costs
//! `O(L log L)`, not `O(L²)`: 10,000 points stay cheap.
//!
//! # Judging a new run
//!
//! [`judge`]: the new value against the last `N` (10) succeeded points of
//! its series *since the last change point*: `regression` or `improvement`
//! when it lies outside `mean ± max(3σ, 2% · |mean|)` on the bad or good
//! side (the metric's sense, [`better_for`]: `orch-stats`'s rule, the one
//! comparisons and reports use), else `normal`. A point
//! that was flagged opens a provisional level of its own, so re-runs of the
//! same regression are judged against it and raise no new flag (the level
//! shift is accepted), as are the points after an accepted change point; a
//! flagged point nearer the level before the flag drops that provisional
//! level (the flag was a one-off).
//!
//! # The parts
//!
//! - [`series`]: testbed keys, points, the split of runs into series, filters
//!   (benchmark, metric, `--since 30d`);
//! - [`changepoints`]: E-divisive means with its permutation test, Welch
//!   intervals;
//! - [`judge`]: the verdict of a point against its window;
//! - [`analysis`]: series + change points + verdicts, the one shape every
//!   renderer prints; [`judge_run`]: every metric of a new run's cells
//!   against its history (for `orch show`/`orch report`);
//! - [`render`]: text table, JSON, CSV, a self-contained HTML page (inline
//!   SVG, no script);
//! - [`load`]: a suite's run records from a [`orch_store::Store`], unreadable
//!   runs skipped with a warning;
//! - `synth` (feature `synth`, and in tests): synthetic runs with planted
//!   shifts written into a store.
//!
//! No IO except [`load`] (reads the store) and `synth` (writes one).

pub mod analysis;
pub mod bisect;
pub mod changepoints;
pub mod judge;
pub mod load;
pub mod render;
pub mod series;
#[cfg(any(test, feature = "synth"))]
pub mod synth;

pub use analysis::{
    analyze, judge_run, judge_run_with, AnalysisOptions, CellJudgment, History, SeriesReport, JUDGE_TAIL,
};
pub use changepoints::{detect, ChangePoint, Options as ChangePointOptions};
pub use judge::{better_for, judge, judge_all, Better, JudgeOptions, Judgment, Verdict};
pub use load::{load, Loaded};
pub use series::{build, parse_since, Filter, Point, PointFailure, Series, Testbed};

/// What can go wrong reading a history.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(transparent)]
    Store(#[from] orch_store::StoreError),
    #[error("`{text}` is not a duration\nhint: a number and a unit: `30d`, `12h`, `90m`, `2w`, `45s`")]
    BadSince { text: String },
    #[error("no runs of suite `{suite}` in `{store}`\nhint: `orch ls` lists the store's runs and suites")]
    NoRuns { suite: String, store: String },
}

/// A bad `--since` and a suite with no runs are the user's to fix; a store
/// error is whatever the store says it is.
impl orch_protocol::ErrorClass for HistoryError {
    fn is_user_error(&self) -> bool {
        match self {
            HistoryError::Store(e) => orch_protocol::ErrorClass::is_user_error(e),
            HistoryError::BadSince { .. } | HistoryError::NoRuns { .. } => true,
        }
    }

    /// A store that stopped answering is an outage here too (`orch history`
    /// exits with the store-outage code, as `orch run` does).
    fn is_outage(&self) -> bool {
        match self {
            HistoryError::Store(e) => orch_protocol::ErrorClass::is_outage(e),
            HistoryError::BadSince { .. } | HistoryError::NoRuns { .. } => false,
        }
    }
}
