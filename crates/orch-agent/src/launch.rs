//! Which build of the agent runs in a container, chosen when it starts.
//!
//! The agent that containers get is one file with two builds in it:
//!
//! - the **static** agent (glibc linked in, `+crt-static`): it runs in any
//!   image of its architecture, one with no libc at all (`FROM scratch`,
//!   distroless static, busybox, musl images) included. A statically linked
//!   glibc must never `dlopen` a library of the image: the driver's
//!   `libnvidia-ml.so.1` (which the NVIDIA container toolkit injects into
//!   every GPU container) is linked against the image's own glibc, and loading
//!   it into a static binary kills the process (SIGFPE on Ubuntu 24.04,
//!   SIGSEGV or an assertion in Debian bullseye). So a static build never
//!   loads NVML: [`crate::gpu`] reads GPU identity from `nvidia-smi` or procfs
//!   instead.
//! - the **dynamic** agent, linked against glibc 2.17 the way manylinux2014
//!   wheels are (cargo-zigbuild, target `x86_64-unknown-linux-gnu.2.17`), so it
//!   runs on the image's own loader and glibc in every image with glibc 2.17 or
//!   newer (RHEL 7, Ubuntu 18.04 and later, Debian 10 and later, Amazon Linux,
//!   the CUDA, PyTorch, NGC and vLLM images) and loads NVML the way
//!   `nvidia-smi` does. `scripts/build-agent.sh` builds it first and embeds it
//!   in the static one (`ORCH_AGENT_EMBED` at build time).
//!
//! At `orch-agent run` the static agent looks for the image's dynamic loader.
//! When there is one, it writes the embedded agent into a memory file
//! (`memfd_create`: no writable folder needed), runs it once as `probe` (the
//! loader accepts it, the image's glibc version, and whether NVML loads: a
//! crash there is caught in a child, never in the cell's agent) and then
//! `exec`s it with the same arguments. Without a loader, or when the probe
//! fails, the static agent goes on itself and records why in
//! `info.agent.why_static`. `ORCH_AGENT_FLAVOR=static` (a suite's `env:`, or
//! the agent's environment) keeps the static agent.
//!
//! aarch64 (GH200) is the same design: the target `aarch64-unknown-linux-gnu.2.17`
//! for the dynamic build, `/lib/ld-linux-aarch64.so.1` as its loader; its
//! static build would be musl (zig cannot link glibc statically). Not built yet.

use serde_json::{json, Value};
use std::sync::OnceLock;

/// Environment variable: `static` keeps the static agent (no re-exec).
pub const FLAVOR_ENV: &str = "ORCH_AGENT_FLAVOR";
/// Environment variable the static agent hands to the dynamic one it starts
/// (what its probe found, as JSON); removed before any workload starts.
const HANDOFF_ENV: &str = "ORCH_AGENT_HANDOFF";

/// How this binary is linked.
pub const LINKAGE: &str = if cfg!(target_feature = "crt-static") {
    "static"
} else {
    "dynamic"
};

/// The dynamic agent embedded in a static build (empty when none was).
#[cfg(orch_embed_gnu)]
static EMBEDDED: &[u8] = include_bytes!(env!("ORCH_AGENT_EMBED_PATH"));
#[cfg(not(orch_embed_gnu))]
static EMBEDDED: &[u8] = &[];

/// The dynamic loader the embedded agent needs in the image.
#[cfg(target_arch = "x86_64")]
pub const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";
#[cfg(target_arch = "aarch64")]
pub const LOADER: &str = "/lib/ld-linux-aarch64.so.1";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const LOADER: &str = "/lib/ld-linux.so.2";

/// What is known of how this agent came to run (`info.agent` of the result).
static STATE: OnceLock<Value> = OnceLock::new();

/// Does this build carry the dynamic agent?
pub fn has_embedded() -> bool {
    !EMBEDDED.is_empty()
}

/// `info.agent`: linkage, the libc it runs on, why it is the static one.
pub fn info() -> Value {
    STATE
        .get()
        .cloned()
        .unwrap_or_else(|| json!({ "linkage": LINKAGE, "libc": libc_version() }))
}

/// Why NVML is not read by this process, when it is not (the static agent),
/// else `None`.
pub fn nvml_unavailable() -> Option<String> {
    if cfg!(target_feature = "crt-static") {
        let why = STATE
            .get()
            .and_then(|s| s["why_static"].as_str().map(String::from))
            .unwrap_or_else(|| "this is the static agent".into());
        return Some(format!(
            "NVML not loaded: {why}; a statically linked agent never loads the driver's library"
        ));
    }
    None
}

