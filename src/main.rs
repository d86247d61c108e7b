//! Process wiring only: arguments, config, logging, signals and exit codes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use litestream_sidecar::config::{self, LogFormat};
use litestream_sidecar::App;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// sysexits `EX_CONFIG`: systemd's `RestartPreventExitStatus=78` keeps a broken config from restart-looping.
const EXIT_CONFIG: u8 = 78;
/// `--check-config` found problems.
const EXIT_CHECK_FAILED: u8 = 2;

/// Serves Zero's snapshot reservations beside litestream and keeps Zero's change log purged safely.
#[derive(Debug, Parser)]
#[command(
    version,
    about,
    long_about = None,
    after_help = "Every config key can be overridden by an environment variable named \
                  LITESTREAM_SIDECAR__<SECTION>__<KEY>,\ne.g. LITESTREAM_SIDECAR__LITESTREAM__BACKUP_URL.\n\
                  Exit codes: 0 done, 1 runtime failure, 2 usage or --check-config errors, 78 invalid config."
)]
struct Args {
    /// Config file [default: ./sidecar.toml, then /etc/litestream-sidecar/sidecar.toml]
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,

    /// Print the effective config (passwords redacted) and exit 0, or print every error and exit 2
    #[arg(long)]
    check_config: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let path = config::resolve_path(args.config.as_deref());
    let loaded =
        config::load(path.as_deref()).and_then(|raw| raw.validate().map(|config| (raw, config)));

    if args.check_config {
        return match loaded {
            Ok((raw, _)) => {
                match &path {
                    Some(path) => println!(
                        "# effective config from {} and the environment",
                        path.display()
                    ),
                    None => println!(
                        "# effective config from defaults and the environment (no file found)"
                    ),
                }
                print!("{}", raw.to_redacted_toml());
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("{err}");
                ExitCode::from(EXIT_CHECK_FAILED)
            }
        };
    }

    let config = match loaded {
        Ok((_, config)) => config,
        Err(err) => {
            eprintln!("litestream-sidecar: {err}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    init_tracing(&config.log);
    match &path {
        Some(path) => info!(path = %path.display(), "config loaded"),
        None => info!("no config file found; using defaults and the environment"),
    }

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            error!(error = %err, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async_main(config))
}

async fn async_main(config: litestream_sidecar::Config) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(config.server.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            error!(addr = %config.server.listen, error = %err, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    let app = App::new(config);
    let proxy = match app.bind_proxy().await {
        Ok(listeners) => listeners,
        Err(err) => {
            error!(error = %err, "cannot listen for the metrics proxy");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = CancellationToken::new();
    let mut app = tokio::spawn(app.run(listener, proxy, shutdown.clone()));
    // `run` returns by itself only when it could not start: then the process must not stay up without serving.
    let ended = tokio::select! {
        signal = wait_for_signal() => {
            info!(signal, "shutting down");
            shutdown.cancel();
            app.await
        }
        ended = &mut app => ended,
    };
    match ended {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(err)) => {
            error!(error = %err, "stopped with an error");
            exit_code(&err)
        }
        Err(err) => {
            error!(error = %err, "crashed");
            ExitCode::FAILURE
        }
    }
}

/// A failure once running is a runtime failure (1), whatever its cause: config errors (78) are found before.
fn exit_code(err: &litestream_sidecar::Error) -> ExitCode {
    match err {
        litestream_sidecar::Error::MetricsUrl(_) | litestream_sidecar::Error::Listener(_) => {
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM (systemd, Kubernetes) or SIGINT (a terminal).
async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

fn init_tracing(log: &config::LogConfig) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&log.filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match log.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init(),
    }
}
