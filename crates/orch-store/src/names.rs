//! Names from manifests, agents and remote stores (run ids, cell ids, file
//! names) checked before they name a file: one plain path component each.

use crate::{Result, StoreError};

/// Check that `name` (a run id, cell id or file name from a manifest, an
/// agent or a remote store) is one plain path component: not empty, not
/// `.` or `..`, no separator, no NUL, no control character, at most 200
/// bytes. Whatever passes can be joined to a folder without leaving it.
pub fn check_name(what: &'static str, name: &str) -> Result<()> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name.len() > 200
        || name.chars().any(|c| c == '/' || c == '\\' || c.is_control());
    if bad {
        return Err(StoreError::Unsafe {
            what,
            name: name.escape_debug().to_string(),
        });
    }
    Ok(())
}

/// Check a relative path (`variants/a/server.log`) component by component.
pub fn check_relative(what: &'static str, path: &str) -> Result<()> {
    if path.starts_with('/') {
        return Err(StoreError::Unsafe {
            what,
            name: path.escape_debug().to_string(),
        });
    }
    for part in path.split('/') {
        check_name(what, part).map_err(|_| StoreError::Unsafe {
            what,
            name: path.escape_debug().to_string(),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_leave_the_folder_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "/etc/passwd",
            "a/b",
            "a\\b",
            "a\0b",
            "a\nb",
        ] {
            assert!(check_name("cell id", bad).is_err(), "{bad:?}");
        }
        for good in ["transformer.none.preset-small", "a..b", "x-1_2.y"] {
            check_name("cell id", good).unwrap();
        }
        assert!(check_relative("file", "variants/a/server.log").is_ok());
        for bad in ["../x", "/abs", "a//b", "a/../b", "a/./b"] {
            assert!(check_relative("file", bad).is_err(), "{bad:?}");
        }
        let e = check_name("cell id", "../../etc").unwrap_err();
        assert!(e.is_user_error());
        assert!(e.to_string().contains("../../etc") && e.to_string().contains("hint:"));
    }
}
