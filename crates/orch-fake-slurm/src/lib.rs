//! A real Slurm cluster for tests, started from scratch in a temporary
//! folder: `munged` with its own key and socket, `slurmctld` and one `slurmd`
//! per node (`orchnode1`, `orchnode2`, ... all on this machine, each on its
//! own port) in the foreground, a generated `slurm.conf` and `gres.conf`
//! declaring `gpu:h100:8` per node backed by placeholder device files.
//!
//! The configuration needs no cgroups (containers rarely delegate them):
//! `proctrack/linuxproc`, `task/none`, `select/cons_tres` with cores and
//! memory as consumable resources, and `jobacct_gather/linux` with
//! `OverMemoryKill`, which kills a step over its `--mem`.
//!
//! With [`SlurmCluster::start_with_submit_limit`], accounting too: a
//! MariaDB server of its own (`mariadb-install-db` into the folder, its own
//! socket and port, no grant tables) under `slurmdbd`, the cluster
//! registered with `sacctmgr`, `AccountingStorageEnforce=limits` and the
//! current user's association limited to `MaxSubmitJobs=N`, so `sbatch`
//! refuses a job past N (`AssocMaxSubmitJobLimit`) as a real site's does;
//! and partition [`CAPPED_PARTITION`], whose partition QOS allows N-1 per
//! user (`QOSMaxSubmitJobPerUserLimit`).
//!
//! Needs Debian's `slurm-wlm` and `munge` and root (slurmd runs jobs as
//! their users); accounting also `slurmdbd` and `mariadb-server`. [`SlurmCluster::start`] says why when it cannot start; the
//! cluster stops, every job cancelled, when the value is dropped.
//!
//! Not shared: the crate has no dependency (no async runtime, no other fake); it fakes nothing
//! of Slurm but the hardware (placeholder GPU device files), and shares the machine it runs on:
//! every node is this host. The `slurm-cluster` binary runs a command against it for scripts
//! (`scripts/bench-slurm.sh`).
//!
//! ```no_run
//! let cluster = orch_fake_slurm::SlurmCluster::start().unwrap();
//! let status = std::process::Command::new("sinfo").envs(cluster.env()).status().unwrap();
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// GPUs of the test node (`gpu:h100:8`).
pub const GPUS: u32 = 8;
/// The first node's name, and the partition of every node.
pub const NODE: &str = "orchnode1";
pub const PARTITION: &str = "gpu";
/// With accounting, a second partition of the same nodes whose partition
/// QOS (of the same name) allows one job fewer per user than the
/// association: a limit that `sbatch` enforces and a reader of the user's
/// association and QOS does not see.
pub const CAPPED_PARTITION: &str = "capped";

pub struct SlurmCluster {
    dir: tempfile_dir::Dir,
    children: Vec<Child>,
    conf: PathBuf,
    nodes: u32,
    /// With accounting: the association's `MaxSubmitJobs`.
    max_submit: Option<u32>,
}

/// Name of node `i` (from 1).
pub fn node_name(i: u32) -> String {
    format!("orchnode{i}")
}

/// A temp folder removed on drop (no dependency on `tempfile` here).
mod tempfile_dir {
    use std::path::{Path, PathBuf};

    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new(prefix: &str) -> std::io::Result<Dir> {
            let base = std::env::temp_dir();
            for n in 0..1000u32 {
                let p = base.join(format!("{prefix}-{}-{n}", std::process::id()));
                match std::fs::create_dir(&p) {
                    Ok(()) => return Ok(Dir(p)),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(e),
                }
            }
            Err(std::io::Error::other("no free temp folder name"))
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Why a cluster cannot start here, if it cannot (missing programs, not root).
pub fn unavailable() -> Option<String> {
    let missing: Vec<&str> = [
        "munged",
        "slurmctld",
        "slurmd",
        "sbatch",
        "squeue",
        "scancel",
        "scontrol",
    ]
    .into_iter()
    .filter(|p| which(p).is_none())
    .collect();
    if !missing.is_empty() {
        return Some(format!(
            "missing {} (Debian: `apt-get install slurm-wlm munge`)",
            missing.join(", ")
        ));
    }
    if !is_root() {
        return Some("the test cluster's slurmd must run as root".into());
    }
    None
}

/// Why a cluster with accounting cannot start here, if it cannot.
pub fn unavailable_accounting() -> Option<String> {
    if let Some(why) = unavailable() {
        return Some(why);
    }
    let missing: Vec<&str> = ["slurmdbd", "sacctmgr", "mariadbd", "mariadb-install-db"]
        .into_iter()
        .filter(|p| which(p).is_none())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "missing {} (Debian: `apt-get install slurmdbd mariadb-server`)",
            missing.join(", ")
        )
    })
}

