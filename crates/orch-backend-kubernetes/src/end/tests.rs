//! Table cases of [`decide`]: every end the backend names, from the facts
//! alone; then the same facts through the lifecycle's one judge, with the
//! agent's own result and orch's stop.

use super::*;
use orch_backend::lifecycle::{judge_in, Stop};

fn s(text: &str) -> Option<String> {
    Some(text.to_string())
}

fn ended_pod(reason: &str, exit_code: i32) -> PodFacts {
    PodFacts {
        phase: s("Failed"),
        terminated: Some(Terminated {
            reason: s(reason),
            exit_code,
            message: None,
        }),
        ..Default::default()
    }
}

fn said(mut pod: PodFacts, message: &str) -> PodFacts {
    if let Some(t) = pod.terminated.as_mut() {
        t.message = s(message);
    }
    pod
}

fn oom_killed() -> PodFacts {
    ended_pod("OOMKilled", 137)
}

fn evicted() -> PodFacts {
    PodFacts {
        phase: s("Failed"),
        reason: s("Evicted"),
        message: s("The node was low on resource: memory."),
        ..Default::default()
    }
}

fn disrupted(phase: &str) -> PodFacts {
    PodFacts {
        phase: s(phase),
        disruption: Some(("EvictionByEvictionAPI".into(), "Eviction API: evicting".into())),
        ..Default::default()
    }
}

fn pod_status(phase: &str, reason: &str, message: &str) -> PodFacts {
    PodFacts {
        phase: s(phase),
        reason: s(reason),
        message: s(message),
        ..Default::default()
    }
}

fn running() -> PodFacts {
    PodFacts {
        phase: s("Running"),
        ..Default::default()
    }
}

fn facts(pod: Option<PodFacts>) -> Facts {
    Facts {
        cell_id: "c".into(),
        namespace: "bench".into(),
        pod,
        ..Default::default()
    }
}

fn agent(status: Status, kind: &str) -> CellResult {
    let mut r = CellResult::failed("c", status, FailureKind::new(kind), format!("the agent: {kind}"));
    if status == Status::Succeeded {
        r.failure = None;
    }
    r
}

/// The agent's summary in a termination message.
fn summary(status: &str, kind: Option<&str>, exit_code: Option<i32>) -> String {
    serde_json::json!({"cell_id": "c", "status": status, "kind": kind, "message": "the summary", "exit_code": exit_code})
        .to_string()
}

/// A verdict (the cluster did it) or words (it only saw it).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Said {
    Verdict,
    Words,
}

/// What [`decide`] gave: how it was said, the status, the failure.
fn named(end: &PlatformEnd) -> (Said, Status, Failure) {
    match (&end.verdict, &end.words) {
        (Some((s, f)), None) => (Said::Verdict, *s, f.clone()),
        (None, Some((s, f))) => (Said::Words, *s, f.clone()),
        other => panic!("one of verdict and words: {other:?}"),
    }
}

struct Case {
    name: &'static str,
    facts: Facts,
    said: Said,
    status: Status,
    kind: &'static str,
    /// Words the failure's message holds.
    message: &'static str,
    /// The status of the result that came home.
    result: Option<Status>,
    exit_code: Option<i32>,
}

fn case(name: &'static str, facts: Facts, said: Said, status: Status, kind: &'static str) -> Case {
    Case {
        name,
        facts,
        said,
        status,
        kind,
        message: "",
        result: None,
        exit_code: None,
    }
}

impl Case {
    fn saying(mut self, message: &'static str) -> Case {
        self.message = message;
        self
    }
    fn home(mut self, result: Status) -> Case {
        self.result = Some(result);
        self
    }
    fn exit(mut self, code: i32) -> Case {
        self.exit_code = Some(code);
        self
    }
}

fn with(mut f: Facts, change: impl FnOnce(&mut Facts)) -> Facts {
    change(&mut f);
    f
}

