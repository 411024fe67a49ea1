//! Sandboxes: `SandboxCreate` (mounts, volumes and secrets resolved, the entrypoint run in
//! its image's root as a container, with the NVIDIA injection for GPU sandboxes and the
//! scenario's kills), its task, logs, wait, terminate and list, and the run of one sandbox
//! (its output as log entries, its timeout, its end as a result).

use super::state::{now_s, Image, Inner, Sandbox, Stream};
use super::{SandboxRecord, Scenario};
use crate::container;
use orch_modal_proto::{self as proto, generic_result::GenericStatus, GenericResult};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;
use tonic::{Response, Status};

/// `SandboxCreate`: the sandbox's record, and its entrypoint started in its image's root
/// (unless its GPU type has no capacity).
pub(super) fn create(
    inner: &Arc<Inner>,
    r: proto::SandboxCreateRequest,
) -> Result<Response<proto::SandboxCreateResponse>, Status> {
    let def = r.definition.unwrap_or_default();
    let network_access = def.network_access.as_ref().map(|n| n.network_access_type);
    inner.note(
        "SandboxCreate",
        format!(
            "network_access={}",
            network_access.map_or("none".to_string(), |t| t.to_string())
        ),
    );
    if def.entrypoint_args.is_empty() {
        return Err(Status::invalid_argument("no entrypoint"));
    }
    let id = inner.id("sb");
    let res = def.resources.clone().unwrap_or_default();
    let gpu = res
        .gpu_config
        .as_ref()
        .filter(|g| g.count > 0 || !g.gpu_type.is_empty())
        .map(|g| (g.gpu_type.clone(), g.count.max(1)));
    let Inputs {
        mount_files,
        mut mounts,
        volumes,
        secret_env,
        image,
    } = resolve(inner, &def)?;
    let (image_root, mut env, image_workdir) = built(&image, &def.image_id)?;
    env.extend(secret_env);
    mounts.sort_by_key(|m| m.target.len());
    let rec = SandboxRecord {
        id: id.clone(),
        app_id: r.app_id.clone(),
        tags: r
            .tags
            .iter()
            .map(|t| (t.tag_name.clone(), t.tag_value.clone()))
            .collect(),
        gpu: gpu.clone(),
        milli_cpu: res.milli_cpu,
        memory_mb: res.memory_mb,
        entrypoint: def.entrypoint_args.clone(),
        volume_mounts: volumes,
        secret_keys: {
            let mut k: Vec<String> = def
                .secret_ids
                .iter()
                .filter_map(|id| inner.state.lock().unwrap().secrets.get(id).cloned())
                .flat_map(|vars| vars.into_keys())
                .collect();
            k.sort();
            k.dedup();
            k
        },
        mount_files,
        timeout_secs: def.timeout_secs,
        network_access,
        scheduled: false,
        result: None,
    };
    let (tx, _) = watch::channel(0u64);
    let sb = Arc::new(Sandbox {
        rec: Mutex::new(rec),
        created_at: now_s(),
        logs: Mutex::new(Vec::new()),
        next_entry: AtomicU64::new(0),
        changed: tx,
        result: Mutex::new(None),
        pgid: Mutex::new(None),
        killed_as: Mutex::new(None),
    });
    inner
        .state
        .lock()
        .unwrap()
        .sandboxes
        .insert(id.clone(), sb.clone());
    let sc = inner.scenario.lock().unwrap().clone();
    let unavailable = gpu.as_ref().is_some_and(|(t, _)| {
        let t = t.trim_end_matches('!');
        sc.unavailable_gpus.iter().any(|u| u.eq_ignore_ascii_case(t))
    });
    if !unavailable {
        let args = def.entrypoint_args.clone();
        let spec = container_spec(inner, &id, &def, gpu.as_ref(), image_root, image_workdir, mounts);
        let kill = scenario_kill(&sb, &args, &sc);
        tokio::spawn(run_sandbox(sb, spec, args, env, def.timeout_secs, kill));
    }
    Ok(Response::new(proto::SandboxCreateResponse { sandbox_id: id }))
}

/// What a sandbox's definition names, looked up: its mount files, the mounts (mount files
/// and volumes) at their container paths, its volumes, its secrets' variables, its image.
struct Inputs {
    mount_files: Vec<String>,
    mounts: Vec<container::Mount>,
    volumes: Vec<(String, String, bool)>,
    secret_env: BTreeMap<String, String>,
    image: Arc<Image>,
}

