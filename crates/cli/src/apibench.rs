//! `volstack bench-apiserver`: creates per second from concurrent clients with durability on,
//! and watch events per second delivered to several watchers. Prints figures; asserts nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;

/// Flags of `volstack bench-apiserver`.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiBenchArgs {
    /// Objects to create.
    #[arg(long, default_value_t = 20_000)]
    pub creates: usize,
    /// Concurrent creating clients.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Watchers that must see every event.
    #[arg(long, default_value_t = 10)]
    pub watchers: usize,
    /// Keep everything in memory instead of fsyncing a log.
    #[arg(long)]
    pub in_memory: bool,
    /// Run the clients as a ServiceAccount a Role allows configmaps (every request decided by
    /// RBAC) instead of the administrator (group system:masters, allowed without a look at the
    /// rules).
    #[arg(long)]
    pub service_account: bool,
}

/// The clients' kubeconfig: the administrator's, or with `service_account` a ServiceAccount's
/// token whose Role grants what the benchmark does.
async fn clients_kubeconfig(
    server: &apiserver::RunningServer,
    service_account: bool,
) -> anyhow::Result<String> {
    let admin = server.kubeconfig();
    if !service_account {
        return Ok(admin);
    }
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&admin)?,
        &Default::default(),
    )
    .await?;
    let rbac = crate::manifests::parse(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: bench, namespace: default}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: bench, namespace: default}\nrules: [{apiGroups: [\"\"], resources: [configmaps], verbs: [create, list, watch]}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: bench, namespace: default}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: bench}\nsubjects: [{kind: ServiceAccount, name: bench, namespace: default}]\n",
    )?;
    crate::manifests::apply(&kube::Client::try_from(config)?, &rbac).await?;
    let token = server
        .service_account_token("default", "bench", 3600)
        .map_err(|e| anyhow::anyhow!("issue the benchmark's token: {}", e.message))?;
    Ok(apiserver::server::kubeconfig(
        server.local_addr(),
        &token,
        server.ca_data(),
    ))
}

/// Runs the benchmark.
pub async fn run(args: ApiBenchArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let server = apiserver::serve(
        apiserver::Config {
            data_dir: (!args.in_memory).then(|| dir.path().join("api")),
            history: args.creates + 1000,
            ..Default::default()
        },
        async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        },
    )
    .await?;
    let kc = kube::config::Kubeconfig::from_yaml(
        &clients_kubeconfig(&server, args.service_account).await?,
    )?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let mut watchers = Vec::new();
    let start_rv = "1".to_string();
    let received = Arc::new(AtomicUsize::new(0));
    for _ in 0..args.watchers {
        let api: Api<ConfigMap> =
            Api::namespaced(kube::Client::try_from(config.clone())?, "default");
        let stream = api
            .watch(&WatchParams::default().timeout(3600), &start_rv)
            .await
            .context("start a watch")?;
        let (received, want) = (received.clone(), args.creates);
        watchers.push(tokio::spawn(async move {
            futures::pin_mut!(stream);
            let mut mine = 0;
            let mut last = Instant::now();
            while let Some(Ok(event)) = stream.next().await {
                if let WatchEvent::Added(_) = event {
                    mine += 1;
                    received.fetch_add(1, Ordering::Relaxed);
                    last = Instant::now();
                    if mine == want {
                        break;
                    }
                }
            }
            (mine, last)
        }));
    }
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut creators = Vec::new();
    for _ in 0..args.clients.max(1) {
        let api: Api<ConfigMap> =
            Api::namespaced(kube::Client::try_from(config.clone())?, "default");
        let (next, total) = (next.clone(), args.creates);
        creators.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, anyhow::Error>(());
                }
                let cm: ConfigMap = serde_json::from_value(
                    json!({"metadata": {"name": format!("bench-{i}")}, "data": {"k": "v"}}),
                )?;
                api.create(&PostParams::default(), &cm).await?;
            }
        }));
    }
    for c in creators {
        c.await??;
    }
    let create_secs = started.elapsed().as_secs_f64();
    let mut slowest = Duration::ZERO;
    let mut complete = 0;
    for w in watchers {
        let (seen, last) = tokio::time::timeout(Duration::from_secs(120), w)
            .await
            .context("a watcher fell behind")??;
        if seen == args.creates {
            complete += 1;
        }
        slowest = slowest.max(last.duration_since(started));
    }
    println!(
        "creates: {} from {} clients in {:.2}s = {:.0}/s ({})",
        args.creates,
        args.clients,
        create_secs,
        args.creates as f64 / create_secs,
        if args.in_memory {
            "in memory"
        } else {
            "durable: fsynced write-ahead log"
        }
    );
    println!(
        "clients: {}",
        if args.service_account {
            "a ServiceAccount, every request decided by RBAC"
        } else {
            "the administrator (system:masters)"
        }
    );
    println!(
        "watch: {complete} of {} watchers saw all {} events; {} events delivered in {:.2}s = {:.0} events/s",
        args.watchers,
        args.creates,
        received.load(Ordering::Relaxed),
        slowest.as_secs_f64(),
        received.load(Ordering::Relaxed) as f64 / slowest.as_secs_f64().max(1e-9)
    );
    let _ = stop_tx.send(true);
    if complete != args.watchers {
        anyhow::bail!("{} watchers missed events", args.watchers - complete);
    }
    Ok(())
}
