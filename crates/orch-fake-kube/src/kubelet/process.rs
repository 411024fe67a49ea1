//! Containers as processes: spawned in their image's root, their output
//! read, their memory watched, killed by process group.

use super::*;

pub(super) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid two-int array; pipe2 fills it on success.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub(crate) fn killpg(pgid: i32, sig: i32) {
    if pgid > 1 {
        // SAFETY: plain syscall; a negative pid names the process group.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

/// Every process of a container: its process group and every descendant
/// of its main process (a real container is a cgroup: processes that leave
/// the group, like a supervisor's workload in a group of its own, are still
/// in it). (pid, resident bytes) of each.
pub(super) fn container_procs(root: i32) -> Vec<(i32, u64)> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    // pid -> (ppid, pgid, rss)
    let mut all: BTreeMap<i32, (i32, i32, u64)> = BTreeMap::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(i) = stat.rfind(')') else { continue };
        let f: Vec<&str> = stat[i + 1..].split_whitespace().collect();
        let num = |k: usize| f.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        all.insert(pid, (num(1) as i32, num(2) as i32, num(21).max(0) as u64 * page));
    }
    let inside = |mut pid: i32| {
        for _ in 0..64 {
            if pid == root {
                return true;
            }
            match all.get(&pid) {
                Some((ppid, _, _)) if *ppid > 1 => pid = *ppid,
                _ => return false,
            }
        }
        false
    };
    all.iter()
        .filter(|(pid, (_, pgid, _))| *pgid == root || inside(**pid))
        .map(|(pid, (_, _, rss))| (*pid, *rss))
        .collect()
}

/// Resident memory of every process of a container.
pub(super) fn group_rss(root: i32) -> u64 {
    container_procs(root).iter().map(|(_, r)| r).sum()
}

