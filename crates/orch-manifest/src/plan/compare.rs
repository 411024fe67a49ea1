//! A comparison's settings (`compare:`) into its workload: rounds, warm-up,
//! the output check, defences; and a campaign task's row filling that
//! template (repository, variants, install, server, load overrides).

use super::*;

/// `rounds: auto` starts with this many measured rounds.
pub(super) const AUTO_MIN_ROUNDS: u32 = 3;
/// `rounds: auto` stops at this many unless `max_rounds` says otherwise.
pub(super) const DEFAULT_MAX_ROUNDS: u32 = 12;
/// `warmup_rounds: auto` stops at this many unless `max_warmup_rounds` says otherwise.
pub(super) const DEFAULT_MAX_WARMUP_ROUNDS: u32 = 6;
/// Warm-up rounds the steadiness test looks back over (`orch_stats::STEADY_WINDOW`).
pub(super) const STEADY_WINDOW: u32 = 4;

pub(super) fn compare_workload(
    c: &crate::suite::CompareDef,
    workload: Workload,
    base_dir: &Path,
    has_tasks: bool,
) -> Result<Workload, Msg> {
    let Workload::Server(server) = workload else {
        return Err((
            "a comparison runs a `server` workload".into(),
            "give the benchmark `workload: {server: {...}, client: {...}}`",
        ));
    };
    if has_tasks && !c.variants.is_empty() {
        return Err((
            "`variants` and `tasks` together".into(),
            "with `tasks:`, each row names its variants (baseline, human, agent); drop `variants`",
        ));
    }
    if !has_tasks && c.variants.len() < 2 {
        return Err((
            "a comparison needs at least two `variants`".into(),
            "e.g. baseline, human and agent",
        ));
    }
    let mut names = BTreeSet::new();
    for v in &c.variants {
        check_name(&v.name).map_err(|m| (format!("variant `name`: {m}"), NAME_HINT))?;
        if !names.insert(v.name.clone()) {
            return Err((
                format!("two variants are named `{}`", v.name),
                "give each variant its own name",
            ));
        }
    }
    let abs = |p: &String| {
        let looks_remote = p.contains("://") || p.starts_with("git@");
        if Path::new(p).is_absolute() || looks_remote {
            p.clone()
        } else {
            base_dir.join(p).to_string_lossy().into_owned()
        }
    };
    let (rounds, max_rounds) = match (c.rounds, c.max_rounds) {
        (Some(crate::suite::Rounds::Auto), max) => {
            let max = max.unwrap_or(DEFAULT_MAX_ROUNDS);
            if max < AUTO_MIN_ROUNDS {
                return Err((
                    format!("`max_rounds` must be at least {AUTO_MIN_ROUNDS}"),
                    "`rounds: auto` starts with 3 rounds; the default is 12",
                ));
            }
            (AUTO_MIN_ROUNDS, Some(max))
        }
        (_, Some(_)) => return Err((
            "`max_rounds` is only for `rounds: auto`".into(),
            "write `rounds: auto` to add rounds until the interval is narrow enough, or drop `max_rounds`",
        )),
        (Some(crate::suite::Rounds::Fixed(n)), None) => (n, None),
        (None, None) => (5, None),
    };
    if rounds < 2 {
        return Err((
            "`rounds` must be at least 2".into(),
            "confidence intervals need repeated rounds; use 3 or more, or `auto`",
        ));
    }
    if c.primary_metric.as_deref().is_some_and(|m| m.trim().is_empty()) {
        return Err((
            "`primary_metric` is empty".into(),
            "name a metric the rounds report, e.g. `output_throughput`",
        ));
    }
    let (warmup_rounds, max_warmup_rounds) = match (c.warmup_rounds, c.max_warmup_rounds) {
        (Some(crate::suite::WarmupRounds::Auto), max) => {
            let max = max.unwrap_or(DEFAULT_MAX_WARMUP_ROUNDS);
            if max < STEADY_WINDOW {
                return Err((
                    format!("`max_warmup_rounds` must be at least {STEADY_WINDOW}"),
                    "`warmup_rounds: auto` looks for a trend over the last 4 warm-up rounds; the default is 6",
                ));
            }
            (STEADY_WINDOW, Some(max))
        }
        (_, Some(_)) => return Err((
            "`max_warmup_rounds` is only for `warmup_rounds: auto`".into(),
            "write `warmup_rounds: auto` to warm up until the rounds are steady, or drop `max_warmup_rounds`",
        )),
        (Some(crate::suite::WarmupRounds::Fixed(n)), None) => (n, None),
        (None, None) => (1, None),
    };
    let output_check = match &c.output_check {
        Some(crate::suite::OutputCheckDef::Off) => None,
        Some(crate::suite::OutputCheckDef::On(s)) => Some(s.clone()),
        None => Some(crate::suite::OutputCheckSettings::default()),
    };
    let output_check = match output_check {
        None => None,
        Some(s) => {
            let max_tokens = s.max_tokens.unwrap_or(32);
            let prompts = s.prompts.unwrap_or(8);
            if prompts == 0 || max_tokens == 0 {
                return Err((
                    "`output_check` needs at least one prompt and one token".into(),
                    "e.g. `output_check: {prompts: 8, max_tokens: 32}`, or `output_check: false` to turn it off",
                ));
            }
            let min_match_prefix =
                match s.min_match_prefix {
                    None | Some(crate::suite::MatchPrefix::Exact) => None,
                    Some(crate::suite::MatchPrefix::Tokens(n)) if n == 0 || n > max_tokens => return Err((
                        format!(
                            "`min_match_prefix` must be between 1 and `max_tokens` ({max_tokens}), not {n}"
                        ),
                        "a count of leading tokens every answer must share with the baseline's, or `exact`",
                    )),
                    Some(crate::suite::MatchPrefix::Tokens(n)) => Some(n),
                };
            Some(OutputCheck {
                prompts,
                max_tokens,
                min_match_prefix,
            })
        }
    };
    if c.check.as_deref().is_some_and(|m| m.trim().is_empty()) {
        return Err((
            "`check` is empty".into(),
            "a shell command run in each variant's checkout after its first round, e.g. `python3 check.py`",
        ));
    }
    Ok(Workload::Compare(CompareWorkload {
        repo: c.repo.as_ref().map(abs),
        variants: c
            .variants
            .iter()
            .map(|v| Variant {
                name: v.name.clone(),
                git_ref: v.git_ref.clone(),
                patch: v.patch.as_ref().map(abs),
                install: v.install.clone().or_else(|| c.install.clone()),
            })
            .collect(),
        rounds,
        warmup_rounds,
        noise: c.noise.unwrap_or(0.02),
        max_rounds,
        primary_metric: c.primary_metric.clone(),
        seed: c.seed,
        server,
        worktree_patch: None,
        max_warmup_rounds,
        output_check,
        check: c.check.clone(),
        defences: c.defences.unwrap_or(true),
        install_cache: None,
    }))
}

