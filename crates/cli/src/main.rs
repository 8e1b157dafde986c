//! `volstack`: the umbrella binary. Each subcommand runs one component of the project.

#![forbid(unsafe_code)]

mod csi_client;
mod faults;
use cli::logging;
use cli::stack;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc for the umbrella binary, which runs the API server, the
/// controllers and the driver of `up` and `bench` in one process. Measured 2026-11-25, run
/// alternately with glibc's: storms of 1,000 all Bound 9% sooner and backlogs 23% sooner; a
/// 10,000-claim storm 17% sooner with the process peaking at 1.12 GB against 1.31 GB, while a
/// run of 1,000 peaks at 290 MB against 204 MB. Built without transparent huge pages
/// (`no_thp`: mimalloc does not `madvise` its arenas for them): a profile of a 100,000-claim
/// storm (2026-11-26) put 19% of this process's samples in the kernel zeroing 2 MiB pages on
/// page faults (`clear_page_erms` under `do_huge_pmd_anonymous_page`); built so, it maps none
/// (`AnonHugePages: 0 kB` 30 s into the same storm).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Dynamic volume provisioning for CSI drivers: components and the embedded stack.
#[derive(Debug, Parser)]
#[command(name = "volstack", version, about)]
struct Cli {
    #[command(flatten)]
    log: logging::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the reference CSI driver (hostpath volumes under a state directory).
    Driver(Box<hostpath_driver::DriverArgs>),
    /// Talk to any CSI driver over its socket: probe, info, create, delete, list, capacity...
    Csi(csi_client::CsiArgs),
    /// Switch the reference driver's injected faults through its control file.
    Faults(faults::FaultsArgs),
    /// Run the Kubernetes-API-compatible server.
    Apiserver(ApiserverArgs),
    /// Run the whole stack on this machine: API server, driver, provisioner, PV controller.
    Up(stack::UpArgs),
    /// Run the PV controller (binder and reclaimer) against an API server, instead of
    /// kube-controller-manager's persistentvolume-binder-controller.
    PvController(pv_controller::runner::PvControllerArgs),
    /// Drive a CSI driver you run through every capability it advertises, with the embedded
    /// stack around it, and write a report (terminal, report.json, report.html).
    Conformance(cli::conformance::ConformanceArgs),
    /// Measure a provisioner: throughput, latency, memory, CPU and API calls per volume.
    Bench(cli::bench::BenchArgs),
    /// Measure the API server: creates/s from concurrent clients and watch events/s.
    BenchApiserver(cli::apibench::ApiBenchArgs),
    /// Measure kube-controller-manager's PV binder against ours on a real control plane
    /// (../shared/kube or $VOLSTACK_KUBE_BIN): time until a backlog of claims is Bound.
    BenchBinder(cli::binderbench::BinderBenchArgs),
}

/// Flags of `volstack apiserver`.
#[derive(Debug, clap::Args)]
struct ApiserverArgs {
    /// Address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1:6443")]
    bind: std::net::SocketAddr,
    /// Durable state directory (omit for an in-memory server).
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// Where to write the kubeconfig for clients (mode 0600).
    #[arg(long, default_value = "volstack.kubeconfig")]
    kubeconfig: std::path::PathBuf,
    /// Most connections open at once (default: below the process's open-file limit, at most
    /// 4096); further clients wait in the kernel's backlog. A quarter of them (at least one)
    /// may be connections that have made no request with a valid token yet: a new one closes
    /// the oldest, and each lives at most 15 s.
    #[arg(long)]
    max_connections: Option<usize>,
    /// Time a client has to complete the TLS handshake (Go duration).
    #[arg(long, default_value = "10s", value_parser = sidecar_kit::duration::parse_go_duration)]
    tls_handshake_timeout: std::time::Duration,
    /// Users and their tokens, in kube-apiserver's format: one `token,user,uid,"group1,group2"`
    /// per line. RBAC decides what they may do; the kubeconfig's own token is the
    /// administrator's (group system:masters).
    #[arg(long)]
    token_auth_file: Option<std::path::PathBuf>,
}

fn main() -> std::process::ExitCode {
    let mut cli = Cli::parse();
    // The benchmark's in-process components would drown its report in info logs.
    if matches!(
        cli.command,
        Command::Bench(_)
            | Command::BenchApiserver(_)
            | Command::BenchBinder(_)
            | Command::Conformance(_)
    ) && std::env::var("RUST_LOG").is_err()
    {
        cli.log.verbosity = 0;
    }
    if let Err(error) = logging::init(
        &cli.log.log_format,
        logging::level_of_verbosity(cli.log.verbosity),
    ) {
        eprintln!("volstack: {error:#}");
        return std::process::ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("volstack: failed to start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Driver(args) => run_driver(*args).await,
            Command::Csi(args) => csi_client::run(args).await,
            Command::Faults(args) => faults::run(args),
            Command::Apiserver(args) => run_apiserver(args).await,
            Command::Up(args) => stack::up(args).await,
            Command::Conformance(args) => cli::conformance::run(args).await,
            Command::Bench(args) => cli::bench::run(args).await,
            Command::BenchApiserver(args) => cli::apibench::run(args).await,
            Command::BenchBinder(args) => cli::binderbench::run(args).await,
            Command::PvController(args) => run_pv_controller(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("volstack: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run_pv_controller(args: pv_controller::runner::PvControllerArgs) -> anyhow::Result<()> {
    Ok(pv_controller::runner::run(args, cli::shutdown_signal()).await?)
}

async fn run_apiserver(args: ApiserverArgs) -> anyhow::Result<()> {
    let mut listener = apiserver::listener::Limits::for_this_process();
    if let Some(max) = args.max_connections {
        anyhow::ensure!(max > 0, "--max-connections must be at least 1");
        listener.max_connections = max;
        listener.unauthenticated = apiserver::listener::Limits::unauthenticated_share(max);
    }
    listener.handshake = args.tls_handshake_timeout;
    let static_tokens = match &args.token_auth_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--token-auth-file: read {}", path.display()))?;
            apiserver::auth::tokens::parse_token_file(&text)
                .with_context(|| format!("--token-auth-file {}", path.display()))?
        }
        None => Vec::new(),
    };
    let config = apiserver::Config {
        static_tokens,
        bind: args.bind,
        data_dir: args.data_dir,
        kubeconfig_path: Some(args.kubeconfig.clone()),
        listener,
        ..Default::default()
    };
    let server = apiserver::serve(config, cli::shutdown_signal()).await?;
    eprintln!(
        "API server at {}; use: kubectl --kubeconfig {} get pvc",
        server.url(),
        args.kubeconfig.display()
    );
    server.join().await;
    Ok(())
}

async fn run_driver(args: hostpath_driver::DriverArgs) -> anyhow::Result<()> {
    let config = args.into_config()?;
    let driver = hostpath_driver::Driver::open(config).await?;
    driver.serve(cli::shutdown_signal()).await?;
    Ok(())
}
