//! `cargo xtask`: the project's automation, so a new user needs exactly two commands
//! (`cargo xtask demo` and `cargo xtask test`). See `harness/src/xtask/` for the steps.

use std::process::ExitCode;

fn main() -> ExitCode {
    infergate_harness::xtask::main()
}
