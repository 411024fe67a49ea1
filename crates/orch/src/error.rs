//! Exit codes: 2 for what the user must fix, 1 for internal failures.

use std::fmt;

/// An error the user must fix (bad argument, missing file...). Its text
/// carries a `hint:` line.
#[derive(Debug)]
pub struct UserError(pub String);

impl fmt::Display for UserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}

pub fn user(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UserError(msg.into()))
}

pub fn exit_code(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if cause.is::<UserError>() || cause.is::<orch_manifest::ManifestError>() {
            return 2;
        }
        if let Some(s) = cause.downcast_ref::<orch_store::StoreError>() {
            return if s.is_user_error() { 2 } else { 1 };
        }
        if cause.is::<orch_diagnose::RulesError>() {
            return 2;
        }
        if let Some(c) = cause.downcast_ref::<orch_cost::CostError>() {
            return if c.is_user_error() { 2 } else { 1 };
        }
        if let Some(i) = cause.downcast_ref::<orch_images::ImageError>() {
            return if i.is_user_error() { 2 } else { 1 };
        }
        if let Some(h) = cause.downcast_ref::<orch_hub::HubError>() {
            return if h.is_user_error() { 2 } else { 1 };
        }
        if let Some(b) = cause.downcast_ref::<orch_backend::BackendError>() {
            return if b.is_user_error() { 2 } else { 1 };
        }
        // `RunnerError` is transparent: its chain skips the error it wraps.
        match cause.downcast_ref::<orch_runner::RunnerError>() {
            Some(orch_runner::RunnerError::Backend(b)) => return if b.is_user_error() { 2 } else { 1 },
            Some(orch_runner::RunnerError::Store(s)) => return if s.is_user_error() { 2 } else { 1 },
            _ => {}
        }
    }
    1
}

/// The error and its causes, one per line.
pub fn render(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        // Library errors already quote their source; say each thing once.
        if !out.contains(&text) {
            out.push_str(&format!("\n  caused by: {text}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::exit_code;

    #[test]
    fn a_store_user_error_during_a_run_exits_2() {
        // A bucket the credentials may not write, found when a cell's record
        // goes up mid-run: the user's to fix.
        let store = orch_store::StoreError::Remote {
            message: "access denied to `s3://team/results`".into(),
            hint: "check the credentials".into(),
            user: true,
        };
        let e = anyhow::Error::from(orch_runner::RunnerError::Store(store));
        assert_eq!(exit_code(&e), 2);
        let internal = orch_store::StoreError::Remote {
            message: "the server answered 500".into(),
            hint: String::new(),
            user: false,
        };
        assert_eq!(
            exit_code(&anyhow::Error::from(orch_runner::RunnerError::Store(internal))),
            1
        );
    }
}