impl SlurmCluster {
    /// A one-node cluster: munged, slurmctld and slurmd, once the node is idle.
    pub fn start() -> Result<SlurmCluster, String> {
        SlurmCluster::start_nodes(1)
    }

    /// A cluster of `nodes` nodes (one slurmd each), once every node is idle.
    pub fn start_nodes(nodes: u32) -> Result<SlurmCluster, String> {
        SlurmCluster::start_full(nodes, None)
    }

    /// A one-node cluster with accounting (MariaDB, slurmdbd) whose user
    /// may have at most `max_submit` jobs queued or running: `sbatch`
    /// refuses the next with `AssocMaxSubmitJobLimit`.
    pub fn start_with_submit_limit(max_submit: u32) -> Result<SlurmCluster, String> {
        SlurmCluster::start_full(1, Some(max_submit))
    }

    fn start_full(nodes: u32, max_submit: Option<u32>) -> Result<SlurmCluster, String> {
        let why = match max_submit {
            Some(_) => unavailable_accounting(),
            None => unavailable(),
        };
        if let Some(why) = why {
            return Err(why);
        }
        let dir = tempfile_dir::Dir::new("orch-slurm").map_err(|e| format!("temp folder: {e}"))?;
        let root = dir.path().to_path_buf();
        let conf = root.join("slurm.conf");
        let mut cluster = SlurmCluster {
            dir,
            children: Vec::new(),
            conf: conf.clone(),
            nodes: nodes.max(1),
            max_submit,
        };
        cluster
            .configure()
            .map_err(|e| format!("cannot write the configuration: {e}"))?;
        let p = |n: &str| root.join(n).to_string_lossy().into_owned();
        let munged = which("munged").ok_or("no munged")?;
        cluster.spawn(
            &munged,
            &[
                "--foreground".into(),
                "--force".into(),
                format!("--socket={}", p("munge.sock")),
                format!("--key-file={}", p("munge.key")),
                format!("--log-file={}", p("munged.log")),
                format!("--pid-file={}", p("munged.pid")),
                format!("--seed-file={}", p("munged.seed")),
            ],
            "munged.out",
        )?;
        wait_for(Duration::from_secs(10), || root.join("munge.sock").exists())
            .map_err(|_| format!("munged did not start: {}", read(&root.join("munged.log"))))?;
        if let Some(n) = max_submit {
            cluster.start_accounting(n)?;
        }
        let slurmctld = which("slurmctld").ok_or("no slurmctld")?;
        cluster.spawn(&slurmctld, &["-D".into(), "-i".into()], "slurmctld.out")?;
        let slurmd = which("slurmd").ok_or("no slurmd")?;
        for i in 1..=cluster.nodes {
            let name = node_name(i);
            cluster.spawn(
                &slurmd,
                &["-D".into(), "-N".into(), name.clone()],
                &format!("slurmd-{name}.out"),
            )?;
        }
        let env = cluster.env();
        let idle = wait_for(Duration::from_secs(60), || {
            Command::new("sinfo")
                // One line per node of the partition of every node.
                .args(["-h", "-N", "-p", PARTITION, "-o", "%t"])
                .envs(env.clone())
                .stderr(Stdio::null())
                .output()
                .map(|o| {
                    let states = String::from_utf8_lossy(&o.stdout);
                    let states: Vec<&str> = states.split_whitespace().collect();
                    states.len() == cluster.nodes as usize && states.iter().all(|s| *s == "idle")
                })
                .unwrap_or(false)
        });
        if idle.is_err() {
            return Err(format!("the nodes did not become idle\n{}", cluster.logs()));
        }
        Ok(cluster)
    }