/// `command: [...]` or `shell: "..."` (exactly one) as an argv.
/// The comparison of one task: the template with the row's repository,
/// variants, install command, server command and load overrides.
pub(super) fn task_workload(
    w: &Workload,
    t: &crate::tasks::Task,
    template_install: Option<&String>,
) -> Result<Workload, Msg> {
    let Workload::Compare(c) = w else {
        return Err((
            "a task fills a `compare` template".into(),
            "give the benchmark `compare:` and a `server` workload",
        ));
    };
    let mut c = c.clone();
    if t.repo.is_some() {
        c.repo = t.repo.clone();
    }
    if c.repo.is_none() {
        return Err((
            "no repository: the row has no `repo` and the template's `compare` none".into(),
            "give the row `repo`, or the benchmark `compare: {repo: URL_OR_PATH}`",
        ));
    }
    c.variants = t
        .variants
        .iter()
        .map(|(name, git_ref, patch)| Variant {
            name: name.clone(),
            git_ref: git_ref.clone(),
            patch: patch.clone(),
            install: t.install.clone().or_else(|| template_install.cloned()),
        })
        .collect();
    if let Some(argv) = &t.server {
        c.server.argv = argv.clone();
    }
    if !t.load.is_empty() {
        let Some(Client::Loadgen(l)) = &c.server.client else {
            return Err((
                "`load` overrides the load generator, and the template's client is a command".into(),
                "use `client: {loadgen: {...}}` in the template, or drop `load` from the row",
            ));
        };
        let Ok(Value::Object(mut fields)) = serde_json::to_value(l) else {
            return Err(("the load generator's settings are not an object".into(), ""));
        };
        let known: BTreeSet<String> = fields.keys().cloned().collect();
        let keys: BTreeSet<String> = t.load.keys().cloned().collect();
        crate::tasks::check_load_keys(&keys, &known).map_err(|m| {
            (
                m,
                "`load` sets fields of the template's `loadgen`, e.g. `{\"num_prompts\": 64}`",
            )
        })?;
        for (k, v) in &t.load {
            fields.insert(k.clone(), v.clone());
        }
        let l = serde_json::from_value(Value::Object(fields)).map_err(|e| {
            (
                format!("`load`: {e}"),
                "`load` values have the template's types (`num_prompts: 64`, `request_rate: 8.0`)",
            )
        })?;
        c.server.client = Some(Client::Loadgen(l));
    }
    Ok(Workload::Compare(c))
}

