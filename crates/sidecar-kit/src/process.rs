//! What a sidecar process does around its controller: serve metrics and health, and run the
//! controller either at once or only while it holds the leader lease.

use std::future::Future;

use crate::http::{self, Endpoint, HttpError};
use crate::leader::{ElectionConfig, ElectionError, Elector};
use crate::metrics::Metrics;
use crate::runtime::Controller;

/// Why a sidecar stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The HTTP endpoint could not start.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// Leadership was lost; the process exits so that it restarts as a standby.
    #[error(transparent)]
    Election(#[from] ElectionError),
}

/// How the controller runs.
#[derive(Debug)]
pub struct Serve {
    /// The HTTP address (metrics, health), if any.
    pub http_address: Option<String>,
    /// The metrics path.
    pub metrics_path: String,
    /// The metrics.
    pub metrics: Metrics,
    /// The lease, when leader election is on.
    pub election: Option<ElectionConfig>,
}

/// Runs `controller` until `shutdown` resolves (or leadership is lost).
pub async fn serve(
    controller: Controller,
    client: kube::Client,
    serve: Serve,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let Serve {
        http_address,
        metrics_path,
        metrics,
        election,
    } = serve;
    let Some(election) = election else {
        if let Some(address) = &http_address {
            http::serve(
                address,
                &metrics_path,
                Endpoint {
                    metrics,
                    leader: None,
                },
            )
            .await?;
        }
        controller.run(shutdown).await;
        return Ok(());
    };
    let lease_duration = election.lease_duration;
    let metric_name = election.metric_name.clone();
    let elector =
        Elector::new(client, election).count_slow_paths(metrics.leader_slow_paths.clone());
    let status = elector.status();
    if let Some(address) = &http_address {
        http::serve(
            address,
            &metrics_path,
            Endpoint {
                metrics: metrics.clone(),
                leader: Some((status.clone(), lease_duration)),
            },
        )
        .await?;
    }
    let gauge = metrics.leader.with_label_values(&[metric_name.as_str()]);
    let shown = tokio::spawn(async move {
        loop {
            gauge.set(i64::from(status.is_leader()));
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
    let result = controller.run_as_leader(elector, shutdown).await;
    shown.abort();
    Ok(result?)
}
