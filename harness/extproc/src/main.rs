//! `infergate-extproc`: the external processor of `bench overhead`'s ext_proc arms. Prints
//! `listening on IP:PORT` once it serves.

use anyhow::{Context, Result};
use infergate_extproc::{listening_line, serve, Options, Processor, Router};

fn main() -> Result<()> {
    let args = match Options::parse_from_args(std::env::args_os()) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    let router = Router::new(args.mode, args.endpoints, args.model)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        println!("{}", listening_line(listener.local_addr()?));
        serve(Processor::new(router), listener).await
    })
}
