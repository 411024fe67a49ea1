//! The host paths a task names: what must travel with a cell to wherever
//! it runs (a container, a pod, a sandbox, a compute node), and where the
//! task is rewritten to point at the copies. No IO: listing and rewriting
//! only (the transport is each backend's).

use crate::{Client, TaskSpec, Workload};

/// What a path is to the cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathRole {
    /// The working folder of a command, a server or a client command.
    Workdir,
    /// A local git repository the variants of a comparison check out.
    Repo,
    /// A variant's patch file.
    Patch,
    /// The load generator's prompts.
    PromptFile,
    /// The load generator's `tokenizer.json`.
    Tokenizer,
}

impl PathRole {
    pub fn as_str(self) -> &'static str {
        match self {
            PathRole::Workdir => "workdir",
            PathRole::Repo => "repo",
            PathRole::Patch => "patch",
            PathRole::PromptFile => "prompt_file",
            PathRole::Tokenizer => "tokenizer",
        }
    }
}

/// Is a repository reference a path on the host (not a URL or `git@host:`)?
pub fn is_local_repo(repo: &str) -> bool {
    !(repo.contains("://") || (repo.contains('@') && repo.contains(':') && !repo.starts_with('/')))
}

impl TaskSpec {
    /// Every host path the task names, in a stable order, with its role.
    pub fn local_paths(&self) -> Vec<(PathRole, String)> {
        let mut out = Vec::new();
        let mut task = self.clone();
        task.rewrite_local_paths(|role, path| {
            out.push((role, path.to_string()));
            path.to_string()
        });
        out
    }

    /// Replace every host path the task names by `f(role, path)` (where the
    /// copy lands inside the cell).
    pub fn rewrite_local_paths(&mut self, mut f: impl FnMut(PathRole, &str) -> String) {
        let mut each = |role: PathRole, p: &mut Option<String>| {
            if let Some(v) = p.as_mut() {
                *v = f(role, v);
            }
        };
        match &mut self.workload {
            Workload::Command(c) => each(PathRole::Workdir, &mut c.workdir),
            Workload::Server(s) => server_paths(s, &mut each),
            Workload::Compare(c) => {
                if c.repo.as_deref().is_some_and(is_local_repo) {
                    each(PathRole::Repo, &mut c.repo);
                }
                each(PathRole::Patch, &mut c.worktree_patch);
                for v in &mut c.variants {
                    each(PathRole::Patch, &mut v.patch);
                }
                server_paths(&mut c.server, &mut each);
            }
            Workload::Builtin(_) => {}
        }
    }
}

fn server_paths(s: &mut crate::ServerWorkload, each: &mut impl FnMut(PathRole, &mut Option<String>)) {
    each(PathRole::Workdir, &mut s.workdir);
    match &mut s.client {
        Some(Client::Command(c)) => each(PathRole::Workdir, &mut c.workdir),
        Some(Client::Loadgen(l)) => {
            each(PathRole::PromptFile, &mut l.prompt_file);
            // A repo id is looked up in the weights cache; a file travels.
            if l.tokenizer.as_deref().is_some_and(|t| t.ends_with(".json")) {
                each(PathRole::Tokenizer, &mut l.tokenizer);
            }
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CompareWorkload, LoadGen, Readiness, ServerWorkload, Variant};

    fn task(workload: Workload) -> TaskSpec {
        TaskSpec {
            version: crate::PROTOCOL_VERSION,
            run_id: "r".into(),
            cell_id: "c".into(),
            gpu: "none".into(),
            params: Default::default(),
            env: Default::default(),
            secret_env: vec![],
            workload,
            measure: Default::default(),
            logs: Default::default(),
            memory_limit_bytes: None,
            weights_dir: None,
            strict_hardware: false,
            gpu_fallback: vec![],
            files: None,
        }
    }

    fn compare(repo: &str) -> Workload {
        let variant = |name: &str, patch: Option<&str>| Variant {
            name: name.into(),
            git_ref: None,
            patch: patch.map(String::from),
            install: None,
        };
        Workload::Compare(CompareWorkload {
            repo: Some(repo.into()),
            variants: vec![
                variant("baseline", None),
                variant("human", Some("/home/u/p/human.patch")),
                variant("agent", Some("/home/u/p/agent.patch")),
            ],
            rounds: 3,
            warmup_rounds: 0,
            noise: 0.02,
            max_rounds: None,
            primary_metric: None,
            seed: None,
            worktree_patch: None,
            max_warmup_rounds: None,
            output_check: None,
            check: None,
            defences: false,
            install_cache: None,
            server: ServerWorkload {
                argv: vec!["python3".into(), "serve.py".into()],
                workdir: None,
                ready: Readiness::Tcp { port: 8000 },
                startup_timeout_s: 60.0,
                client: Some(Client::Loadgen(LoadGen {
                    endpoint: "http://127.0.0.1:8000/v1".into(),
                    model: None,
                    num_prompts: 10,
                    request_rate: None,
                    burstiness: 1.0,
                    max_concurrency: None,
                    input_len: 8,
                    output_len: 8,
                    prompt_file: Some("/home/u/p/prompts.jsonl".into()),
                    warmup_requests: 0,
                    stream: true,
                    seed: 0,
                    slo: None,
                    tokenizer: None,
                    range_ratio: 0.0,
                    prefix_len: 0,
                    prefix_groups: 0,
                    sweep: None,
                    saturation: None,
                    ramp_up: None,
                    multi_turn: false,
                    turn_delay_ms: 0.0,
                    nonce: None,
                    ignore_eos: true,
                })),
            },
        })
    }

    #[test]
    fn a_comparison_names_its_repo_patches_and_prompts_and_they_can_be_rewritten() {
        let mut t = task(compare("/home/u/p"));
        assert_eq!(
            t.local_paths(),
            vec![
                (PathRole::Repo, "/home/u/p".to_string()),
                (PathRole::Patch, "/home/u/p/human.patch".to_string()),
                (PathRole::Patch, "/home/u/p/agent.patch".to_string()),
                (PathRole::PromptFile, "/home/u/p/prompts.jsonl".to_string()),
            ]
        );
        t.rewrite_local_paths(|role, p| {
            format!("/orch/files/{}/{}", role.as_str(), p.rsplit('/').next().unwrap())
        });
        assert!(t.local_paths().iter().all(|(_, p)| p.starts_with("/orch/files/")));
        // A remote repository is fetched by the cell, not shipped.
        let t = task(compare("https://github.com/vllm-project/vllm"));
        assert!(!t.local_paths().iter().any(|(r, _)| *r == PathRole::Repo));
        assert!(!is_local_repo("git@github.com:org/repo.git"));
        assert!(is_local_repo("/srv/repos/a@b:c"));
    }

    #[test]
    fn a_command_names_its_workdir_and_a_builtin_names_nothing() {
        let t = task(Workload::Command(crate::CommandWorkload {
            argv: vec!["python3".into(), "train.py".into()],
            workdir: Some("/home/u/examples/pytorch-train".into()),
        }));
        assert_eq!(
            t.local_paths(),
            vec![(PathRole::Workdir, "/home/u/examples/pytorch-train".to_string())]
        );
        let t = task(Workload::Builtin(crate::BuiltinWorkload::Transformer(
            Default::default(),
        )));
        assert!(t.local_paths().is_empty());
    }
}