/// The NVML error the probe saw in a child process, when loading it there
/// crashed: the dynamic agent then does not load it either.
pub fn probe_nvml_crashed() -> Option<String> {
    STATE
        .get()
        .and_then(|s| s["probe"]["nvml_error"].as_str().map(String::from))
        .filter(|e| e.starts_with("loading NVML killed"))
}

/// The glibc this process runs on (`2.41`); `None` for a static build, whose
/// glibc is its own.
fn libc_version() -> Option<String> {
    if cfg!(target_feature = "crt-static") {
        return None;
    }
    // SAFETY: gnu_get_libc_version returns a pointer to a static,
    // NUL-terminated string of glibc.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        extern "C" {
            fn gnu_get_libc_version() -> *const libc::c_char;
        }
        let p = gnu_get_libc_version();
        if !p.is_null() {
            return Some(std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned());
        }
    }
    None
}

/// At the start of `orch-agent run`, before any thread: the static agent
/// becomes the dynamic one where the image allows (this call then does not
/// return); otherwise it records why it stays. The dynamic agent takes what
/// the static one handed over.
/// `flavor`: the task's own `ORCH_AGENT_FLAVOR` (a suite's `env:`), which
/// wins over the agent's environment.
pub fn choose(args: &[String], flavor: Option<&str>) {
    if !cfg!(target_feature = "crt-static") {
        let handoff = std::env::var(HANDOFF_ENV).ok();
        if handoff.is_some() {
            // SAFETY (edition 2021: safe fn): single-threaded here, before
            // the agent starts any thread; the workload must not inherit it.
            std::env::remove_var(HANDOFF_ENV);
        }
        let probe: Value = handoff
            .and_then(|h| serde_json::from_str(&h).ok())
            .unwrap_or(Value::Null);
        let mut v = json!({ "linkage": LINKAGE, "libc": libc_version() });
        if !probe.is_null() {
            v["started_by"] = json!("static agent");
            v["probe"] = probe;
        }
        let _ = STATE.set(v);
        return;
    }
    let why = match try_dynamic(args, flavor) {
        Ok(never) => match never {},
        Err(why) => why,
    };
    let _ = STATE.set(json!({ "linkage": LINKAGE, "why_static": why }));
}

enum Never {}

/// Exec the embedded dynamic agent, or say why not.
fn try_dynamic(args: &[String], flavor: Option<&str>) -> Result<Never, String> {
    let flavor = flavor
        .map(String::from)
        .or_else(|| std::env::var(FLAVOR_ENV).ok());
    if flavor.is_some_and(|v| v.trim() == "static") {
        return Err(format!("`{FLAVOR_ENV}=static`"));
    }
    if !has_embedded() {
        return Err("this agent was built without the dynamic agent inside".into());
    }
    if !std::path::Path::new(LOADER).exists() {
        return Err(format!("the image has no glibc dynamic loader (`{LOADER}`)"));
    }
    // Closed on every way out but the exec (a static agent that stays must
    // not keep the embedded binary in memory).
    let memfile = memfd()?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&memfile);
    let path = format!("/proc/self/fd/{fd}");
    // The probe: does the image's loader run it, and does NVML load? A crash
    // in the child costs nothing but this note.
    let out = run_probe(&path, PROBE_LIMIT)?;
    let how = {
        use std::os::unix::process::ExitStatusExt as _;
        match (out.status.code(), out.status.signal()) {
            (_, Some(s)) => orch_protocol::describe_signal(s),
            (Some(c), _) => format!("exit code {c}"),
            _ => "no status".into(),
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok());
    // First line: the loader ran it. Second: what NVML said.
    let Some(mut probe) = lines.next() else {
        let err = String::from_utf8_lossy(&out.stderr);
        let err = err.trim().lines().last().unwrap_or("").to_string();
        return Err(format!(
            "the dynamic agent did not run in this image ({how}){}",
            if err.is_empty() {
                String::new()
            } else {
                format!(": {err}")
            }
        ));
    };
    match lines.next() {
        Some(nvml) if out.status.success() => {
            if let Some(o) = nvml.as_object() {
                for (k, v) in o {
                    probe[k] = v.clone();
                }
            }
        }
        _ => {
            probe["nvml_error"] = json!(format!("loading NVML killed the probe ({how})"));
        }
    }
    let mut env: Vec<std::ffi::CString> = std::env::vars_os()
        .filter(|(k, _)| k != HANDOFF_ENV)
        .filter_map(|(k, v)| {
            use std::os::unix::ffi::OsStrExt as _;
            let mut b = k.as_bytes().to_vec();
            b.push(b'=');
            b.extend_from_slice(v.as_bytes());
            std::ffi::CString::new(b).ok()
        })
        .collect();
    // The dynamic agent knows its own linkage and libc: hand over NVML's part.
    if let Some(o) = probe.as_object_mut() {
        o.retain(|k, _| k.starts_with("nvml"));
    }
    if let Ok(h) = std::ffi::CString::new(format!("{HANDOFF_ENV}={probe}")) {
        env.push(h);
    }
    let mut argv: Vec<std::ffi::CString> = Vec::with_capacity(args.len() + 1);
    argv.push(c"orch-agent".to_owned());
    for a in args {
        argv.push(std::ffi::CString::new(a.as_str()).map_err(|e| e.to_string())?);
    }
    let argv_p: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let env_p: Vec<*const libc::c_char> = env
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    // SAFETY: fd is an open memfd holding an executable; argv and envp are
    // NUL-terminated arrays of pointers to NUL-terminated strings that live
    // until the call (which returns only on failure).
    unsafe {
        libc::fexecve(fd, argv_p.as_ptr(), env_p.as_ptr());
    }
    Err(format!(
        "exec of the dynamic agent failed: {}",
        std::io::Error::last_os_error()
    ))
}