    fn configure(&self) -> std::io::Result<()> {
        let root = self.dir.path();
        for d in ["state", "dev"] {
            std::fs::create_dir_all(root.join(d))?;
        }
        // Placeholder GPU device files for the GRES.
        for n in 1..=self.nodes {
            std::fs::create_dir_all(root.join(format!("dev/{}", node_name(n))))?;
            for i in 0..GPUS {
                std::fs::write(root.join(format!("dev/{}/nvidia{i}", node_name(n))), b"")?;
            }
        }
        let key: Vec<u8> = (0..1024u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8 ^ (std::process::id() as u8))
            .collect();
        let key_path = root.join("munge.key");
        std::fs::write(&key_path, key)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600))?;
            std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))?;
        }
        let host = Command::new("hostname")
            .arg("-s")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        let (ctld, slurmd) = (free_port()?, free_port()?);
        let r = root.display();
        let accounting = match self.max_submit {
            None => "AccountingStorageType=accounting_storage/none\n".to_string(),
            Some(_) => {
                let (db, dbd) = (free_port()?, free_port()?);
                let dbd_conf = format!(
                    "AuthType=auth/munge
AuthInfo=socket={r}/munge.sock
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd}
SlurmUser=root
PidFile={r}/slurmdbd.pid
LogFile={r}/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db}
StorageUser=root
StorageLoc=orch_acct
"
                );
                // slurmdbd reads it beside `slurm.conf` and refuses one others can read.
                let p = root.join("slurmdbd.conf");
                std::fs::write(&p, dbd_conf)?;
                {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
                }
                std::fs::write(root.join("mariadb.port"), db.to_string())?;
                // `AccountingStoragePass`: the munge socket for slurmdbd's connections.
                format!(
                    "AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={dbd}
AccountingStoragePass={r}/munge.sock
AccountingStorageEnforce=associations,limits,qos
"
                )
            }
        };
        let mut nodes = String::new();
        let mut gres = String::from("AutoDetect=off\n");
        for n in 1..=self.nodes {
            let name = node_name(n);
            nodes.push_str(&format!(
                "NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={} CPUs=16 RealMemory=16000 Gres=gpu:h100:{GPUS} State=UNKNOWN\n",
                free_port()?
            ));
            gres.push_str(&format!(
                "NodeName={name} Name=gpu Type=h100 File={}/dev/{name}/nvidia[0-{}]\n",
                root.display(),
                GPUS - 1
            ));
        }
        let names: Vec<String> = (1..=self.nodes).map(node_name).collect();
        let conf = format!(
            "ClusterName=orchtest{pid}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r}/munge.sock
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=1
JobAcctGatherParams=OverMemoryKill
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
{accounting}JobCompType=jobcomp/none
MinJobAge=300
DefMemPerCPU=1000
KillWait=3
MessageTimeout=10
SlurmdParameters=config_overrides
PlugStackConfig=/dev/null
{nodes}PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP
{capped}",
            names = names.join(","),
            capped = match self.max_submit {
                Some(_) => format!(
                    "PartitionName={CAPPED_PARTITION} Nodes={} QOS={CAPPED_PARTITION} MaxTime=INFINITE State=UP\n",
                    names.join(",")
                ),
                None => String::new(),
            },
            pid = std::process::id(),
        );
        std::fs::write(&self.conf, conf)?;
        std::fs::write(root.join("gres.conf"), gres)?;
        Ok(())
    }

    /// MariaDB in the folder, slurmdbd on it, the cluster registered and
    /// the user's associations limited to `max_submit` jobs.
    fn start_accounting(&mut self, max_submit: u32) -> Result<(), String> {
        let root = self.dir.path().to_path_buf();
        let p = |n: &str| root.join(n).to_string_lossy().into_owned();
        let port = read(&root.join("mariadb.port"));
        let install = Command::new(which("mariadb-install-db").ok_or("no mariadb-install-db")?)
            .args([
                "--no-defaults".to_string(),
                format!("--datadir={}", p("db")),
                "--user=root".into(),
                "--auth-root-authentication-method=normal".into(),
                "--skip-test-db".into(),
            ])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run `mariadb-install-db`: {e}"))?;
        if !install.status.success() {
            return Err(format!(
                "`mariadb-install-db` failed: {}",
                String::from_utf8_lossy(&install.stderr)
            ));
        }
        // No grant tables: slurmdbd connects as root without a password.
        let mariadbd = which("mariadbd").ok_or("no mariadbd")?;
        self.spawn(
            &mariadbd,
            &[
                "--no-defaults".into(),
                format!("--datadir={}", p("db")),
                format!("--socket={}", p("mariadb.sock")),
                format!("--port={port}"),
                "--bind-address=127.0.0.1".into(),
                "--user=root".into(),
                "--skip-grant-tables".into(),
                "--skip-log-bin".into(),
                "--innodb-buffer-pool-size=32M".into(),
                format!("--pid-file={}", p("mariadb.pid")),
                format!("--log-error={}", p("mariadb.log")),
            ],
            "mariadb.out",
        )?;
        wait_for(Duration::from_secs(60), || {
            std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_ok()
        })
        .map_err(|_| {
            format!(
                "mariadbd did not start: {}",
                tail(&read(&root.join("mariadb.log")), 20)
            )
        })?;
        let slurmdbd = which("slurmdbd").ok_or("no slurmdbd")?;
        self.spawn(&slurmdbd, &["-D".into()], "slurmdbd.out")?;
        let sacctmgr = |args: &[&str]| {
            Command::new("sacctmgr")
                .args(args)
                .envs(self.env())
                .stdin(Stdio::null())
                .output()
        };
        wait_for(Duration::from_secs(60), || {
            sacctmgr(&["-n", "-P", "show", "cluster"]).is_ok_and(|o| o.status.success())
        })
        .map_err(|_| {
            format!(
                "slurmdbd did not start: {}",
                tail(&read(&root.join("slurmdbd.log")), 20)
            )
        })?;
        let cluster = format!("orchtest{}", std::process::id());
        let limit = format!("MaxSubmitJobs={max_submit}");
        let capped = format!("MaxSubmitJobsPerUser={}", max_submit.saturating_sub(1).max(1));
        for args in [
            vec!["-i", "add", "cluster", cluster.as_str()],
            // The cluster's `root` association holds the user root.
            vec![
                "-i",
                "modify",
                "user",
                "where",
                "name=root",
                "set",
                limit.as_str(),
            ],
            vec!["-i", "add", "qos", CAPPED_PARTITION, capped.as_str()],
        ] {
            let out = sacctmgr(&args).map_err(|e| format!("cannot run `sacctmgr`: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "`sacctmgr {}` failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        Ok(())
    }

    fn spawn(&mut self, program: &Path, args: &[String], out: &str) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join(out)).map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(program)
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start `{}`: {e}", program.display()))?;
        self.children.push(child);
        Ok(())
    }

    /// The environment Slurm's commands need to reach this cluster.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![("SLURM_CONF".into(), self.conf.to_string_lossy().into_owned())]
    }

    /// The cluster's folder (configuration, daemon logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Job ids the queue lists (pending, running or completing).
    pub fn queued_jobs(&self) -> Vec<String> {
        Command::new("squeue")
            .args(["-h", "-o", "%i"])
            .envs(self.env())
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(|l| l.trim().to_string())
                    .filter(|l| !l.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `scontrol show job -o ID`, for assertions.
    pub fn show_job(&self, id: &str) -> String {
        Command::new("scontrol")
            .args(["show", "job", "-o", id])
            .envs(self.env())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The daemons' logs, for a failing test's message.
    pub fn logs(&self) -> String {
        let r = self.dir.path();
        let mut s = format!("slurmctld.log:\n{}", tail(&read(&r.join("slurmctld.log")), 30));
        if self.max_submit.is_some() {
            s.push_str(&format!(
                "\nslurmdbd.log:\n{}",
                tail(&read(&r.join("slurmdbd.log")), 30)
            ));
        }
        for n in 1..=self.nodes {
            let name = node_name(n);
            s.push_str(&format!(
                "\nslurmd-{name}.log:\n{}",
                tail(&read(&r.join(format!("slurmd-{name}.log"))), 30)
            ));
        }
        s
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        // Jobs first (their processes are slurmstepd's, not ours), then the daemons.
        let env = self.env();
        let _ = Command::new("scancel")
            .args(["--full", "-p", PARTITION])
            .envs(env)
            .stderr(Stdio::null())
            .status();
        let _ = wait_for(Duration::from_secs(15), || self.queued_jobs().is_empty());
        for child in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn wait_for(limit: Duration, mut ok: impl FnMut() -> bool) -> Result<(), ()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(())
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
