use crate::cli::BuildArgs;
use crate::error::user;
use orch_images::ImageSpec;
use orch_manifest::{ExpandOptions, ImageDef, Plan};
use std::collections::BTreeMap;
use std::time::Instant;

/// The images a plan builds, by name.
pub fn image_specs(plan: &Plan) -> Result<BTreeMap<String, ImageSpec>, orch_images::ImageError> {
    let mut specs = BTreeMap::new();
    for c in &plan.cells {
        if let Some(ImageDef::Build(b)) = &c.image {
            if specs.contains_key(&b.build) {
                continue;
            }
            let context = orch_images::find_context(&plan.manifest, &b.build)?;
            specs.insert(
                b.build.clone(),
                ImageSpec {
                    name: b.build.clone(),
                    context,
                    dockerfile: b.dockerfile.clone().unwrap_or_else(|| "Dockerfile".into()),
                    args: b.args.clone(),
                },
            );
        }
    }
    Ok(specs)
}

/// Image per cell id, for a container run; refuses when a built image is missing.
pub async fn resolve_images(
    plan: &Plan,
    docker: &bollard::Docker,
) -> anyhow::Result<BTreeMap<String, String>> {
    let specs = image_specs(plan)?;
    let mut tags = BTreeMap::new();
    for (name, spec) in &specs {
        let tag = orch_images::resolve_tag(spec)?;
        if !orch_images::exists(docker, &tag).await? {
            return Err(user(format!(
                "image `{name}` is not built (or changed since): `{tag}` is not in the engine\nhint: run `orch build -f {}`",
                plan.manifest.display()
            )));
        }
        tags.insert(name.clone(), tag);
    }
    let mut out = BTreeMap::new();
    for c in &plan.cells {
        match &c.image {
            Some(ImageDef::Ref(r)) => {
                out.insert(c.id.clone(), r.clone());
            }
            Some(ImageDef::Build(b)) => {
                if let Some(t) = tags.get(&b.build) {
                    out.insert(c.id.clone(), t.clone());
                }
            }
            None => {}
        }
    }
    Ok(out)
}

pub async fn build(args: BuildArgs) -> anyhow::Result<i32> {
    let plan = orch_manifest::load(&args.file, &ExpandOptions::default())?;
    let specs = image_specs(&plan)?;
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