/// Look up the image, mounts, volumes and secrets a definition names (each must exist).
fn resolve(inner: &Inner, def: &proto::Sandbox) -> Result<Inputs, Status> {
    let st = inner.state.lock().unwrap();
    let image = st
        .images
        .get(&def.image_id)
        .cloned()
        .ok_or_else(|| Status::not_found(format!("image {} not found", def.image_id)))?;
    let mut files = Vec::new();
    let mut mounts = Vec::new();
    for m in &def.mount_ids {
        let list = st
            .mounts
            .get(m)
            .ok_or_else(|| Status::not_found(format!("mount {m} not found")))?;
        for f in list {
            files.push(f.filename.clone());
            mounts.push(container::Mount {
                host: inner.root.join("blobs").join(&f.sha256_hex),
                target: f.filename.clone(),
                read_only: true,
            });
        }
    }
    let mut volumes = Vec::new();
    for v in &def.volume_mounts {
        let dir = st
            .volume_dirs
            .get(&v.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} not found", v.volume_id)))?;
        volumes.push((v.volume_id.clone(), v.mount_path.clone(), v.read_only));
        mounts.push(container::Mount {
            host: dir.clone(),
            target: v.mount_path.clone(),
            read_only: v.read_only,
        });
    }
    let mut env = BTreeMap::new();
    for s in &def.secret_ids {
        let vars = st
            .secrets
            .get(s)
            .ok_or_else(|| Status::not_found(format!("secret {s} not found")))?;
        env.extend(vars.clone());
    }
    Ok(Inputs {
        mount_files: files,
        mounts,
        volumes,
        secret_env: env,
        image,
    })
}

/// A built image's root folder, `ENV` and `WORKDIR`; an image still building or that failed
/// to build runs no sandbox.
fn built(image: &Image, image_id: &str) -> Result<(PathBuf, BTreeMap<String, String>, String), Status> {
    let b = image.build.lock().unwrap();
    match (&b.result, &b.root) {
        (Some(r), Some(root)) if r.status == GenericStatus::Success as i32 => {
            Ok((root.clone(), b.env.clone(), b.workdir.clone()))
        }
        (None, _) => Err(Status::failed_precondition(format!(
            "image {image_id} is still building"
        ))),
        _ => Err(Status::failed_precondition(format!(
            "image {image_id} failed to build"
        ))),
    }
}

/// The container a sandbox runs in: its image's root, its mounts, the NVIDIA injection for a
/// GPU sandbox (when the server has an NVML library), its working folder and its own layer.
fn container_spec(
    inner: &Inner,
    id: &str,
    def: &proto::Sandbox,
    gpu: Option<&(String, u32)>,
    image_root: PathBuf,
    image_workdir: String,
    mounts: Vec<container::Mount>,
) -> container::Spec {
    let gpu = match (&inner.nvml, gpu) {
        (Some(lib), Some((_, n))) => Some(container::Gpu {
            nvml_lib: lib.clone(),
            visible_devices: (0..*n).map(|i| i.to_string()).collect::<Vec<_>>().join(","),
        }),
        _ => None,
    };
    container::Spec {
        root: image_root,
        mounts,
        gpu,
        workdir: if def.workdir.is_empty() {
            image_workdir
        } else {
            def.workdir.clone()
        },
        layer: Some(inner.root.join("sandboxes").join(id).join("layer")),
    }
}

/// The scenario's kill for a sandbox whose `orch.cell` tag (or entrypoint) it names: OOM
/// first, then terminate, after `kill_after`.
fn scenario_kill(sb: &Sandbox, args: &[String], sc: &Scenario) -> Option<(GenericStatus, Duration)> {
    let cell = sb
        .rec
        .lock()
        .unwrap()
        .tags
        .get("orch.cell")
        .cloned()
        .unwrap_or_default();
    let hit = |list: &[String]| {
        list.iter()
            .any(|p| cell.contains(p.as_str()) || args.iter().any(|a| a.contains(p.as_str())))
    };
    if hit(&sc.oom) {
        Some((GenericStatus::KernelOomKill, sc.kill_after))
    } else if hit(&sc.terminate) {
        Some((GenericStatus::Terminated, sc.kill_after))
    } else {
        None
    }
}

