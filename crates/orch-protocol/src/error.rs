//! One way to say whose an error is to fix, implemented by every library
//! error of orch; the CLI turns it into the exit code (2: the user's, 3:
//! the result store could not be reached or written, 1: internal), however
//! deep in a chain of causes the error sits.

/// Whose an error is to fix.
pub trait ErrorClass: std::error::Error {
    /// The user's (a flag, a file, a credential, a quota, a missing
    /// image): `orch` exits 2 and the message carries a `hint:`. Otherwise
    /// an internal failure: exit 1.
    fn is_user_error(&self) -> bool;

    /// The result store could not be reached or written within its outage
    /// budget (nobody's fix but time or the network): `orch` exits 3.
    fn is_outage(&self) -> bool {
        false
    }
}
