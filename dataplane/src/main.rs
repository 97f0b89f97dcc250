//! The `ringway` binary.

use std::process::ExitCode;

use clap::Parser;
use ringway_dataplane::config::{Args, LogFormat};
use tracing_subscriber::EnvFilter;

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_thread_names(true);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
    match ringway_dataplane::app::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ringway: {e:#}");
            ExitCode::FAILURE
        }
    }
}
