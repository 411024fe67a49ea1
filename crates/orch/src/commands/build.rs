use crate::cli::BuildArgs;
use crate::error::user;
use orch_images::ImageSpec;
use orch_manifest::ExpandOptions;
use std::collections::BTreeMap;
use std::time::Instant;

/// The agent image's Dockerfile: the static agent alone, run as
/// `/orch-agent install DEST` by the kubernetes backend's init container.
/// A numeric non-root `USER`, so that `runAsNonRoot` (Pod Security
/// `restricted`) admits it without a fixed `runAsUser` (which OpenShift's
/// restricted SCC would refuse; there the namespace's UID replaces it).
const AGENT_DOCKERFILE: &str = "FROM scratch\nCOPY orch-agent /orch-agent\nUSER 65532:65532\nENTRYPOINT [\"/orch-agent\"]\nCMD [\"version\"]\n";

/// `orch build --agent [--push REGISTRY]`.
async fn build_agent(docker: &bollard::Docker, push: Option<&str>) -> anyhow::Result<i32> {
    let agent = orch_backend::find_static_agent()?;
    let context = tempfile_dir()?;
    std::fs::copy(&agent, context.join("orch-agent"))
        .map_err(|e| anyhow::anyhow!("cannot copy the static agent `{}`: {e}", agent.display()))?;
    // The static `orch` too, when there is one (`orch setup --backend
    // kubernetes` runs it in the cluster).
    let mut dockerfile = AGENT_DOCKERFILE.to_string();
    match orch_backend::find_static_orch() {
        Ok(orch) => {
            std::fs::copy(&orch, context.join("orch-cli"))
                .map_err(|e| anyhow::anyhow!("cannot copy the static orch `{}`: {e}", orch.display()))?;
            dockerfile = dockerfile.replace(
                "COPY orch-agent /orch-agent\n",
                "COPY orch-agent /orch-agent\nCOPY orch-cli /orch-cli\n",
            );
        }
        Err(_) => eprintln!(
            "note: no static `orch` found (`bash scripts/prepare-modal.sh` makes it): the image holds the agent only, so `orch setup --backend kubernetes` cannot use it"
        ),
    }
    std::fs::write(context.join("Dockerfile"), dockerfile)?;
    let spec = ImageSpec {
        name: "orch-agent".into(),
        context: context.clone(),
        dockerfile: "Dockerfile".into(),
        args: BTreeMap::new(),
    };
    let built = orch_images::ensure_built(docker, &spec, |_| {}).await;
    let _ = std::fs::remove_dir_all(&context);
    let built = built?;
    eprintln!(
        "{} {} (the static agent `{}`)",
        if built.built { "built" } else { "up to date:" },
        built.tag,
        agent.display()
    );
    let image = match push {
        Some(registry) => {
            let pushed = orch_images::push(docker, &built.tag, registry).await?;
            eprintln!("pushed {pushed}\nhint: `export ORCH_AGENT_IMAGE={pushed}` (or `kubernetes.agent_image` in the suite)");
            pushed
        }
        None => built.tag,
    };
    println!("{image}");
    Ok(0)
}

/// A fresh folder for a build context.
fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "orch-agent-image-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

pub async fn build(args: BuildArgs) -> anyhow::Result<i32> {
    if args.agent {
        let docker = bollard::Docker::connect_with_local_defaults()
            .map_err(|e| orch_images::ImageError::Engine(e.to_string()))?;
        return build_agent(&docker, args.push.as_deref()).await;
    }
    let Some(file) = args.file.as_ref() else {
        return Err(user(
            "`orch build` needs `-f FILE` or `--agent`\nhint: `orch build -f manifests/quickstart.yaml`",
        ));
    };
    let plan = orch_manifest::load(file, &ExpandOptions::default())?;
    let specs = orch_images::plan_specs(&plan)?;
    if specs.is_empty() {
        eprintln!("no image to build: no cell names `image: {{build: NAME}}`");
        return Ok(0);
    }
    let docker = bollard::Docker::connect_with_local_defaults()
        .map_err(|e| orch_images::ImageError::Engine(e.to_string()))?;
    for spec in specs.values() {
        let started = Instant::now();
        let built = orch_images::ensure_built(&docker, spec, |line| {
            if !line.trim().is_empty() {
                eprintln!("  {line}");
            }
        })
        .await?;
        if built.built {
            eprintln!(
                "built {} from {} ({:.1}s)",
                built.tag,
                spec.context.display(),
                started.elapsed().as_secs_f64()
            );
        } else {
            eprintln!("{} is up to date", built.tag);
        }
        if let Some(registry) = &args.push {
            let pushed = orch_images::push(&docker, &built.tag, registry).await?;
            eprintln!("pushed {pushed}");
        }
        println!("{}", built.tag);
    }
    Ok(0)
}
