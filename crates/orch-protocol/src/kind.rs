//! [`FailureKind`]: the named cause of a cell's failure, one type for every
//! writer and reader. The agent and the backends name a failure with one
//! ([`crate::Failure::kind`]), `orch-diagnose` names a cause found in the
//! logs with one (`orch_record::Diagnosis::kind`), and the host ranks them
//! (`orch_backend::lifecycle::judge`). A user's diagnosis rule may name a
//! kind of its own: [`FailureKind::Other`] keeps it.
//!
//! On the wire and in stored records a kind is its string ([`FailureKind::as_str`]),
//! exactly as before it was a type, so stored runs still read.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

macro_rules! kinds {
    (
        diagnosed { $( $(#[doc = $ddoc:literal])+ $dvariant:ident = $dtext:literal, )+ }
        ended { $( $(#[doc = $edoc:literal])+ $evariant:ident = $etext:literal, )+ }
    ) => {
        /// The named cause of a failure. Built-in kinds are variants; a kind a
        /// user rule adds is [`FailureKind::Other`]. Two kinds are equal when
        /// their strings are ([`FailureKind::as_str`]), and sort by them.
        #[derive(Debug, Clone)]
        pub enum FailureKind {
            $( $(#[doc = $ddoc])+ $dvariant, )+
            $( $(#[doc = $edoc])+ $evariant, )+
            /// A kind that is none of the above: one a user's diagnosis rule
            /// names, or one a newer agent wrote. Never holds a built-in
            /// kind's string when made by [`FromStr`] or read from JSON.
            Other(String),
        }

        impl FailureKind {
            /// Every built-in kind, in declaration order.
            pub const ALL: &'static [FailureKind] = &[$(FailureKind::$dvariant,)+ $(FailureKind::$evariant,)+];

            /// The kinds a diagnosis of a cell's logs names (`orch-diagnose`'s
            /// default rules and exit status; `orch_diagnose::KINDS`); some of
            /// them a backend also names a cell's end with.
            pub const DIAGNOSED: &'static [FailureKind] = &[$(FailureKind::$dvariant,)+];

            /// The string of the kind, as stored and sent.
            pub fn as_str(&self) -> &str {
                match self {
                    $(FailureKind::$dvariant => $dtext,)+
                    $(FailureKind::$evariant => $etext,)+
                    FailureKind::Other(s) => s,
                }
            }

            /// The built-in kind of exactly this string, if any.
            pub fn builtin(s: &str) -> Option<FailureKind> {
                match s {
                    $($dtext => Some(FailureKind::$dvariant),)+
                    $($etext => Some(FailureKind::$evariant),)+
                    _ => None,
                }
            }
        }
    };
}

kinds! {
    // Causes found in a workload's logs (`orch-diagnose`'s default rules and
    // a process's exit status).
    diagnosed {
        /// The GPU ran out of memory (a CUDA allocation failed, PyTorch's `OutOfMemoryError`).
        CudaOom = "cuda_oom",
        /// A server's KV cache cannot hold one sequence of the configured length.
        KvCacheInsufficient = "kv_cache_insufficient",
        /// The configured maximum model length is above what the model or memory allows.
        MaxModelLenTooLarge = "max_model_len_too_large",
        /// The GPU is held by another process (busy or exclusive mode).
        GpuBusy = "gpu_busy",
        /// The model's repository is gated: the Hub token has no access.
        GatedRepo = "gated_repo",
        /// The workload could not reach the network (the Hub, a download).
        NoNetwork = "no_network",
        /// The serving framework does not support the model's architecture.
        UnsupportedArchitecture = "unsupported_architecture",
        /// The installed `transformers` is too old for the model.
        TransformersTooOld = "transformers_too_old",
        /// The NVIDIA driver is older than the CUDA runtime needs.
        CudaDriverTooOld = "cuda_driver_too_old",
        /// No kernel image for the GPU's architecture was built in.
        NoKernelImage = "no_kernel_image",
        /// A compiled extension does not match the installed library (undefined symbol, ABI).
        BinaryAbiMismatch = "binary_abi_mismatch",
        /// NCCL could not use shared memory (`/dev/shm` too small).
        NcclShm = "nccl_shm",
        /// The tensor-parallel size does not divide the model (heads, GPUs).
        TpSizeInvalid = "tp_size_invalid",
        /// CUDA was initialised before a fork (a subprocess cannot re-initialise it).
        CudaFork = "cuda_fork",
        /// The server's port was already taken.
        PortInUse = "port_in_use",
        /// The kernel (or a memory cgroup) killed the process for host memory.
        HostOomKilled = "host_oom_killed",
        /// A server did not become ready in time.
        StartupTimeout = "startup_timeout",
        /// A variant's patch did not apply to the source.
        PatchDoesNotApply = "patch_does_not_apply",
        /// Slurm cannot satisfy the job's request (partition, GRES, nodes).
        SlurmUnsatisfiable = "slurm_unsatisfiable",
        /// Slurm killed the job for exceeding its memory limit.
        SlurmMemoryLimit = "slurm_memory_limit",
        /// Slurm killed the job at its time limit.
        SlurmTimeLimit = "slurm_time_limit",
        /// Slurm preempted the job.
        SlurmPreempted = "slurm_preempted",
        /// A node of the Slurm job failed.
        SlurmNodeFailure = "slurm_node_failure",
        /// The Slurm job stayed pending longer than allowed.
        SlurmPendingTooLong = "slurm_pending_too_long",
        /// A kernel accessed memory it must not (CUDA illegal memory access).
        IllegalMemoryAccess = "illegal_memory_access",
        /// The GPU reported a hardware fault (Xid, ECC, fallen off the bus).
        GpuHardwareFault = "gpu_hardware_fault",
        /// A collective failed in NCCL.
        NcclError = "nccl_error",
        /// A disk (or the cache's volume) is full.
        DiskFull = "disk_full",
        /// Building a kernel or extension failed (nvcc, Triton, ninja).
        KernelBuildFailed = "kernel_build_failed",
        /// A Triton kernel asked for more shared memory or registers than the GPU has.
        TritonResources = "triton_resources",
        /// The GPU or the kernels do not support the requested dtype.
        DtypeUnsupported = "dtype_unsupported",
        /// The model needs `trust_remote_code`.
        TrustRemoteCodeRequired = "trust_remote_code_required",
        /// The cell's image could not be built.
        ImageBuildFailed = "image_build_failed",
        /// No GPU of the requested kind was available.
        GpuUnavailable = "gpu_unavailable",
        /// The Modal sandbox was terminated.
        SandboxTerminated = "sandbox_terminated",
        /// No Kubernetes node can ever run the pod (its request fits none).
        Unschedulable = "unschedulable",
        /// The cell's image could not be pulled.
        ImagePullFailed = "image_pull_failed",
        /// The container could not be configured (a missing Secret, ConfigMap or volume).
        ContainerConfigError = "container_config_error",
        /// The agent could not be installed into the cell's container.
        AgentInstallFailed = "agent_install_failed",
        /// The agent itself crashed (a signal of its own, a panic).
        AgentCrashed = "agent_crashed",
        /// The pod was evicted by its node.
        Evicted = "evicted",
        /// The pod's node was lost.
        NodeLost = "node_lost",
        /// The pod stayed pending longer than allowed.
        PendingTooLong = "pending_too_long",
        /// The node rejected the pod (admission, resources at start).
        PodRejected = "pod_rejected",
        /// The model's memory estimate exceeds the GPU's memory.
        MemoryEstimateExceeded = "memory_estimate_exceeded",
        /// No rule matched: the cause is not known.
        Unknown = "unknown",
    }

    // How a cell ended, as the agent and the backends name it.
    ended {
        /// The workload exited with a non-zero code.
        ExitCode = "exit_code",
        /// The workload was killed by a signal.
        Signal = "signal",
        /// The work does not fit the device's memory: a size that does not fit
        /// (the cell's status is `oom`); also what a platform's OOM kill is named.
        Oom = "oom",
        /// The cell ran past its time limit.
        Timeout = "timeout",
        /// The cell was stopped by orch (a cancel).
        Cancelled = "cancelled",
        /// The workload's process could not be started.
        Spawn = "spawn",
        /// The workload failed (an error of a builtin workload).
        WorkloadError = "workload_error",
        /// The cell's task is not valid for its workload.
        InvalidConfig = "invalid_config",
        /// The agent could not read or write its own files.
        AgentIo = "agent_io",
        /// The agent panicked.
        AgentPanic = "agent_panic",
        /// The workload's metrics could not be read.
        BadMetrics = "bad_metrics",
        /// The files that travel with the cell could not be prepared or checked.
        FilesError = "files_error",
        /// A server exited before or while it was measured.
        ServerExited = "server_exited",
        /// The load generator failed.
        LoadgenFailed = "loadgen_failed",
        /// A comparison's variant failed.
        VariantFailed = "variant_failed",
        /// The host has fewer GPUs than the cell asks for.
        NotEnoughGpus = "not_enough_gpus",
        /// The backend failed to run the cell (its own error).
        Backend = "backend",
        /// The cell's model weights are not where the cell reads them.
        WeightsMissing = "weights_missing",
        /// The cell was stopped from outside orch (a drain, a deletion, a preemption).
        Disrupted = "disrupted",
        /// One rank of a multi-node cell failed.
        NodeRankFailed = "node_rank_failed",
        /// The agent's container ended without a result.
        AgentDied = "agent_died",
        /// The pod ended (phase `Failed`) without a result.
        PodFailed = "pod_failed",
        /// The pod disappeared before the agent sent a result.
        PodLost = "pod_lost",
        /// The cluster refused orch what it needs (RBAC).
        Forbidden = "forbidden",
        /// The platform's API could not be reached.
        ApiUnreachable = "api_unreachable",
        /// The cell names no image, or its image does not exist.
        NoImage = "no_image",
        /// The Modal sandbox failed.
        SandboxFailed = "sandbox_failed",
        /// The Modal sandbox failed to start.
        SandboxInitFailed = "sandbox_init_failed",
        /// The container could not be created.
        ContainerCreate = "container_create",
        /// The container could not be started.
        ContainerStart = "container_start",
        /// The container was killed from outside.
        ContainerKilled = "container_killed",
        /// The cell's folder could not be prepared.
        CellFolder = "cell_folder",
        /// The scheduler cannot satisfy the job's request.
        Unsatisfiable = "unsatisfiable",
        /// The job was preempted.
        Preempted = "preempted",
        /// A node of the job failed.
        NodeFailure = "node_failure",
        /// The job was cancelled from outside orch.
        CancelledOutside = "cancelled_outside",
        /// The scheduler could not be reached.
        SchedulerUnreachable = "scheduler_unreachable",
        /// The scheduler refused the job.
        Submit = "submit",
        /// The GPU is not the one the cell asked for, and strict hardware
        /// (`--strict-hardware`) refused to run the workload on it.
        HardwareMismatch = "hardware_mismatch",
        /// The cell was stopped, or not started, because the run's budget
        /// (`--max-cost`) would be passed.
        Budget = "budget",
    }
}

impl FailureKind {
    /// The kind of `s`: the built-in kind of exactly that string, else
    /// [`FailureKind::Other`] (a typo of a built-in kind stays `Other`).
    pub fn new(s: &str) -> FailureKind {
        FailureKind::builtin(s).unwrap_or_else(|| FailureKind::Other(s.to_string()))
    }

    /// The kind a cell ended by `status` is named with where nothing more
    /// is known: `oom`, `timeout`, `cancelled`, else the status's own word.
    pub fn of_status(status: crate::Status) -> FailureKind {
        match status {
            crate::Status::Oom => FailureKind::Oom,
            crate::Status::Timeout => FailureKind::Timeout,
            crate::Status::Cancelled => FailureKind::Cancelled,
            other => FailureKind::new(other.as_str()),
        }
    }

    /// Whether this is one of the built-in kinds (not [`FailureKind::Other`]).
    pub fn is_builtin(&self) -> bool {
        !matches!(self, FailureKind::Other(_))
    }
}

impl FromStr for FailureKind {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<FailureKind, Self::Err> {
        Ok(FailureKind::new(s))
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq for FailureKind {
    fn eq(&self, other: &FailureKind) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for FailureKind {}

impl std::hash::Hash for FailureKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl PartialOrd for FailureKind {
    fn partial_cmp(&self, other: &FailureKind) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for FailureKind {
    fn cmp(&self, other: &FailureKind) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Serialize for FailureKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FailureKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<FailureKind, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(FailureKind::new(&s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_string_and_json() {
        let mut seen = std::collections::BTreeSet::new();
        for k in FailureKind::ALL {
            assert!(seen.insert(k.as_str()), "`{k}` named twice");
            assert!(k.is_builtin());
            assert_eq!(k.as_str().parse::<FailureKind>().unwrap(), *k);
            assert_eq!(k.to_string(), k.as_str());
            let json = serde_json::to_string(k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            let back: FailureKind = serde_json::from_str(&json).unwrap();
            assert!(back.is_builtin());
            assert_eq!(back, *k);
        }
        assert_eq!(seen.len(), FailureKind::ALL.len());
    }

    #[test]
    fn an_unknown_kind_is_kept_and_a_typo_is_no_builtin() {
        let k: FailureKind = serde_json::from_str("\"my_rule_kind\"").unwrap();
        assert_eq!(k, FailureKind::Other("my_rule_kind".into()));
        assert_eq!(serde_json::to_string(&k).unwrap(), "\"my_rule_kind\"");
        for typo in ["cuda_oon", "CUDA_OOM", "cuda-oom", " cuda_oom", "oom ", "Oom", ""] {
            let k = FailureKind::new(typo);
            assert_eq!(k, FailureKind::Other(typo.to_string()), "{typo:?}");
            assert!(!k.is_builtin());
            assert!(FailureKind::ALL.iter().all(|b| *b != k), "{typo:?}");
        }
        // A status names the kind of the same word.
        for s in [
            crate::Status::Oom,
            crate::Status::Timeout,
            crate::Status::Cancelled,
            crate::Status::Failed,
        ] {
            assert_eq!(FailureKind::of_status(s).as_str(), s.as_str());
        }
        // A built-in string always reads as its variant.
        assert!(matches!(FailureKind::new("cuda_oom"), FailureKind::CudaOom));
    }

    #[test]
    fn kinds_sort_and_compare_by_their_strings() {
        let mut ks = [
            FailureKind::Timeout,
            FailureKind::Other("a_rule".into()),
            FailureKind::CudaOom,
        ];
        ks.sort();
        let names: Vec<&str> = ks.iter().map(|k| k.as_str()).collect();
        assert_eq!(names, ["a_rule", "cuda_oom", "timeout"]);
    }
}
