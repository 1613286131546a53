//! The command line of `infergate-extproc`.

use clap::Parser;

use crate::route::Mode;

/// Command line.
#[derive(Clone, Debug, PartialEq, Eq, Parser)]
#[command(
    name = "infergate-extproc",
    about = "Envoy external processor (envoy.service.ext_proc.v3) that sets the gateway's \
             routing headers once a request's body is complete"
)]
pub struct Options {
    /// Address to serve gRPC on (port 0: the kernel chooses; the bound address is printed
    /// as `listening on IP:PORT`).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// `null`: answer at once; `parse`: parse the body and hash its prompt first.
    #[arg(long, value_enum, default_value = "null")]
    pub mode: Mode,
    /// An endpoint (`ip:port`) to route to; repeat it or give a comma-separated list.
    #[arg(long = "endpoint", required = true, value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// The base model named in `null` mode (`parse` names the body's).
    #[arg(long, default_value = "sim-model")]
    pub model: String,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

impl Options {
    /// Parses `args` (the program name first), or says why not.
    pub fn parse_from_args<I, T>(args: I) -> Result<Options, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let o = Options::try_parse_from(args)?;
        if let Some(bad) = o
            .endpoints
            .iter()
            .find(|e| e.parse::<std::net::SocketAddr>().is_err())
        {
            return Err(clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("--endpoint `{bad}` is not ip:port\n"),
            ));
        }
        if o.threads == 0 {
            return Err(clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                "--threads must be at least 1\n",
            ));
        }
        Ok(o)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::parse_from_args(std::iter::once("infergate-extproc").chain(args.iter().copied()))
    }

    #[test]
    fn options_parse() {
        let o = parse(&["--endpoint", "127.0.0.1:9"]).unwrap();
        assert_eq!(o.mode, Mode::Null);
        assert_eq!(o.listen, "127.0.0.1:0");
        assert_eq!(o.endpoints, ["127.0.0.1:9"]);
        assert_eq!((o.model.as_str(), o.threads), ("sim-model", 2));
        let o = parse(&[
            "--mode",
            "parse",
            "--listen",
            "127.0.0.1:5000",
            "--endpoint",
            "127.0.0.1:1,127.0.0.1:2",
            "--endpoint",
            "127.0.0.1:3",
            "--threads",
            "1",
            "--model",
            "m",
        ])
        .unwrap();
        assert_eq!(o.mode, Mode::Parse);
        assert_eq!(o.endpoints, ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
        assert_eq!(
            (o.listen.as_str(), o.model.as_str(), o.threads),
            ("127.0.0.1:5000", "m", 1)
        );
        assert!(parse(&[]).is_err(), "an endpoint is required");
        assert!(parse(&["--endpoint", "localhost"]).is_err(), "not ip:port");
        assert!(parse(&["--endpoint", "127.0.0.1:1", "--mode", "full"]).is_err());
        assert!(parse(&["--endpoint", "127.0.0.1:1", "--threads", "0"]).is_err());
    }
}