#[test]
fn every_end_the_cluster_names_from_the_facts_alone() {
    use Said::*;
    use Status::*;
    let frames_result = |status: Status, kind: &str| Some(agent(status, kind));
    let frame = orch_protocol::ship::Frame {
        n: 7,
        body: orch_protocol::ship::FrameBody::Event(orch_protocol::Event::Message { text: "x".into() }),
    }
    .to_line();
    let cases = vec![
        case("OOMKilled", facts(Some(oom_killed())), Verdict, Oom, "oom")
            .saying("killed for going over its memory limit (OOMKilled, exit code 137)"),
        case(
            "OOMKilled: the summary of a container killed mid-way is not taken",
            facts(Some(said(oom_killed(), &summary("succeeded", None, None)))),
            Verdict,
            Oom,
            "oom",
        ),
        case(
            "OOMKilled: the result the frames brought is",
            with(facts(Some(oom_killed())), |f| f.result = frames_result(Failed, "exit_code")),
            Verdict,
            Oom,
            "oom",
        )
        .home(Failed),
        case("evicted", facts(Some(evicted())), Verdict, Failed, "evicted")
            .saying("evicted from its node: The node was low on resource: memory."),
        case(
            "evicted, the agent's result home",
            with(facts(Some(evicted())), |f| f.result = frames_result(Failed, "signal")),
            Verdict,
            Failed,
            "evicted",
        )
        .home(Failed),
        case("disrupted", facts(Some(disrupted("Failed"))), Verdict, Cancelled, "disrupted")
            .saying("took the pod away (EvictionByEvictionAPI): Eviction API: evicting; `orch run --resume`"),
        case(
            "the pod's deadline",
            facts(Some(pod_status("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"))),
            Verdict,
            Timeout,
            "timeout",
        )
        .saying("activeDeadlineSeconds passed: Job was active longer"),
        case(
            "the Job's deadline over the container's exit",
            with(facts(Some(ended_pod("Error", 143))), |f| f.job_failed = s("DeadlineExceeded")),
            Verdict,
            Timeout,
            "timeout",
        )
        .saying("the Job's activeDeadlineSeconds passed and its pod was stopped"),
        case(
            "the Job's deadline over a pod gone",
            with(facts(None), |f| f.job_failed = s("DeadlineExceeded")),
            Verdict,
            Timeout,
            "timeout",
        ),
        case(
            "an OOM kill over the Job's deadline",
            with(facts(Some(oom_killed())), |f| f.job_failed = s("DeadlineExceeded")),
            Verdict,
            Oom,
            "oom",
        ),
        case(
            "an eviction over the Job's deadline",
            with(facts(Some(evicted())), |f| f.job_failed = s("DeadlineExceeded")),
            Verdict,
            Failed,
            "evicted",
        ),
        case(
            "a Job failed for another reason: the container's exit",
            with(facts(Some(ended_pod("Error", 1))), |f| f.job_failed = s("BackoffLimitExceeded")),
            Words,
            Failed,
            "agent_died",
        )
        .exit(1),
        case(
            "a lost node",
            facts(Some(pod_status("Failed", "NodeLost", "node gpu-3 stopped posting status"))),
            Verdict,
            Failed,
            "node_lost",
        )
        .saying("the pod's node went away (NodeLost): node gpu-3"),
        case(
            "the container exited by itself: its exit code is the agent's",
            facts(Some(ended_pod("Error", 3))),
            Words,
            Failed,
            "agent_died",
        )
        .saying("exited with 3 (Error) before the agent sent a result")
        .exit(3),
        case(
            "its last output: the termination message's lines that are not frames",
            facts(Some(said(
                ended_pod("Error", 1),
                &format!("{frame}\nTraceback (most recent call last):\nValueError: bad"),
            ))),
            Words,
            Failed,
            "agent_died",
        )
        .saying("; its last output:\nTraceback (most recent call last):\nValueError: bad")
        .exit(1),
        case(
            "the pod failed with its container never ended",
            facts(Some(pod_status("Failed", "", ""))),
            Words,
            Failed,
            "pod_failed",
        )
        .saying("the pod ended without a result (phase Failed)"),
        case("the pod is gone", facts(None), Words, Failed, "pod_lost").saying("the pod disappeared"),
        case(
            "a success: the frames' result, the container's exit 0",
            with(facts(Some(ended_pod("Completed", 0))), |f| f.result = frames_result(Succeeded, "")),
            Words,
            Failed,
            "agent_died",
        )
        .home(Succeeded)
        .exit(0),
        case(
            "no frames' result: the agent's summary in the termination message",
            facts(Some(said(ended_pod("Completed", 0), &summary("failed", Some("exit_code"), Some(3))))),
            Words,
            Failed,
            "agent_died",
        )
        .home(Failed)
        .exit(0),
        case(
            "the agent says it was told to stop: words, and its result (the lifecycle names the stop)",
            with(facts(Some(ended_pod("Error", 143))), |f| f.result = frames_result(Cancelled, "cancelled")),
            Words,
            Failed,
            "agent_died",
        )
        .home(Cancelled)
        .exit(143),
        case(
            "the API server gone before the pod was seen to end",
            with(facts(Some(running())), |f| {
                f.unreachable = s("the Kubernetes API server could not be reached for 180s");
                f.stream_error = f.unreachable.clone();
            }),
            Words,
            Failed,
            "api_unreachable",
        )
        .saying("could not be reached for 180s"),
        case(
            "the API server gone and the pod not seen: never pod_lost",
            with(facts(None), |f| f.unreachable = s("could not be reached")),
            Words,
            Failed,
            "api_unreachable",
        ),
        case(
            "the API server gone, but the pod was seen to end",
            with(facts(Some(ended_pod("Error", 1))), |f| {
                f.unreachable = s("could not be reached");
                f.stream_error = s("could not be reached");
            }),
            Words,
            Failed,
            "agent_died",
        )
        .saying("(could not be reached)")
        .exit(1),
        case(
            "the API server gone, but the pod was taken away",
            with(facts(Some(disrupted("Running"))), |f| f.unreachable = s("could not be reached")),
            Verdict,
            Cancelled,
            "disrupted",
        ),
        case(
            "a refused log: nothing came home, whatever the summary says",
            with(
                facts(Some(said(ended_pod("Completed", 0), &summary("succeeded", None, None)))),
                |f| {
                    f.log_refused = s("kubernetes `get pods/log p` failed: forbidden");
                    f.stream_error = f.log_refused.clone();
                    f.job_failed = s("DeadlineExceeded");
                },
            ),
            Verdict,
            Failed,
            "forbidden",
        )
        .saying("could not come home\nhint: grant what `deploy/kubernetes/orch-role.yaml` grants (`kubectl auth can-i get pods/log -n bench`)"),
        case(
            "a refused log over an OOM kill",
            with(facts(Some(oom_killed())), |f| f.log_refused = s("forbidden")),
            Verdict,
            Failed,
            "forbidden",
        ),
        case(
            "a log follow that broke: its words on the end",
            with(facts(Some(ended_pod("Error", 2))), |f| f.stream_error = s("the log follower did not end")),
            Words,
            Failed,
            "agent_died",
        )
        .saying("before the agent sent a result (the log follower did not end)")
        .exit(2),
    ];
    for c in cases {
        let end = decide(&c.facts);
        let (said, status, failure) = named(&end);
        assert_eq!(
            (said, status, failure.kind.as_str()),
            (c.said, c.status, c.kind),
            "{}: {failure:?}",
            c.name
        );
        assert!(
            failure.message.contains(c.message),
            "{}: {}",
            c.name,
            failure.message
        );
        assert_eq!(end.result.as_ref().map(|r| r.status), c.result, "{}", c.name);
        assert_eq!(end.exit_code, c.exit_code, "{}", c.name);
        assert_eq!(end.signal, None, "{}", c.name);
    }
}

