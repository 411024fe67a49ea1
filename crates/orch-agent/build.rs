//! `ORCH_AGENT_EMBED=PATH` (set by `scripts/build-agent.sh` for the static
//! build): the dynamic agent at PATH goes inside this one, see `src/launch.rs`.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(orch_embed_gnu)");
    println!("cargo:rerun-if-env-changed=ORCH_AGENT_EMBED");
    if let Some(path) = std::env::var_os("ORCH_AGENT_EMBED").filter(|p| !p.is_empty()) {
        let path = std::path::PathBuf::from(path);
        if !path.is_file() {
            panic!("ORCH_AGENT_EMBED=`{}` is not a file", path.display());
        }
        println!("cargo:rerun-if-changed={}", path.display());
        println!("cargo:rustc-cfg=orch_embed_gnu");
        println!("cargo:rustc-env=ORCH_AGENT_EMBED_PATH={}", path.display());
    }
}