#[cfg(test)]
mod compare_tests {
    use super::*;

    fn plan(yaml: &str) -> Result<CompareWorkload, String> {
        let base = "variants: [{name: a}, {name: b}]\n";
        let c: crate::suite::CompareDef =
            serde_saphyr::from_str(&format!("{base}{yaml}")).map_err(|e| e.to_string())?;
        let server = Workload::Server(ServerWorkload {
            argv: vec!["true".into()],
            workdir: None,
            ready: Readiness::Tcp { port: 8000 },
            startup_timeout_s: 1.0,
            client: None,
        });
        match compare_workload(&c, server, Path::new("/m"), false) {
            Ok(Workload::Compare(c)) => Ok(c),
            Ok(w) => Err(format!("{w:?}")),
            Err((m, h)) => Err(format!("{m}; hint: {h}")),
        }
    }

    #[test]
    fn checks_and_defences_are_on_by_default() {
        let c = plan("").unwrap();
        let check = OutputCheck {
            prompts: 8,
            max_tokens: 32,
            min_match_prefix: None,
        };
        assert_eq!(c.output_check, Some(check));
        assert!(c.defences);
        assert_eq!((c.warmup_rounds, c.max_warmup_rounds, c.check), (1, None, None));
        let c = plan("output_check: false\ndefences: false\ncheck: python3 check.py").unwrap();
        assert_eq!((c.output_check, c.defences), (None, false));
        assert_eq!(c.check.as_deref(), Some("python3 check.py"));
        let c = plan("output_check: {prompts: 3, max_tokens: 16, min_match_prefix: 12}").unwrap();
        assert_eq!(
            c.output_check,
            Some(OutputCheck {
                prompts: 3,
                max_tokens: 16,
                min_match_prefix: Some(12)
            })
        );
        let c = plan("output_check: {min_match_prefix: exact}").unwrap();
        assert_eq!(c.output_check.unwrap().min_match_prefix, None);
    }

    #[test]
    fn warmup_auto_is_bounded() {
        let c = plan("warmup_rounds: auto").unwrap();
        assert_eq!((c.warmup_rounds, c.max_warmup_rounds), (4, Some(6)));
        let c = plan("warmup_rounds: auto\nmax_warmup_rounds: 9").unwrap();
        assert_eq!(c.max_warmup_rounds, Some(9));
        assert_eq!(plan("warmup_rounds: 2").unwrap().warmup_rounds, 2);
    }

    #[test]
    fn bad_settings_name_the_field() {
        for (yaml, want) in [
            (
                "warmup_rounds: auto\nmax_warmup_rounds: 3",
                "`max_warmup_rounds` must be at least 4",
            ),
            (
                "warmup_rounds: 2\nmax_warmup_rounds: 6",
                "only for `warmup_rounds: auto`",
            ),
            ("warmup_rounds: soon", "invalid `warmup_rounds`"),
            (
                "output_check: {min_match_prefix: 40}",
                "between 1 and `max_tokens` (32), not 40",
            ),
            ("output_check: {min_match_prefix: most}", "invalid `output_check`"),
            ("output_check: {prompts: 0}", "at least one prompt"),
            ("check: \" \"", "`check` is empty"),
        ] {
            let e = plan(yaml).unwrap_err();
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }
}
