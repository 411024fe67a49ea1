//! Is the weights PVC complete? A short Job (a probe) in a small image
//! mounts the PVC read-only and reads, for each model, its ref and orch's
//! completeness marker (`.orch/complete-<commit>.json`, written by `orch
//! setup` only after every file was verified): the same offline check
//! `orch plan` makes on a local folder, made where the weights are.

use crate::backend::KubernetesBackend;
use crate::KubeError;
use std::time::Duration;

/// A model to check: its hub cache folder (`models--org--name`) and revision.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightsQuery {
    pub folder: String,
    pub revision: String,
}

/// Single-quoted for `sh`; `None` for text holding a quote or a control character.
fn sh_quote(s: &str) -> Option<String> {
    (!s.contains('\'') && !s.chars().any(char::is_control)).then(|| format!("'{s}'"))
}

/// The probe's script (the PVC at `$ORCH_WEIGHTS`): one `orch-weights
/// FOLDER COMMIT|-` line per model.
pub fn script(models: &[WeightsQuery]) -> Result<String, KubeError> {
    let mut s = String::from("set -u\n");
    for m in models {
        let (Some(f), Some(r)) = (sh_quote(&m.folder), sh_quote(&m.revision)) else {
            return Err(KubeError::Unavailable {
                message: format!(
                    "cannot check `{}@{}` on the cluster: odd characters",
                    m.folder, m.revision
                ),
                hint: "name models with letters, digits, `-`, `_`, `.` and `/`".into(),
            });
        };
        s.push_str(&format!(
            "f=\"$ORCH_WEIGHTS\"/{f}; r={r}; c=$(cat \"$f/refs/$r\" 2>/dev/null || echo \"$r\"); \
             if [ -f \"$f/.orch/complete-$c.json\" ]; then printf 'orch-weights %s %s\\n' {f} \"$c\"; else printf 'orch-weights %s -\\n' {f}; fi\n"
        ));
    }
    Ok(s)
}

/// The commit each model is complete at (`None`: not complete), from the probe's log.
pub fn parse(models: &[WeightsQuery], log: &str) -> Vec<Option<String>> {
    models
        .iter()
        .map(|m| {
            log.lines()
                .filter_map(|l| l.strip_prefix("orch-weights "))
                .filter_map(|l| l.split_once(' '))
                .find(|(f, _)| *f == m.folder)
                .and_then(|(_, c)| (c != "-").then(|| c.trim().to_string()))
        })
        .collect()
}

/// Check the weights PVC for these models (a probe Job in `image`).
pub async fn check(
    backend: &KubernetesBackend,
    image: &str,
    models: &[WeightsQuery],
) -> Result<Vec<Option<String>>, KubeError> {
    if backend.settings().weights_pvc.is_none() {
        return Err(KubeError::Unavailable {
            message: "the suite needs model weights, and the kubernetes backend reads them from a PersistentVolumeClaim".into(),
            hint: "name it in the suite: `kubernetes: {weights_pvc: NAME}` (a hub cache that `orch setup` filled), or pass `--no-preflight`".into(),
        });
    }
    let log = backend
        .probe("weights", image, &script(models)?, Duration::from_secs(300))
        .await?;
    Ok(parse(models, &log))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_reads_refs_and_markers_and_its_output_parses() {
        let q = vec![
            WeightsQuery {
                folder: "models--org--a".into(),
                revision: "main".into(),
            },
            WeightsQuery {
                folder: "models--org--b".into(),
                revision: "0123456789abcdef0123456789abcdef01234567".into(),
            },
        ];
        let s = script(&q).unwrap();
        assert!(
            s.contains("f=\"$ORCH_WEIGHTS\"/'models--org--a'; r='main'"),
            "{s}"
        );
        // Run it for real on a folder laid out like the hub cache.
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("models--org--a");
        std::fs::create_dir_all(a.join("refs")).unwrap();
        std::fs::create_dir_all(a.join(".orch")).unwrap();
        std::fs::write(a.join("refs/main"), "c0ffee").unwrap();
        std::fs::write(a.join(".orch/complete-c0ffee.json"), "{}").unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&s)
            .env("ORCH_WEIGHTS", dir.path())
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stdout);
        assert_eq!(parse(&q, &log), vec![Some("c0ffee".to_string()), None], "{log}");
        assert!(script(&[WeightsQuery {
            folder: "x".into(),
            revision: "it's".into()
        }])
        .is_err());
    }
}
