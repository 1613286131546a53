//! `infergate-example-hyper --config FILE [--listen ADDR] [--workers N]`: the gateway on
//! hyper. FILE is the native flavour's `gateway` filter config (JSON), or a bootstrap
//! `infergate render --target envoy --flavor native` wrote, whose `infergate.gateway`
//! filter's config is used.

use clap::Parser;
use infergate_example_hyper::{gateway_config, serve, Gateway};

#[derive(Parser)]
#[command(
    name = "infergate-example-hyper",
    about = "The gateway's router and picker on a hyper reverse proxy"
)]
struct Args {
    /// The `gateway` filter config (JSON), or an Envoy bootstrap holding it.
    #[arg(long)]
    config: std::path::PathBuf,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// Worker threads (each one a current-thread runtime).
    #[arg(long, default_value_t = 2)]
    workers: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.config)?;
    let gateway = Gateway::from_config(gateway_config(&text)?)?;
    let listener = std::net::TcpListener::bind(args.listen)?;
    eprintln!("gateway: http://{}", listener.local_addr()?);
    serve(gateway, listener, args.workers)?;
    loop {
        std::thread::park();
    }
}
