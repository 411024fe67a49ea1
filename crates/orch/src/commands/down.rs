use crate::cli::DownArgs;
use orch_backend::host::Flags;

pub async fn down(store: &orch_store::Store, args: DownArgs) -> anyhow::Result<i32> {
    let run = store.open_run(&args.run)?;
    let kind: orch_backend::Kind = run.meta.backend.parse()?;
    let host = crate::hosts::host(
        kind,
        Flags {
            context: args.context.clone(),
            namespace: args.namespace.clone(),
            ..Default::default()
        },
    );
    eprintln!("{}", host.down(run.id(), &run.plan).await?);
    Ok(0)
}
