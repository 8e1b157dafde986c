//! Prometheus metrics with upstream's names and labels, in the text format Go's client writes.

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Buckets of csi-lib-utils' `csi_sidecar_operations_seconds`.
const CSI_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];
/// Buckets of the controller duration histograms (Prometheus defaults, as upstream).
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Buckets of client-go's workqueue duration histograms (10 ns to 10 s, by tens).
const QUEUE_BUCKETS: [f64; 10] = [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0];

/// Every metric the sidecars export.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// The registry behind `/metrics`.
    pub registry: Registry,
    /// `csi_sidecar_operations_seconds{driver_name, method_name, grpc_status_code}`, and
    /// `migrated` for a driver that stands in for an in-tree plugin ([`Metrics::label_migration`]).
    csi_operations: Arc<CsiOperations>,
    /// `controller_persistentvolumeclaim_provision_total{class, source}`.
    pub provision_total: IntCounterVec,
    /// `controller_persistentvolumeclaim_provision_failed_total{class, source}`.
    pub provision_failed: IntCounterVec,
    /// `controller_persistentvolumeclaim_provision_duration_seconds{class, source}`.
    pub provision_duration: HistogramVec,
    /// `controller_persistentvolume_delete_total{class}`.
    pub delete_total: IntCounterVec,
    /// `controller_persistentvolume_delete_failed_total{class}`.
    pub delete_failed: IntCounterVec,
    /// `controller_persistentvolume_delete_duration_seconds{class}`.
    pub delete_duration: HistogramVec,
    /// `workqueue_depth{name}`.
    pub queue_depth: IntGaugeVec,
    /// `workqueue_adds_total{name}`.
    pub queue_adds: IntCounterVec,
    /// `workqueue_retries_total{name}`.
    pub queue_retries: IntCounterVec,
    /// `workqueue_queue_duration_seconds{name}`: how long a key waited before a worker took it.
    pub queue_wait: HistogramVec,
    /// `workqueue_work_duration_seconds{name}`: how long a worker took for a key.
    pub queue_work: HistogramVec,
    /// `workqueue_unfinished_work_seconds{name}`: seconds of work in progress, summed.
    pub queue_unfinished: prometheus::GaugeVec,
    /// `workqueue_longest_running_processor_seconds{name}`: the oldest work in progress.
    pub queue_longest: prometheus::GaugeVec,
    /// `leader_election_master_status{name}`.
    pub leader: IntGaugeVec,
    /// `leader_election_slowpath_total{name}`: a leader's renewals that had to read the lease.
    pub leader_slow_paths: IntCounterVec,
}

/// The CSI calls' two histograms, without and with the `migrated` label, and which one is
/// exported and counts.
#[derive(Debug)]
struct CsiOperations {
    plain: HistogramVec,
    labelled: HistogramVec,
    migration: AtomicBool,
}

impl CsiOperations {
    fn new() -> Result<Self, prometheus::Error> {
        let histogram = |labels: &[&str]| {
            HistogramVec::new(
                HistogramOpts::new(CSI_OPERATIONS, CSI_OPERATIONS_HELP)
                    .buckets(CSI_BUCKETS.to_vec()),
                labels,
            )
        };
        Ok(CsiOperations {
            plain: histogram(&["driver_name", "grpc_status_code", "method_name"])?,
            labelled: histogram(&["driver_name", "grpc_status_code", "method_name", "migrated"])?,
            migration: AtomicBool::new(false),
        })
    }

    fn current(&self) -> &HistogramVec {
        if self.migration.load(Ordering::Relaxed) {
            &self.labelled
        } else {
            &self.plain
        }
    }
}

/// What the registry holds of the CSI calls: whichever histogram is current. (The registry
/// keeps a name's label names after the collector is gone, so the histogram with `migrated`
/// cannot simply replace the first one in it.)
struct CsiCollector {
    desc: prometheus::core::Desc,
    operations: Arc<CsiOperations>,
}

impl prometheus::core::Collector for CsiCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.operations.current().collect()
    }
}

const CSI_OPERATIONS: &str = "csi_sidecar_operations_seconds";
const CSI_OPERATIONS_HELP: &str =
    "Container Storage Interface operation duration with gRPC error code status total";

fn counter(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, prometheus::Error> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> Result<HistogramVec, prometheus::Error> {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )?;
    registry.register(Box::new(h.clone()))?;
    Ok(h)
}

