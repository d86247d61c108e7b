//! Process wiring only: arguments, config, logging, signals (SIGTERM and SIGINT stop, SIGHUP re-reads the TLS
//! files) and exit codes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use litestream_sidecar::config;
use litestream_sidecar::ops::log::{log_filter, LogConfig, LogFormat};
use litestream_sidecar::App;
use tokio::signal::unix::{signal, SignalKind};
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
    /// Config file [default: ./sidecar.toml, then /etc/litestream-sidecar/sidecar.toml]. From the environment, the
    /// daemon and the commands run beside it (a container's health check) read the same file
    #[arg(
        long,
        value_name = "PATH",
        global = true,
        env = "LITESTREAM_SIDECAR_CONFIG"
    )]
    config: Option<PathBuf>,

    /// Print the effective config (passwords redacted) and exit 0, or print every error and exit 2
    #[arg(long)]
    check_config: bool,

    /// Without a command: run the daemon
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Ask the running daemon for its state (GET /status) and print it as tables
    #[command(
        after_help = "Exit codes: 0 printed, 1 the daemon did not answer or answered something else,\n\
                      78 invalid config (read without --addr, or named by --config), or its TLS certificate\n\
                      unreadable."
    )]
    Status {
        /// The daemon's host:port [default: server.listen from the config, a wildcard address as loopback]. TLS
        /// when the config sets server.tls_cert_file (with --addr, only a config named by --config is read)
        #[arg(long, value_name = "HOST:PORT")]
        addr: Option<String>,

        /// Print the daemon's JSON as it came
        #[arg(long)]
        json: bool,

        /// Give up after this long
        #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Restore the newest backup now with the config's litestream, check it with SQLite, and print the outcome
    #[command(
        after_help = "Exit codes: 0 the backup restored and passed the check, 1 the drill failed,\n\
                      78 invalid config."
    )]
    Drill,
    /// Ask the running daemon whether it is ready (GET /keepalive): the container image's health check
    #[command(
        after_help = "Exit codes: 0 ready, 1 not ready or not answering, 78 invalid config or its TLS\n\
                      certificate unreadable."
    )]
    Ready {
        /// The daemon's host:port [default: server.listen from the config, a wildcard address as loopback]
        #[arg(long, value_name = "HOST:PORT")]
        addr: Option<String>,

        /// Give up after this long
        #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Status {
        addr,
        json,
        timeout,
    }) = &args.command
    {
        return status(args.config.as_deref(), addr.as_deref(), *json, *timeout);
    }
    if let Some(Command::Drill) = &args.command {
        return drill(args.config.as_deref());
    }
    if let Some(Command::Ready { addr, timeout }) = &args.command {
        return ready(args.config.as_deref(), addr.as_deref(), *timeout);
    }
    let path = config::resolve_path(args.config.as_deref());
    let loaded = config::load(path.as_deref())
        .and_then(|raw| raw.validate().map(|config| (raw, config)))
        .map_err(CheckError::Config);

    if args.check_config {
        // The files the config names are read too: a certificate that cannot be loaded stops the daemon as surely
        // as a bad key. Their errors come after the keys', which may explain them.
        let loaded = loaded.and_then(|(raw, config)| {
            litestream_sidecar::net::tls::Tls::load(
                config.server.tls.as_ref(),
                config.upstream.tls.as_ref(),
            )
            .map(|_| (raw, config))
            .map_err(CheckError::Tls)
        });
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

    raise_open_files(config.server.max_connections);

    // One thread by default: the relay's wake-ups then never hand a task to another thread (a futex wake and a
    // cross-core cache miss each), which is most of what a busy relay costs beyond its reads and writes.
    let mut builder = match config.server.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        threads => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(threads);
            builder
        }
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            error!(error = %err, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async_main(config))
}

/// Raises the open-file limit to the hard limit: the usual soft limit (1024 from systemd and most shells) would
/// refuse connections, with errors on accept rather than a clear 503, long before `server.max_connections`.
fn raise_open_files(max_connections: usize) {
    // One descriptor a connection, plus the upstream socket and the ack timer of each relayed one (view-syncers: a
    // few), the database and the listeners.
    let wanted = max_connections as u64 + 256;
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < wanted => tracing::warn!(
            limit,
            max_connections,
            "the open-file limit is below server.max_connections: accepts will fail before the cap refuses \
             with 503 (raise LimitNOFILE= or `ulimit -n`, or lower server.max_connections)"
        ),
        Ok(limit) => tracing::debug!(limit, "open-file limit"),
        // A seccomp filter may forbid setrlimit (the systemd unit sets LimitNOFILE= instead).
        Err(err) => tracing::debug!(error = %err, "open-file limit not raised"),
    }
}

/// What `--check-config` reports: the keys, or the files they name.
#[derive(Debug, thiserror::Error)]
enum CheckError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Tls(litestream_sidecar::net::tls::TlsError),
}

/// `litestream-sidecar status`: the daemon's `/status`, as tables or as it came.
fn status(
    config_path: Option<&std::path::Path>,
    addr: Option<&str>,
    json: bool,
    timeout: std::time::Duration,
) -> ExitCode {
    use litestream_sidecar::ops::status_cli as status;
    let (addr, tls, runtime) = match daemon_target("status", config_path, addr) {
        Ok(target) => target,
        Err(code) => return code,
    };
    match runtime.block_on(status::fetch(&addr, tls, timeout)) {
        Ok((raw, _)) if json => {
            print!("{raw}");
            ExitCode::SUCCESS
        }
        Ok((_, report)) => {
            print!("{}", status::render(&report));
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("litestream-sidecar status: {err}");
            if matches!(err, status::FetchError::Unreachable { .. }) {
                eprintln!(
                    "is the daemon running and listening there? (--addr HOST:PORT to ask another)"
                );
            }
            ExitCode::FAILURE
        }
    }
}

