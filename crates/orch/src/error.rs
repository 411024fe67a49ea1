//! Exit codes: 2 for what the user must fix, 3 for a result store that
//! could not be reached or written, 1 for internal failures.

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

impl orch_protocol::ErrorClass for UserError {
    fn is_user_error(&self) -> bool {
        true
    }
}

/// Whose an error is to fix.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    User,
    /// The result store could not be reached or written.
    Outage,
    Internal,
}

/// The exit code of a result store outage (`ErrorClass::is_outage`).
pub const STORE_OUTAGE: i32 = 3;

/// The class of one cause, for the error types of orch's libraries (each
/// says it through [`orch_protocol::ErrorClass`]); `None`: not one of them.
fn class(cause: &(dyn std::error::Error + 'static)) -> Option<Class> {
    use orch_protocol::ErrorClass;
    macro_rules! classes {
        ($($t:ty),+ $(,)?) => {
            $(
                if let Some(e) = cause.downcast_ref::<$t>() {
                    return Some(if e.is_user_error() {
                        Class::User
                    } else if e.is_outage() {
                        Class::Outage
                    } else {
                        Class::Internal
                    });
                }
            )+
        };
    }
    classes!(
        UserError,
        orch_manifest::ManifestError,
        orch_store::StoreError,
        orch_diagnose::RulesError,
        orch_cost::CostError,
        orch_images::ImageError,
        orch_hub::HubError,
        orch_report::ReportError,
        orch_backend::BackendError,
        orch_runner::RunnerError,
        orch_history::HistoryError,
        orch_campaign::CampaignError,
    );
    None
}

/// 2 for what the user must fix, however deep in the chain of causes; 3
/// for a result store that could not be reached or written; 1 for an
/// internal failure.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    let classes: Vec<Class> = e.chain().filter_map(class).collect();
    if classes.contains(&Class::User) {
        2
    } else if classes.contains(&Class::Outage) {
        STORE_OUTAGE
    } else {
        1
    }
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

    #[test]
    fn a_store_outage_exits_3_not_2() {
        let away = orch_store::StoreError::Unreachable {
            message: "the object store at http://s3 failed every request for 60 s: `503 SlowDown` ×289"
                .into(),
            hint: "check the network".into(),
        };
        let e = anyhow::Error::from(orch_runner::RunnerError::Store(away)).context("run r stopped");
        assert_eq!(exit_code(&e), super::STORE_OUTAGE);
    }
}
