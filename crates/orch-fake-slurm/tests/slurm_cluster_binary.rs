//! The `slurm-cluster` binary's `--max-submit-jobs N` (for `scripts/bench-scale.sh`): the
//! command runs against a cluster whose `sbatch` accepts N jobs and refuses the next
//! (`MaxSubmitJobs` of the user's association, enforced by slurmctld with accounting).

use std::process::Command;

const SCRIPT: &str = r#"
for i in 1 2 3; do
  if sbatch --hold --quiet -o /dev/null --wrap 'sleep 60' 2>>"$0"; then echo accepted; else echo refused; fi
done
"#;

#[test]
fn max_submit_jobs_makes_sbatch_refuse_the_job_past_the_limit() {
    if let Some(why) = orch_fake_slurm::unavailable_accounting() {
        orch_test_support::skip::skip_or_fail(&orch_test_support::skip::current_test(), &why);
        return;
    }
    let err = std::env::temp_dir().join(format!("slurm-cluster-binary-{}.err", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_slurm-cluster"))
        .args(["--max-submit-jobs", "2", "--", "bash", "-c", SCRIPT])
        .arg(&err)
        .output()
        .unwrap();
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    let _ = std::fs::remove_file(&err);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        stderr
    );
    let said: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(said, ["accepted", "accepted", "refused"], "{stderr}");
    assert!(
        stderr.contains("AssocMaxSubmitJobLimit") || stderr.contains("job submit limit"),
        "{stderr}"
    );
}
