fn main() {
    // The cell launcher (`orch-agent cell-init -- PROGRAM ...`), before anything else.
    orch_agent::cellinit::dispatch();
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(orch_agent::run::main_with_args(&args));
}
