//! The backends' host sides, registered: one line per backend.

use orch_backend::host::{Flags, Host, LocalHost};
use orch_backend::Kind;

/// The host side of backend `kind`, with the command's flags.
pub fn host(kind: Kind, flags: Flags) -> Box<dyn Host> {
    match kind {
        Kind::Local => Box::new(LocalHost { flags }),
        Kind::Docker => Box::new(orch_backend_docker::DockerHost { flags }),
        Kind::Kubernetes => Box::new(orch_backend_kubernetes::KubernetesHost { flags }),
        Kind::Modal => Box::new(orch_backend_modal::host::ModalHost { flags }),
        Kind::Slurm => Box::new(orch_backend_slurm::SlurmHost::new(flags)),
    }
}