/// How long the probe may take (NVML's init of eight GPUs without
/// persistence mode takes seconds; a hung driver never returns).
const PROBE_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Run `PATH probe`, killed after `limit`. Its output is read while it runs
/// (a chatty NVML or `LD_DEBUG` must not block it on a full pipe); a child
/// that does not die when killed (stuck in the driver) is left behind.
fn run_probe(path: &str, limit: std::time::Duration) -> Result<std::process::Output, String> {
    use std::io::Read as _;
    let mut child = std::process::Command::new(path)
        .arg("probe")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("the dynamic agent could not start: {e}"))?;
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
    );
    let status = match wait_until(&mut child, std::time::Instant::now() + limit) {
        Some(status) => status,
        None => {
            return Err(format!(
                "the dynamic agent's probe (NVML's init) did not end within {} s",
                limit.as_secs()
            ))
        }
    };
    Ok(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// Wait for `child` until `deadline`; then kill it and wait 2 s more. `None`
/// when it did not end by the deadline (a child stuck in the kernel that even
/// SIGKILL does not end yet is left to whoever reaps it).
pub(crate) fn wait_until(
    child: &mut std::process::Child,
    deadline: std::time::Instant,
) -> Option<std::process::ExitStatus> {
    let poll = std::time::Duration::from_millis(5);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(poll),
            _ => break,
        }
    }
    let _ = child.kill();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < give_up {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(poll);
    }
    None
}

/// The embedded agent in an executable memory file.
fn memfd() -> Result<std::os::fd::OwnedFd, String> {
    use std::os::fd::FromRawFd as _;
    // MFD_EXEC: executable even where `vm.memfd_noexec = 1` makes memfds
    // non-executable by default; kernels before 6.3 refuse the flag (EINVAL).
    // SAFETY: plain syscalls with a NUL-terminated name.
    let mut fd = unsafe { libc::memfd_create(c"orch-agent".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_EXEC) };
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // SAFETY: as above.
        fd = unsafe { libc::memfd_create(c"orch-agent".as_ptr(), libc::MFD_CLOEXEC) };
    }
    if fd < 0 {
        return Err(format!(
            "`memfd_create` failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut written = 0usize;
    while written < EMBEDDED.len() {
        let rest = &EMBEDDED[written..];
        // SAFETY: fd is ours; the buffer is valid for `rest.len()` bytes.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // SAFETY: fd is ours and closed once.
            unsafe { libc::close(fd) };
            return Err(format!("writing the dynamic agent to memory failed: {e}"));
        }
        written += n as usize;
    }
    // SAFETY: fd was just created and is owned by nothing else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// `orch-agent probe`: one JSON line of what this agent finds: its libc and
/// whether NVML loads (with the number of GPUs). Run by the static agent in a
/// child before it hands over.
pub fn probe() -> i32 {
    use std::io::Write as _;
    println!("{}", json!({ "linkage": LINKAGE, "libc": libc_version() }));
    // Out before NVML is touched: a crash there still leaves this line.
    let _ = std::io::stdout().flush();
    let v = match crate::gpu::probe_nvml() {
        Ok(n) => json!({ "nvml_gpus": n }),
        Err(e) => json!({ "nvml_error": e }),
    };
    println!("{v}");
    0
}

#[cfg(test)]
mod tests {
    #[test]
    fn info_names_the_linkage() {
        let v = super::info();
        assert_eq!(v["linkage"], super::LINKAGE);
    }
}