/// Signal every process of a container.
pub(super) fn kill_container(root: i32, sig: i32) {
    let procs = container_procs(root);
    killpg(root, sig);
    for (pid, _) in procs {
        if pid > 1 {
            // SAFETY: plain syscall on a pid of this container.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }
}

pub(super) async fn run_container(
    ctx: &Ctx,
    init: bool,
    idx: usize,
    c: &Value,
    volumes: &BTreeMap<String, (PathBuf, bool)>,
    gpus: &[u32],
) -> Outcome {
    let cname = c["name"].as_str().unwrap_or_default().to_string();
    let image = c["image"].as_str().unwrap_or_default().to_string();
    let field = if init {
        format!("spec.initContainers{{{cname}}}")
    } else {
        format!("spec.containers{{{cname}}}")
    };
    let field = Some(field.as_str());
    let set = |f: &dyn Fn(&mut CStat)| {
        ctx.with(|m| {
            let list = if init { &mut m.init } else { &mut m.main };
            if let Some(s) = list.get_mut(idx) {
                f(s);
            }
        })
    };
    let waiting = |reason: &str, message: Option<&str>| {
        let mut w = json!({"reason": reason});
        if let Some(m) = message {
            w["message"] = json!(m);
        }
        set(&|s| s.state = json!({ "waiting": w.clone() }));
    };
    if ctx.stopping() {
        return Outcome::Stopped;
    }
    let image_root = match check_image(&ctx.inner, &image) {
        ImageCheck::Invalid(msg) => {
            waiting("InvalidImageName", Some(&msg));
            ctx.event(field, "Warning", "InspectFailed", &msg, "kubelet");
            ctx.event(field, "Warning", "Failed", "Error: InvalidImageName", "kubelet");
            ctx.wait_stop().await;
            return Outcome::Stopped;
        }
        ImageCheck::Unknown(full) => {
            ctx.event(
                field,
                "Normal",
                "Pulling",
                &format!("Pulling image \"{image}\""),
                "kubelet",
            );
            let msg = format!(
                "rpc error: code = NotFound desc = failed to pull and unpack image \"{full}\": failed to resolve reference \"{full}\": {full}: not found"
            );
            waiting("ErrImagePull", Some(&msg));
            ctx.event(
                field,
                "Warning",
                "Failed",
                &format!("Failed to pull image \"{image}\": {msg}"),
                "kubelet",
            );
            ctx.event(field, "Warning", "Failed", "Error: ErrImagePull", "kubelet");
            if ctx.sleep_or_stop(Duration::from_secs(1)).await {
                return Outcome::Stopped;
            }
            let back = format!("Back-off pulling image \"{image}\"");
            waiting("ImagePullBackOff", Some(&back));
            ctx.event(field, "Normal", "BackOff", &back, "kubelet");
            ctx.event(field, "Warning", "Failed", "Error: ImagePullBackOff", "kubelet");
            ctx.wait_stop().await;
            return Outcome::Stopped;
        }
        ImageCheck::Known(root) => {
            ctx.event(
                field,
                "Normal",
                "Pulled",
                &format!("Container image \"{image}\" already present on machine"),
                "kubelet",
            );
            root
        }
    };
    let env = loop {
        match resolve_env(&ctx.inner, &ctx.pod, c) {
            Ok(env) => break env,
            Err(msg) => {
                waiting("CreateContainerConfigError", Some(&msg));
                ctx.event(field, "Warning", "Failed", &format!("Error: {msg}"), "kubelet");
                if ctx.sleep_or_stop(Duration::from_secs(1)).await {
                    return Outcome::Stopped;
                }
            }
        }
    };
    // The container: its image's root, a writable layer of its own, the termination message
    // file and the volume mounts.
    let cdir = ctx.dir.join("containers").join(&cname);
    let term = cdir.join("termination-log");
    let _ = std::fs::create_dir_all(&cdir);
    let _ = std::fs::write(&term, b"");
    let term_path = c["terminationMessagePath"]
        .as_str()
        .unwrap_or("/dev/termination-log")
        .to_string();
    let mut mounts = vec![container::Mount {
        host: term.clone(),
        target: term_path,
        read_only: false,
    }];
    // The kubelet-managed hosts file, unless a volume is mounted there.
    let hosts = hosts_path(ctx);
    let own_hosts = arr(&c["volumeMounts"])
        .iter()
        .any(|vm| vm["mountPath"] == json!("/etc/hosts"));
    if hosts.is_file() && !own_hosts {
        mounts.push(container::Mount {
            host: hosts,
            target: "/etc/hosts".into(),
            read_only: false,
        });
    }
    for vm in arr(&c["volumeMounts"]) {
        let (Some(name), Some(target)) = (vm["name"].as_str(), vm["mountPath"].as_str()) else {
            continue;
        };
        let Some((host, vol_ro)) = volumes.get(name) else {
            continue;
        };
        let host = match vm["subPath"].as_str().filter(|s| !s.is_empty()) {
            Some(sp) if !sp.split('/').any(|p| p == "..") && !sp.starts_with('/') => {
                let p = host.join(sp);
                // The kubelet makes a missing subPath as a folder.
                if !p.exists() {
                    let _ = std::fs::create_dir_all(&p);
                }
                p
            }
            Some(_) => continue,
            None => host.clone(),
        };
        mounts.push(container::Mount {
            host,
            target: target.to_string(),
            read_only: *vol_ro || vm["readOnly"] == json!(true),
        });
    }
    let gpu = match (&ctx.inner.nvml, gpus.is_empty()) {
        (Some(lib), false) => Some(container::Gpu {
            nvml_lib: lib.clone(),
            visible_devices: gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        }),
        _ => None,
    };
    let spec = container::Spec {
        root: image_root,
        mounts,
        gpu,
        workdir: c["workingDir"].as_str().unwrap_or("/").to_string(),
        layer: Some(cdir.join("layer")),
    };
    let argv: Vec<String> = arr(&c["command"])
        .iter()
        .chain(arr(&c["args"]))
        .filter_map(Value::as_str)
        .map(|a| expand(a, &env))
        .collect();
    let log = Arc::new(LogBuf::new());
    lock(&ctx.rt.logs).insert(cname.clone(), log.clone());
    let started_at = now();
    let id = format!("containerd://{}", hex(64));
    let image_id = format!(
        "{}@sha256:{:x}",
        normalize_image(&image)
            .split([':', '@'])
            .next()
            .unwrap_or_default(),
        sha2::Sha256::digest(image.as_bytes())
    );
    let spawned = spawn(ctx, &spec, &argv, &env);
    let (mut child, reader) = match spawned {
        Ok(x) => x,
        Err(msg) => {
            log.finish();
            let message = format!(
                "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: {msg}: unknown"
            );
            let t = now();
            set(&|s| {
                s.id = Some(id.clone());
                s.image_id = image_id.clone();
                s.state = json!({"terminated": {"exitCode": 128, "reason": "StartError", "message": message, "startedAt": "1970-01-01T00:00:00Z", "finishedAt": t, "containerID": id}});
            });
            ctx.event(
                field,
                "Normal",
                "Created",
                &format!("Created container: {cname}"),
                "kubelet",
            );
            ctx.event(
                field,
                "Warning",
                "Failed",
                &format!("Error: {message}"),
                "kubelet",
            );
            return Outcome::Exited(128);
        }
    };
    let pid = child.id().map_or(0, |p| p as i32);
    lock(&ctx.rt.pgids).insert(cname.clone(), pid);
    lock(&ctx.inner.pgids).insert(pid);
    let reader = tokio::spawn(read_into(reader, log.clone()));
    ctx.event(
        field,
        "Normal",
        "Created",
        &format!("Created container: {cname}"),
        "kubelet",
    );
    ctx.event(
        field,
        "Normal",
        "Started",
        &format!("Started container {cname}"),
        "kubelet",
    );
    ctx.with(|m| {
        let list = if init { &mut m.init } else { &mut m.main };
        if let Some(s) = list.get_mut(idx) {
            s.state = json!({"running": {"startedAt": started_at}});
            s.started = true;
            s.ready = !init;
            s.id = Some(id.clone());
            s.image_id = image_id.clone();
        }
        if !init {
            m.phase = "Running";
            if m.main.iter().all(|s| s.ready) {
                m.cond("Ready", true, None, None);
                m.cond("ContainersReady", true, None, None);
            }
        }
    });
    let mem_limit = quantity_of(&c["resources"]["limits"]["memory"]).map(|q| q as u64);
    let mut stop_rx = ctx.rt.stop.subscribe();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut termed = false;
    let mut kill_at: Option<Instant> = None;
    let mut oom = false;
    let status = loop {
        if let Some(s) = stop_rx.borrow_and_update().clone() {
            if s.kill_now {
                killpg(pid, libc::SIGKILL);
            } else {
                let grace = s.grace.unwrap_or(Duration::from_secs(30));
                if !termed {
                    termed = true;
                    ctx.event(
                        field,
                        "Normal",
                        "Killing",
                        &format!("Stopping container {cname}"),
                        "kubelet",
                    );
                    killpg(pid, libc::SIGTERM);
                }
                let at = Instant::now() + grace;
                kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
            }
        }
        tokio::select! {
            st = child.wait() => break st.ok(),
            r = stop_rx.changed() => { if r.is_err() { tokio::time::sleep(Duration::from_millis(50)).await; } }
            _ = tick.tick() => {
                if kill_at.is_some_and(|k| Instant::now() >= k) {
                    kill_container(pid, libc::SIGKILL);
                }
                if let Some(limit) = mem_limit {
                    if !oom && group_rss(pid) > limit {
                        oom = true;
                        kill_container(pid, libc::SIGKILL);
                    }
                }
            }
        }
    };
    // The container is gone: so is everything else in it.
    kill_container(pid, libc::SIGKILL);
    lock(&ctx.rt.pgids).remove(&cname);
    lock(&ctx.inner.pgids).remove(&pid);
    let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
    log.finish();
    let code = status.map_or(137, |s| {
        use std::os::unix::process::ExitStatusExt as _;
        s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
    });
    let code = if oom { 137 } else { code };
    let reason = if oom {
        "OOMKilled"
    } else if code == 0 {
        "Completed"
    } else {
        "Error"
    };
    let mut message = std::fs::read(&term).unwrap_or_default();
    message.truncate(4096);
    let mut message = String::from_utf8_lossy(&message).into_owned();
    if message.is_empty() && code != 0 && c["terminationMessagePolicy"] == json!("FallbackToLogsOnError") {
        let d = lock(&log.data);
        let from = d.start(Some(80), None).max(d.bytes.len().saturating_sub(2048));
        message = String::from_utf8_lossy(&d.bytes[from..]).into_owned();
    }
    let mut t = json!({"exitCode": code, "reason": reason, "startedAt": started_at, "finishedAt": now(), "containerID": id});
    if !message.is_empty() {
        t["message"] = json!(message);
    }
    ctx.with(|m| {
        let list = if init { &mut m.init } else { &mut m.main };
        if let Some(s) = list.get_mut(idx) {
            s.state = json!({ "terminated": t.clone() });
            s.ready = init && code == 0;
            s.started = false;
        }
        if !init {
            m.cond("Ready", false, Some("ContainersNotReady"), None);
            m.cond("ContainersReady", false, Some("ContainersNotReady"), None);
        }
    });
    Outcome::Exited(code)
}

pub(super) fn spawn(
    ctx: &Ctx,
    spec: &container::Spec,
    argv: &[String],
    env: &BTreeMap<String, String>,
) -> Result<(tokio::process::Child, OwnedFd), String> {
    if ctx.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
        return Err("the fake is shutting down".to_string());
    }
    let Some(prog) = argv.first() else {
        return Err("no command specified".to_string());
    };
    let mut env = env.clone();
    env.insert("HOSTNAME".into(), hostname(&ctx.pod));
    env.insert("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into());
    env.insert("KUBERNETES_SERVICE_PORT".into(), ctx.inner.port.to_string());
    let (r, w) = pipe().map_err(|e| format!("pipe: {e}"))?;
    let w2 = w.try_clone().map_err(|e| format!("pipe: {e}"))?;
    let mut cmd = container::command(spec, argv, &env).map_err(|e| e.to_string())?;
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(w))
        .stderr(std::process::Stdio::from(w2))
        .process_group(0)
        .kill_on_drop(true);
    let spawned = container::spawn_retrying_busy(&mut cmd);
    // Our copies of the write end close with `cmd`, so the reader sees EOF when the group is gone.
    drop(cmd);
    let child = spawned.map_err(|e| {
        // What the setup wrote before it failed (which mount, which folder).
        let said = drain(&r);
        let said = said.trim();
        if e.kind() == std::io::ErrorKind::NotFound && said.is_empty() {
            format!("exec: \"{prog}\": executable file not found in $PATH")
        } else if said.is_empty() {
            format!("exec: \"{prog}\": {e}")
        } else {
            format!("{said}: {e}")
        }
    })?;
    Ok((child, r))
}

/// Whatever is waiting in a pipe whose writers are gone (non-blocking).
pub(super) fn drain(fd: &OwnedFd) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: read(2) into a stack buffer of the given length, on a descriptor we own.
        let n = unsafe {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
            libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
        };
        if n <= 0 || out.len() > 64 * 1024 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) async fn read_into(fd: OwnedFd, log: Arc<LogBuf>) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return;
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => log.push(&buf[..n]),
        }
    }
}