fn gauge(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, prometheus::Error> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

fn float_gauge(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<prometheus::GaugeVec, prometheus::Error> {
    let g = prometheus::GaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

impl Metrics {
    /// Registers everything (plus process metrics).
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let csi_operations = Arc::new(CsiOperations::new()?);
        registry.register(Box::new(CsiCollector {
            desc: prometheus::core::Desc::new(
                CSI_OPERATIONS.into(),
                CSI_OPERATIONS_HELP.into(),
                Vec::new(),
                Default::default(),
            )?,
            operations: csi_operations.clone(),
        }))?;
        Ok(Metrics {
            csi_operations,
            provision_total: counter(
                &registry,
                "controller_persistentvolumeclaim_provision_total",
                "Total number of persistent volumes provisioned succesfully. Broken down by storage class name and source of the claim.",
                &["class", "source"],
            )?,
            provision_failed: counter(
                &registry,
                "controller_persistentvolumeclaim_provision_failed_total",
                "Total number of persistent volume provision failed attempts. Broken down by storage class name and source of the claim.",
                &["class", "source"],
            )?,
            provision_duration: histogram(
                &registry,
                "controller_persistentvolumeclaim_provision_duration_seconds",
                "Latency in seconds to provision persistent volumes. Failed provisioning attempts are ignored. Broken down by storage class name and source of the claim.",
                &["class", "source"],
                &DEFAULT_BUCKETS,
            )?,
            delete_total: counter(
                &registry,
                "controller_persistentvolume_delete_total",
                "Total number of persistent volumes deleted succesfully. Broken down by storage class name.",
                &["class"],
            )?,
            delete_failed: counter(
                &registry,
                "controller_persistentvolume_delete_failed_total",
                "Total number of persistent volume delete failed attempts. Broken down by storage class name.",
                &["class"],
            )?,
            delete_duration: histogram(
                &registry,
                "controller_persistentvolume_delete_duration_seconds",
                "Latency in seconds to delete persistent volumes. Failed deletion attempts are ignored. Broken down by storage class name.",
                &["class"],
                &DEFAULT_BUCKETS,
            )?,
            queue_depth: gauge(
                &registry,
                "workqueue_depth",
                "Current depth of workqueue",
                &["name"],
            )?,
            queue_adds: counter(
                &registry,
                "workqueue_adds_total",
                "Total number of adds handled by workqueue",
                &["name"],
            )?,
            queue_retries: counter(
                &registry,
                "workqueue_retries_total",
                "Total number of retries handled by workqueue",
                &["name"],
            )?,
            queue_wait: histogram(
                &registry,
                "workqueue_queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested.",
                &["name"],
                &QUEUE_BUCKETS,
            )?,
            queue_work: histogram(
                &registry,
                "workqueue_work_duration_seconds",
                "How long in seconds processing an item from workqueue takes.",
                &["name"],
                &QUEUE_BUCKETS,
            )?,
            queue_unfinished: float_gauge(
                &registry,
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
                &["name"],
            )?,
            queue_longest: float_gauge(
                &registry,
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
                &["name"],
            )?,
            leader: gauge(
                &registry,
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
                &["name"],
            )?,
            leader_slow_paths: counter(
                &registry,
                "leader_election_slowpath_total",
                "Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.",
                &["name"],
            )?,
            registry,
        })
    }

    /// Records one CSI call; `migrated` (a call for a volume translated from an in-tree
    /// plugin) is a label only once [`Metrics::label_migration`] has added it.
    pub fn observe_csi(
        &self,
        driver: &str,
        method: &str,
        code: tonic::Code,
        migrated: bool,
        took: Duration,
    ) {
        let ops = &self.csi_operations;
        let code = crate::csi::go_code_name(code);
        let series = if ops.migration.load(Ordering::Relaxed) {
            let migrated = if migrated { "true" } else { "false" };
            ops.labelled
                .with_label_values(&[driver, code, method, migrated])
        } else {
            ops.plain.with_label_values(&[driver, code, method])
        };
        series.observe(took.as_secs_f64());
    }

    /// For a driver that stands in for an in-tree plugin, as upstream's sidecars do (a second
    /// metrics manager `WithMigration`): `csi_sidecar_operations_seconds` starts again with
    /// the `migrated` label; the calls counted before (Probe and GetPluginInfo) go with the
    /// first histogram.
    pub fn label_migration(&self) {
        self.csi_operations.migration.store(true, Ordering::Relaxed);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let families = self.registry.gather();
        if let Err(error) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
            tracing::warn!(%error, "failed to encode metrics");
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_and_labels_are_upstreams() {
        let m = Metrics::new().unwrap();
        m.observe_csi(
            "d.csi",
            "/csi.v1.Controller/CreateVolume",
            tonic::Code::DeadlineExceeded,
            true,
            Duration::from_millis(300),
        );
        m.provision_total.with_label_values(&["fast", ""]).inc();
        m.delete_total.with_label_values(&["fast"]).inc();
        m.leader.with_label_values(&["d-csi"]).set(1);
        let text = m.render();
        for needle in [
            "csi_sidecar_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Controller/CreateVolume\",le=\"0.5\"} 1",
            "controller_persistentvolumeclaim_provision_total{class=\"fast\",source=\"\"} 1",
            "controller_persistentvolume_delete_total{class=\"fast\"} 1",
            "leader_election_master_status{name=\"d-csi\"} 1",
            "process_resident_memory_bytes",
        ] {
            assert!(text.contains(needle), "missing {needle}\n{text}");
        }
    }

    #[test]
    fn a_driver_of_a_migrated_plugin_gets_the_migrated_label_and_a_fresh_histogram() {
        let m = Metrics::new().unwrap();
        let probe = "/csi.v1.Identity/Probe";
        m.observe_csi(
            "unknown-driver",
            probe,
            tonic::Code::Ok,
            false,
            Duration::from_millis(1),
        );
        m.label_migration();
        m.label_migration();
        let create = "/csi.v1.Controller/CreateVolume";
        m.observe_csi(
            "ebs.csi.aws.com",
            probe,
            tonic::Code::Ok,
            false,
            Duration::from_millis(1),
        );
        m.observe_csi(
            "ebs.csi.aws.com",
            create,
            tonic::Code::Ok,
            true,
            Duration::from_millis(1),
        );
        let text = m.render();
        for needle in [
            "csi_sidecar_operations_seconds_count{driver_name=\"ebs.csi.aws.com\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Identity/Probe\",migrated=\"false\"} 1",
            "csi_sidecar_operations_seconds_count{driver_name=\"ebs.csi.aws.com\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Controller/CreateVolume\",migrated=\"true\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle}\n{text}");
        }
        assert!(
            !text.contains("driver_name=\"unknown-driver\""),
            "the first Probe went with the first histogram\n{text}"
        );
        assert_eq!(
            text.matches("# TYPE csi_sidecar_operations_seconds histogram")
                .count(),
            1
        );
    }
}
