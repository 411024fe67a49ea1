//! The one rule for tests that need an outside tool (a Chromium, `docker-registry`, Slurm,
//! `s3s-fs`/`moto_server`, debootstrap, root for containers, Python's `modal` or `kubernetes`
//! packages, ...): outside CI a missing tool skips the test with a `skipped: TEST: WHY` note on
//! stderr; under CI (`CI=true` or `CI=1`, as `.ci/run` sets) it fails the test, because there
//! the test must run and `.ci/run` installs what it needs.
//!
//! ```no_run
//! use orch_test_support::skip;
//! # fn find_chromium() -> Result<std::path::PathBuf, String> { Err("no Chromium".into()) }
//! // In `#[test] fn charts_render()`:
//! let Some(chromium) = skip::require("charts_render", find_chromium()) else {
//!     return;
//! };
//! # let _ = chromium;
//! ```
//!
//! `why` names the missing tool and how to install it (`apt-get install -y chromium`,
//! `pip install modal`, `bash scripts/prepare-docker.sh`).

use std::io::Write as _;

/// Whether these tests run under CI: `CI` is `true` or `1`. Anything else (unset, empty,
/// `false`, `0`) is a developer's machine, where missing tools skip tests.
pub fn in_ci() -> bool {
    is_ci_value(std::env::var("CI").ok().as_deref())
}

fn is_ci_value(value: Option<&str>) -> bool {
    matches!(value, Some("true" | "1"))
}

/// A test's outside tool is missing: outside CI, print `skipped: TEST: WHY` to stderr and
/// return `false` (the test returns early); under CI, panic with
/// `TEST: WHY (CI=true: this test must run here; .ci/run installs what it needs)`.
///
/// Returns `bool` so that a readiness check can end with `return skip_or_fail(...)`.
#[track_caller]
pub fn skip_or_fail(test: &str, why: &str) -> bool {
    skip_or_fail_as(in_ci(), test, why)
}

/// The tool itself, or its absence: `Ok(tool)` is `Some(tool)`; `Err(why)` is
/// [`skip_or_fail`]`(test, why)`, so `None` outside CI and a panic under CI.
#[track_caller]
pub fn require<T>(test: &str, what: Result<T, String>) -> Option<T> {
    require_as(in_ci(), test, what)
}

/// The running test's name, as libtest names the thread it runs each test on
/// (`module::test_name`); `"test"` where that name is not known. For shared helpers
/// (`require_tooling`, a `ready()` check) that are not told which test called them.
pub fn current_test() -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_string(),
        _ => "test".to_string(),
    }
}

#[track_caller]
fn skip_or_fail_as(ci: bool, test: &str, why: &str) -> bool {
    if ci {
        panic!("{test}: {why} (CI=true: this test must run here; .ci/run installs what it needs)");
    }
    // Straight to stderr: libtest captures `eprintln!` of passing tests, and a skipped test
    // passes; the note must show anyway.
    let _ = std::io::stderr().write_all(format!("skipped: {test}: {why}\n").as_bytes());
    false
}

#[track_caller]
fn require_as<T>(ci: bool, test: &str, what: Result<T, String>) -> Option<T> {
    match what {
        Ok(tool) => Some(tool),
        Err(why) => {
            skip_or_fail_as(ci, test, &why);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_is_true_or_1_only() {
        assert!(is_ci_value(Some("true")));
        assert!(is_ci_value(Some("1")));
        for not in [None, Some(""), Some("false"), Some("0"), Some("yes")] {
            assert!(!is_ci_value(not), "{not:?}");
        }
    }

    #[test]
    fn outside_ci_a_missing_tool_skips() {
        assert!(!skip_or_fail_as(
            false,
            "t",
            "no `tool` (apt-get install -y tool)"
        ));
        assert_eq!(require_as::<u8>(false, "t", Err("no `tool`".into())), None);
    }

    #[test]
    #[should_panic(
        expected = "t: no `tool` (apt-get install -y tool) (CI=true: this test must run here; \
                    .ci/run installs what it needs)"
    )]
    fn under_ci_a_missing_tool_fails() {
        skip_or_fail_as(true, "t", "no `tool` (apt-get install -y tool)");
    }

    #[test]
    #[should_panic(expected = "t: no `tool` (CI=true")]
    fn under_ci_require_fails_on_a_missing_tool() {
        require_as::<u8>(true, "t", Err("no `tool`".into()));
    }

    #[test]
    fn a_present_tool_is_returned_in_and_outside_ci() {
        assert_eq!(require_as(true, "t", Ok(7)), Some(7));
        assert_eq!(require_as(false, "t", Ok(7)), Some(7));
    }

    #[test]
    fn current_test_is_the_running_tests_name() {
        assert_eq!(
            current_test(),
            "skip::tests::current_test_is_the_running_tests_name"
        );
    }
}
