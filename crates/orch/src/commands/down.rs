use crate::cli::DownArgs;
use orch_backend::Backend;

pub async fn down(store: &orch_store::Store, args: DownArgs) -> anyhow::Result<i32> {
    let run = store.open_run(&args.run)?;
    match run.meta.backend.as_str() {
        "docker" => {
            // Removing containers needs no agent; any path will do.
            let backend = orch_backend::docker::DockerBackend::connect(std::path::PathBuf::new(), false)?;
            backend.cleanup(run.id()).await?;
            eprintln!("removed what run {} left on docker", run.id());
        }
        "modal" => {
            let modal = crate::commands::modal::connect()?;
            let backend = orch_backend_modal::ModalBackend::new(
                modal,
                std::path::PathBuf::new(),
                Default::default(),
                Default::default(),
            );
            backend.cleanup(run.id()).await?;
            eprintln!("terminated every sandbox of run {} on modal", run.id());
        }
        "kubernetes" => {
            let backend = crate::commands::kubernetes::backend(
                &run.plan,
                args.context.as_deref(),
                args.namespace.as_deref(),
            )
            .await?;
            backend.cleanup(run.id()).await?;
            eprintln!(
                "deleted every Job, pod and Secret of run {} in namespace {}",
                run.id(),
                backend.settings().namespace
            );
        }
        "slurm" => {
            let backend = orch_backend_slurm::SlurmBackend::for_cleanup();
            backend.cleanup(run.id()).await?;
            eprintln!("cancelled every slurm job of run {}", run.id());
        }
        other => eprintln!(
            "run {} used backend `{other}`: nothing outlives its cells there",
            run.id()
        ),
    }
    Ok(0)
}