/// The running daemon a client command talks to: its address (`--addr`, or `server.listen` from the config), a TLS
/// connector when the config's listener speaks TLS, and a runtime to talk with. Only the address and the TLS
/// certificate are read from the config, so `--addr` works without one.
fn daemon_target(
    command: &str,
    config_path: Option<&std::path::Path>,
    addr: Option<&str>,
) -> Result<
    (
        String,
        Option<tokio_rustls::TlsConnector>,
        tokio::runtime::Runtime,
    ),
    ExitCode,
> {
    use litestream_sidecar::ops::status_cli as status;
    // With --addr, a config is read only when --config names one, and only for its TLS settings.
    let config = if addr.is_none() || config_path.is_some() {
        let path = config::resolve_path(config_path);
        match config::load(path.as_deref()).and_then(|raw| raw.validate()) {
            Ok(config) => Some(config),
            Err(err) => {
                eprintln!(
                    "litestream-sidecar {command}: {err}\n(--addr HOST:PORT needs no config)"
                );
                return Err(ExitCode::from(EXIT_CONFIG));
            }
        }
    } else {
        None
    };
    let addr = match (addr, &config) {
        (Some(addr), _) => addr.to_string(),
        (None, Some(config)) => status::local_address(config.server.listen),
        (None, None) => unreachable!("a config is read without --addr"),
    };
    let tls = match config
        .as_ref()
        .and_then(|config| config.server.tls.as_ref())
    {
        None => None,
        Some(files) => match litestream_sidecar::net::tls::status_connector(files) {
            Ok(connector) => Some(connector),
            Err(err) => {
                eprintln!("litestream-sidecar {command}: {err}");
                return Err(ExitCode::from(EXIT_CONFIG));
            }
        },
    };
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => Ok((addr, tls, runtime)),
        Err(err) => {
            eprintln!("litestream-sidecar {command}: cannot start the async runtime: {err}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// `litestream-sidecar ready`: 0 when the daemon answers `/keepalive` with 200, 1 otherwise.
fn ready(
    config_path: Option<&std::path::Path>,
    addr: Option<&str>,
    timeout: std::time::Duration,
) -> ExitCode {
    use litestream_sidecar::ops::status_cli as status;
    let (addr, tls, runtime) = match daemon_target("ready", config_path, addr) {
        Ok(target) => target,
        Err(code) => return code,
    };
    match runtime.block_on(status::ready(&addr, tls, timeout)) {
        Ok(body) => {
            print!("{body}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("litestream-sidecar ready: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `litestream-sidecar drill`: one restore drill in this process (see `ops::drill_cli`).
fn drill(config_path: Option<&std::path::Path>) -> ExitCode {
    use litestream_sidecar::ops::drill_cli;
    let path = config::resolve_path(config_path);
    let config = match config::load(path.as_deref()).and_then(|raw| raw.validate()) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("litestream-sidecar drill: {err}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("litestream-sidecar drill: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(drill_cli::run(
        &config.backup,
        &config.litestream,
        config.cleanup.requires,
        &config.change_db,
        &config.zero,
    ));
    print!("{}", drill_cli::render(&outcome));
    if outcome.result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

async fn async_main(config: litestream_sidecar::Config) -> ExitCode {
    let listen = config.server.listen;
    let mut app = App::new(config);
    let reloader = match app.reloader() {
        Ok(reloader) => reloader,
        Err(err) => {
            error!(error = %err, "cannot load the TLS files");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // Installed before the listener opens: SIGHUP's default action would end the process.
    let mut hangup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            info!(signal = "SIGHUP", "reloading");
            let reloader = reloader.clone();
            // Parsing keys is CPU work: off the runtime's worker threads.
            let _ = tokio::task::spawn_blocking(move || reloader.reload()).await;
        }
    });
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(err) => {
            error!(addr = %listen, error = %err, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
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

/// A failure once running is a runtime failure (1), whatever its cause, but for a setting the upstream's answer
/// at start shows cannot work (78, as config errors found before).
fn exit_code(err: &litestream_sidecar::Error) -> ExitCode {
    match err {
        litestream_sidecar::Error::MetricsUrl(_)
        | litestream_sidecar::Error::Listener(_)
        | litestream_sidecar::Error::Tls(_) => ExitCode::FAILURE,
        // Fixed in the config, as a config error is: systemd's RestartPreventExitStatus keeps it from looping.
        litestream_sidecar::Error::NeverReady(_) => ExitCode::from(EXIT_CONFIG),
    }
}

/// Resolves on SIGTERM (systemd, Kubernetes) or SIGINT (a terminal).
async fn wait_for_signal() -> &'static str {
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

fn init_tracing(log: &LogConfig) {
    // `RUST_LOG` wins when it holds a valid filter; `log.filter` was checked with the config.
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|directives| log_filter(&directives).ok())
        .or_else(|| log_filter(&log.filter).ok())
        .unwrap_or_default();
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