/// `SandboxGetTaskId`: the task once the sandbox is scheduled (or its result if it ended
/// before), waiting up to the request's timeout.
pub(super) async fn get_task_id(
    inner: &Arc<Inner>,
    r: proto::SandboxGetTaskIdRequest,
) -> Result<Response<proto::SandboxGetTaskIdResponse>, Status> {
    let sb = inner.sandbox(&r.sandbox_id)?;
    let deadline = Instant::now() + Duration::from_secs_f32(r.timeout.clamp(0.0, 60.0));
    let mut rx = sb.changed.subscribe();
    loop {
        let scheduled = sb.rec.lock().unwrap().scheduled;
        let done = sb.done();
        if scheduled || done.is_some() {
            return Ok(Response::new(proto::SandboxGetTaskIdResponse {
                task_id: if scheduled {
                    format!("ta-{}", r.sandbox_id)
                } else {
                    String::new()
                },
                task_result: if scheduled { None } else { done },
            }));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Response::new(proto::SandboxGetTaskIdResponse::default()));
        }
        let _ = tokio::time::timeout(left, rx.changed()).await;
    }
}

/// `SandboxGetLogs`: the log entries after the last entry id, in batches, until the sandbox
/// ends (or the request's timeout).
pub(super) fn get_logs(
    inner: &Arc<Inner>,
    r: proto::SandboxGetLogsRequest,
) -> Result<Response<Stream<proto::TaskLogsBatch>>, Status> {
    let sb = inner.sandbox(&r.sandbox_id)?;
    let drop_streams = inner.scenario.lock().unwrap().drop_log_streams;
    let timeout = Duration::from_secs_f32(if r.timeout > 0.0 {
        r.timeout.min(300.0)
    } else {
        55.0
    });
    let start: u64 = r.last_entry_id.parse().unwrap_or(0);
    let fd = if r.file_descriptor == 0 {
        proto::FileDescriptor::Stdout as i32
    } else {
        r.file_descriptor
    };
    let id = r.sandbox_id.clone();
    let rx = sb.changed.subscribe();
    let deadline = tokio::time::Instant::now() + timeout;
    let state = (sb, rx, start, false);
    let stream = futures_util::stream::unfold(state, move |(sb, mut rx, last, ended)| {
        let id = id.clone();
        async move {
            if ended {
                return None;
            }
            loop {
                // Mark what we have seen before reading, so a change after
                // the read wakes us.
                rx.borrow_and_update();
                let done = sb.done().is_some();
                let (items, top) = {
                    let logs = sb.logs.lock().unwrap();
                    let mut top = last;
                    let mut items = Vec::new();
                    for e in logs.iter().filter(|e| e.id > last) {
                        top = e.id;
                        if e.fd == fd {
                            items.push(proto::TaskLogs {
                                data: e.data.clone(),
                                task_state: proto::TaskState::Active as i32,
                                timestamp: now_s(),
                                file_descriptor: fd,
                            });
                        }
                    }
                    (items, top)
                };
                if !items.is_empty() || (done && top > last) {
                    let batch = proto::TaskLogsBatch {
                        task_id: format!("ta-{id}"),
                        items,
                        entry_id: top.to_string(),
                        app_done: false,
                        image_id: String::new(),
                        eof: false,
                        sandbox_id: id.clone(),
                    };
                    return Some((Ok(batch), (sb, rx, top, drop_streams)));
                }
                if done {
                    let batch = proto::TaskLogsBatch {
                        task_id: format!("ta-{id}"),
                        items: vec![],
                        entry_id: last.to_string(),
                        app_done: true,
                        image_id: String::new(),
                        eof: true,
                        sandbox_id: id.clone(),
                    };
                    return Some((Ok(batch), (sb, rx, last, true)));
                }
                if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
                    return None;
                }
            }
        }
    });
    Ok(Response::new(Box::pin(stream)))
}

/// `SandboxWait`: the result, waiting up to the request's timeout.
pub(super) async fn wait(
    inner: &Arc<Inner>,
    r: proto::SandboxWaitRequest,
) -> Result<Response<proto::SandboxWaitResponse>, Status> {
    let sb = inner.sandbox(&r.sandbox_id)?;
    let mut rx = sb.changed.subscribe();
    let deadline = Instant::now() + Duration::from_secs_f32(r.timeout.clamp(0.0, 60.0));
    loop {
        if let Some(res) = sb.done() {
            return Ok(Response::new(proto::SandboxWaitResponse { result: Some(res) }));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Response::new(proto::SandboxWaitResponse { result: None }));
        }
        let _ = tokio::time::timeout(left, rx.changed()).await;
    }
}

/// `SandboxTerminate`: kill a running sandbox; a finished one's result.
pub(super) fn terminate(
    inner: &Arc<Inner>,
    r: proto::SandboxTerminateRequest,
) -> Result<Response<proto::SandboxTerminateResponse>, Status> {
    let sb = inner.sandbox(&r.sandbox_id)?;
    let existing = sb.done();
    if existing.is_none() {
        sb.kill(GenericStatus::Terminated);
    }
    Ok(Response::new(proto::SandboxTerminateResponse {
        existing_result: existing,
    }))
}