#[test]
fn the_job_is_asked_only_where_its_deadline_could_name_the_end() {
    assert!(facts(Some(ended_pod("Error", 137))).asks_job());
    assert!(facts(None).asks_job());
    assert!(facts(Some(pod_status("Failed", "NodeLost", ""))).asks_job());
    for pod in [oom_killed(), evicted(), disrupted("Failed")] {
        assert!(!facts(Some(pod.clone())).asks_job(), "{pod:?}");
    }
    assert!(!with(facts(Some(running())), |f| f.unreachable = s("gone")).asks_job());
    assert!(!with(facts(Some(ended_pod("Error", 1))), |f| f.log_refused =
        s("forbidden"))
    .asks_job());
    // The API server gone but the pod seen to end: its exit, or the deadline.
    assert!(with(facts(Some(ended_pod("Error", 1))), |f| f.unreachable = s("gone")).asks_job());
}

/// (what, the facts, the agent's result as the stream brought it, orch's
/// stop) → the cell's status and failure kind.
type Judged = (
    &'static str,
    Facts,
    Option<CellResult>,
    Option<Stop>,
    (Status, &'static str),
);

/// The facts judged by the lifecycle, with the agent's result and orch's stop.
#[test]
fn the_lifecycle_ranks_the_clusters_end_against_the_agents_result() {
    use Status::*;
    let cases: Vec<Judged> = vec![
        (
            "an OOM kill names a failure's end",
            facts(Some(oom_killed())),
            Some(agent(Failed, "exit_code")),
            None,
            (Oom, "oom"),
        ),
        (
            "a success stands over an OOM kill",
            facts(Some(oom_killed())),
            Some(agent(Succeeded, "")),
            None,
            (Succeeded, ""),
        ),
        (
            "an OOM kill, no result",
            facts(Some(oom_killed())),
            None,
            None,
            (Oom, "oom"),
        ),
        (
            "an eviction names a failure's end",
            facts(Some(evicted())),
            Some(agent(Failed, "signal")),
            None,
            (Failed, "evicted"),
        ),
        (
            "a disruption names a cancel's end",
            facts(Some(disrupted("Failed"))),
            Some(agent(Cancelled, "cancelled")),
            None,
            (Cancelled, "disrupted"),
        ),
        (
            "the Job's deadline, no result",
            with(facts(None), |f| f.job_failed = s("DeadlineExceeded")),
            None,
            None,
            (Timeout, "timeout"),
        ),
        (
            "orch's cancel over a pod gone",
            facts(None),
            None,
            Some(Stop::Cancelled),
            (Cancelled, "cancelled"),
        ),
        (
            "orch's timeout over an eviction",
            facts(Some(evicted())),
            Some(agent(Failed, "signal")),
            Some(Stop::Timeout),
            (Failed, "signal"),
        ),
        (
            "an agent that died of SIGSEGV crashed",
            facts(Some(ended_pod("Error", 139))),
            None,
            None,
            (Failed, "agent_crashed"),
        ),
        (
            "an agent SIGKILLed from outside died",
            facts(Some(ended_pod("Error", 137))),
            None,
            None,
            (Failed, "agent_died"),
        ),
        (
            "the container's exit with the agent's result: the agent's",
            facts(Some(ended_pod("Error", 1))),
            Some(agent(Failed, "exit_code")),
            None,
            (Failed, "exit_code"),
        ),
        (
            "the summary is the result",
            facts(Some(said(
                ended_pod("Completed", 0),
                &summary("failed", Some("exit_code"), Some(3)),
            ))),
            None,
            None,
            (Failed, "exit_code"),
        ),
        (
            "a refused log, its summary a success",
            with(
                facts(Some(said(
                    ended_pod("Completed", 0),
                    &summary("succeeded", None, None),
                ))),
                |f| f.log_refused = s("forbidden"),
            ),
            None,
            None,
            (Failed, "forbidden"),
        ),
        (
            "a refused log after the stream brought a success",
            with(facts(Some(ended_pod("Completed", 0))), |f| {
                f.log_refused = s("forbidden")
            }),
            Some(agent(Succeeded, "")),
            None,
            (Succeeded, ""),
        ),
        (
            "the API server gone",
            with(facts(Some(running())), |f| f.unreachable = s("gone")),
            None,
            None,
            (Failed, "api_unreachable"),
        ),
    ];
    for (name, facts, result, stopped, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let end = decide(&facts);
        // As `lifecycle::judge` does: the stream's result, else what came home.
        let result = result.or(end.result.clone());
        let r = judge_in(
            dir.path(),
            "c",
            "the cell's container",
            &|_| None,
            result,
            stopped,
            end,
        );
        let kind = r.failure.as_ref().map(|f| f.kind.to_string()).unwrap_or_default();
        assert_eq!((r.status, kind.as_str()), want, "{name}: {r:?}");
    }
}

#[test]
fn the_termination_message_summary_is_a_result() {
    let r = summary_result(
        "c",
        r#"{"cell_id":"c","status":"failed","exit_code":3,"signal":null,"kind":"exit_code","message":"exited with 3"}"#,
    )
    .unwrap();
    assert_eq!(r.status, Status::Failed);
    let f = r.failure.unwrap();
    assert_eq!((f.kind.as_str(), f.exit_code), ("exit_code", Some(3)));
    let r = summary_result(
        "c",
        r#"{"cell_id":"c","status":"succeeded","exit_code":null,"kind":null,"message":""}"#,
    )
    .unwrap();
    assert_eq!(r.status, Status::Succeeded);
    assert!(r.failure.is_none());
    assert!(summary_result("c", "Traceback (most recent call last):").is_none());
}
