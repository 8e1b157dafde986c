//! `volstack csi roundtrip`: CreateVolume+DeleteVolume pairs per second against a driver.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use serde_json::{Value, json};
use sidecar_kit::csi::with_timeout;
use tonic::transport::Channel;

use super::{capability, grpc};

pub(super) async fn roundtrip(
    channel: Channel,
    timeout: Duration,
    count: usize,
    concurrency: usize,
    bytes: i64,
) -> anyhow::Result<Value> {
    if concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let run_id = uuid_like();
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency.min(count.max(1)) {
        let channel = channel.clone();
        let next = next.clone();
        let run_id = run_id.clone();
        workers.push(tokio::spawn(async move {
            let mut client = csi::controller_client::ControllerClient::new(channel);
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let t = Instant::now();
                let request = csi::CreateVolumeRequest {
                    name: format!("roundtrip-{run_id}-{i}"),
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: bytes,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![capability(false, "", Mode::SingleNodeWriter)],
                    ..Default::default()
                };
                let created = grpc(client.create_volume(with_timeout(request, timeout)).await)?;
                let id = created
                    .volume
                    .map(|v| v.volume_id)
                    .context("CreateVolume returned no volume")?;
                grpc(
                    client
                        .delete_volume(with_timeout(
                            csi::DeleteVolumeRequest {
                                volume_id: id,
                                ..Default::default()
                            },
                            timeout,
                        ))
                        .await,
                )?;
                latencies.push(t.elapsed());
            }
        }));
    }
    let mut latencies = Vec::with_capacity(count);
    for worker in workers {
        latencies.extend(worker.await.context("worker panicked")??);
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Ok(json!({
        "round_trips": count,
        "concurrency": concurrency,
        "seconds": elapsed.as_secs_f64(),
        "round_trips_per_second": count as f64 / elapsed.as_secs_f64(),
        "latency_ms_p50": pct(0.50),
        "latency_ms_p99": pct(0.99),
    }))
}

fn uuid_like() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )
}