/// `SandboxList`: the sandboxes of an app, by tags and creation time.
pub(super) fn list(
    inner: &Arc<Inner>,
    r: proto::SandboxListRequest,
) -> Result<Response<proto::SandboxListResponse>, Status> {
    let st = inner.state.lock().unwrap();
    let mut out = Vec::new();
    for sb in st.sandboxes.values() {
        let rec = sb.rec.lock().unwrap();
        if !r.app_id.is_empty() && rec.app_id != r.app_id {
            continue;
        }
        if !r.include_finished && sb.done().is_some() {
            continue;
        }
        if r.before_timestamp > 0.0 && sb.created_at >= r.before_timestamp {
            continue;
        }
        if !r
            .tags
            .iter()
            .all(|t| rec.tags.get(&t.tag_name) == Some(&t.tag_value))
        {
            continue;
        }
        out.push(proto::SandboxInfo {
            id: rec.id.clone(),
            created_at: sb.created_at,
            app_id: rec.app_id.clone(),
            tags: rec
                .tags
                .iter()
                .map(|(k, v)| proto::SandboxTag {
                    tag_name: k.clone(),
                    tag_value: v.clone(),
                })
                .collect(),
        });
    }
    Ok(Response::new(proto::SandboxListResponse { sandboxes: out }))
}

async fn run_sandbox(
    sb: Arc<Sandbox>,
    spec: container::Spec,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    timeout_secs: u32,
    kill: Option<(GenericStatus, Duration)>,
) {
    sb.rec.lock().unwrap().scheduled = true;
    sb.changed.send_modify(|v| *v += 1);
    let spawned = container::command(&spec, &args, &env).and_then(|mut cmd| {
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        container::spawn_retrying_busy(&mut cmd)
    });
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            sb.push(
                proto::FileDescriptor::Stderr as i32,
                format!("fake-modal: cannot start `{}`: {e}\n", args[0]),
            );
            sb.finish(GenericResult {
                status: GenericStatus::InitFailure as i32,
                exception: format!("cannot start the entrypoint: {e}"),
                ..Default::default()
            });
            return;
        }
    };
    *sb.pgid.lock().unwrap() = child.id().map(|p| p as i32);
    let pump = |r: Option<tokio::process::ChildStdout>,
                e: Option<tokio::process::ChildStderr>,
                sb: Arc<Sandbox>| async move {
        let fd_out = proto::FileDescriptor::Stdout as i32;
        let fd_err = proto::FileDescriptor::Stderr as i32;
        let a = async {
            if let Some(r) = r {
                read_lines(tokio::io::BufReader::new(r), fd_out, &sb).await;
            }
        };
        let b = async {
            if let Some(e) = e {
                read_lines(tokio::io::BufReader::new(e), fd_err, &sb).await;
            }
        };
        tokio::join!(a, b);
    };
    let io = tokio::spawn(pump(child.stdout.take(), child.stderr.take(), sb.clone()));
    if let Some((why, after)) = kill {
        let sb2 = sb.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if sb2.done().is_none() {
                sb2.kill(why);
            }
        });
    }
    let limit = if timeout_secs == 0 { 300 } else { timeout_secs };
    let status = match tokio::time::timeout(Duration::from_secs(u64::from(limit)), child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            sb.kill(GenericStatus::Timeout);
            child.wait().await.ok()
        }
    };
    let _ = io.await;
    let code = status.and_then(|s| {
        use std::os::unix::process::ExitStatusExt;
        s.code().or(s.signal().map(|g| 128 + g))
    });
    let killed = *sb.killed_as.lock().unwrap();
    let r = match killed {
        Some(why) => GenericResult {
            status: why as i32,
            exitcode: code.unwrap_or(137),
            exception: match why {
                GenericStatus::KernelOomKill => "Sandbox was killed by the kernel OOM killer".into(),
                GenericStatus::Timeout => "Sandbox timed out".into(),
                _ => "Sandbox was terminated".into(),
            },
            ..Default::default()
        },
        None if code == Some(0) => GenericResult {
            status: GenericStatus::Success as i32,
            ..Default::default()
        },
        None => GenericResult {
            status: GenericStatus::Failure as i32,
            exitcode: code.unwrap_or(-1),
            exception: format!("Sandbox exited with code {}", code.unwrap_or(-1)),
            ..Default::default()
        },
    };
    sb.finish(r);
}

async fn read_lines<R: tokio::io::AsyncBufRead + Unpin>(mut r: R, fd: i32, sb: &Sandbox) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => sb.push(fd, String::from_utf8_lossy(&buf).into_owned()),
        }
    }
}
