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
        other => eprintln!(
            "run {} used backend `{other}`: nothing outlives its cells there",
            run.id()
        ),
    }
    Ok(0)
}
