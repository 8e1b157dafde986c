//! kube-controller-manager's PV controller gauges, counted from the caches at each scrape:
//! `pv_collector_total_pv_count{plugin_name, volume_mode}`,
//! `pv_collector_bound_pv_count{storage_class}`, `pv_collector_unbound_pv_count{storage_class}`,
//! `pv_collector_bound_pvc_count{namespace, storage_class, volume_attributes_class}` and
//! `pv_collector_unbound_pvc_count{...}` (bound: the phase says Bound).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::reflector::Store;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGaugeVec, Opts};

/// The counts behind the gauges, by their labels.
#[derive(Debug, Default, PartialEq)]
pub struct Counts {
    /// By (plugin name, volume mode).
    pub total_pv: BTreeMap<(String, String), i64>,
    /// By storage class.
    pub bound_pv: BTreeMap<String, i64>,
    /// By storage class.
    pub unbound_pv: BTreeMap<String, i64>,
    /// By (namespace, storage class, volume attributes class).
    pub bound_pvc: BTreeMap<(String, String, String), i64>,
    /// By (namespace, storage class, volume attributes class).
    pub unbound_pvc: BTreeMap<(String, String, String), i64>,
}

/// A volume's plugin as kube-controller-manager names it (`kubernetes.io/csi:<driver>` for
/// CSI), `N/A` for a source it has no plugin for here.
fn plugin_name(pv: &PersistentVolume) -> String {
    let Some(spec) = pv.spec.as_ref() else {
        return "N/A".into();
    };
    if let Some(csi) = &spec.csi {
        return format!("kubernetes.io/csi:{}", csi.driver);
    }
    let plugin = if spec.host_path.is_some() {
        "kubernetes.io/host-path"
    } else if spec.nfs.is_some() {
        "kubernetes.io/nfs"
    } else if spec.local.is_some() {
        "kubernetes.io/local-volume"
    } else {
        "N/A"
    };
    plugin.into()
}

/// Counts the volumes and claims as kube-controller-manager's collector does.
pub fn count<'a>(
    volumes: impl IntoIterator<Item = &'a PersistentVolume>,
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
) -> Counts {
    let mut counts = Counts::default();
    for pv in volumes {
        let spec = pv.spec.as_ref();
        let mode = spec.and_then(|s| s.volume_mode.clone());
        *counts
            .total_pv
            .entry((plugin_name(pv), mode.unwrap_or_else(|| "Filesystem".into())))
            .or_default() += 1;
        let class = spec
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default();
        let bound = sidecar_kit::vocabulary::pv_phase(pv) == "Bound";
        let by_class = if bound {
            &mut counts.bound_pv
        } else {
            &mut counts.unbound_pv
        };
        *by_class.entry(class).or_default() += 1;
    }
    for claim in claims {
        let spec = claim.spec.as_ref();
        let labels = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            spec.and_then(|s| s.storage_class_name.clone())
                .unwrap_or_default(),
            spec.and_then(|s| s.volume_attributes_class_name.clone())
                .unwrap_or_default(),
        );
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let by_labels = if bound {
            &mut counts.bound_pvc
        } else {
            &mut counts.unbound_pvc
        };
        *by_labels.entry(labels).or_default() += 1;
    }
    counts
}

/// The gauges' definitions (names, help, labels).
fn gauges() -> [IntGaugeVec; 5] {
    let gauge = |name: &str, help: &str, labels: &[&str]| {
        // The names and labels are constants: a failure here is a defect caught by the tests.
        IntGaugeVec::new(Opts::new(name, help), labels)
            .unwrap_or_else(|error| panic!("gauge {name}: {error}"))
    };
    let claim_labels = ["namespace", "storage_class", "volume_attributes_class"];
    [
        gauge(
            "pv_collector_total_pv_count",
            "Gauge measuring total number of persistent volumes",
            &["plugin_name", "volume_mode"],
        ),
        gauge(
            "pv_collector_bound_pv_count",
            "Gauge measuring number of persistent volume currently bound",
            &["storage_class"],
        ),
        gauge(
            "pv_collector_unbound_pv_count",
            "Gauge measuring number of persistent volume currently unbound",
            &["storage_class"],
        ),
        gauge(
            "pv_collector_bound_pvc_count",
            "Gauge measuring number of persistent volume claim currently bound",
            &claim_labels,
        ),
        gauge(
            "pv_collector_unbound_pvc_count",
            "Gauge measuring number of persistent volume claim currently unbound",
            &claim_labels,
        ),
    ]
}

/// The collector, registered beside the controller's other metrics.
pub struct PvCollector {
    volumes: Store<PersistentVolume>,
    claims: Store<PersistentVolumeClaim>,
    descs: Vec<Desc>,
}

impl std::fmt::Debug for PvCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PvCollector").finish_non_exhaustive()
    }
}

impl PvCollector {
    /// Counts what these caches hold.
    pub fn new(volumes: Store<PersistentVolume>, claims: Store<PersistentVolumeClaim>) -> Self {
        let descs = gauges()
            .iter()
            .flat_map(|g| g.desc().into_iter().cloned())
            .collect();
        PvCollector {
            volumes,
            claims,
            descs,
        }
    }
}

impl Collector for PvCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (volumes, claims) = (self.volumes.state(), self.claims.state());
        let counts = count(
            volumes.iter().map(AsRef::as_ref),
            claims.iter().map(AsRef::as_ref),
        );
        let [total, bound_pv, unbound_pv, bound_pvc, unbound_pvc] = gauges();
        for ((plugin, mode), n) in &counts.total_pv {
            total
                .with_label_values(&[plugin.as_str(), mode.as_str()])
                .set(*n);
        }
        for (gauge, by_class) in [
            (&bound_pv, &counts.bound_pv),
            (&unbound_pv, &counts.unbound_pv),
        ] {
            for (class, n) in by_class {
                gauge.with_label_values(&[class.as_str()]).set(*n);
            }
        }
        for (gauge, by_labels) in [
            (&bound_pvc, &counts.bound_pvc),
            (&unbound_pvc, &counts.unbound_pvc),
        ] {
            for ((ns, class, vac), n) in by_labels {
                gauge
                    .with_label_values(&[ns.as_str(), class.as_str(), vac.as_str()])
                    .set(*n);
            }
        }
        [total, bound_pv, unbound_pv, bound_pvc, unbound_pvc]
            .iter()
            .flat_map(Collector::collect)
            .collect()
    }
}

/// kube-controller-manager's counters of the default class given to claims made without one
/// (`retroactive_storageclass_total`, `retroactive_storageclass_errors_total`).
#[derive(Debug, Clone)]
pub struct Retroactive {
    /// Assignments tried (written or not).
    pub assigned: prometheus::IntCounter,
    /// Assignments that failed.
    pub failed: prometheus::IntCounter,
}

impl Retroactive {
    /// The counters, registered in `registry`.
    pub fn register(registry: &prometheus::Registry) -> Result<Retroactive, prometheus::Error> {
        let assigned = prometheus::IntCounter::new(
            "retroactive_storageclass_total",
            "Total number of retroactive StorageClass assignments to persistent volume claim",
        )?;
        let failed = prometheus::IntCounter::new(
            "retroactive_storageclass_errors_total",
            "Total number of failed retroactive StorageClass assignments to persistent volume claim",
        )?;
        registry.register(Box::new(assigned.clone()))?;
        registry.register(Box::new(failed.clone()))?;
        Ok(Retroactive { assigned, failed })
    }

    /// Counts one assignment, written or failed: as kube-controller-manager's
    /// `RecordRetroactiveStorageClassMetric`, the total counts every attempt, failures
    /// included.
    pub fn record(&self, written: bool) {
        self.assigned.inc();
        if !written {
            self.failed.inc();
        }
    }
}

/// kube-controller-manager's end-to-end operation metrics
/// (`volume_operation_total_seconds{plugin_name, operation_name}`, from the binder asking a
/// provisioner to the claim's binding, or from a volume's release to its deletion by an
/// external deleter; and `volume_operation_total_errors`, a failed step on the way): each
/// operation's start is kept by its key (the claim's `namespace/name`, the volume's name)
/// until it ends or its object goes.
#[derive(Debug)]
pub struct Operations {
    seconds: prometheus::HistogramVec,
    errors: prometheus::IntCounterVec,
    started: parking_lot::Mutex<std::collections::HashMap<String, Started>>,
}

#[derive(Debug, Clone)]
struct Started {
    /// The object's UID: an object made again under the name starts anew.
    uid: String,
    plugin: String,
    operation: &'static str,
    at: std::time::Instant,
}

/// The plugin label of an operation whose plugin is not known.
pub const NO_PLUGIN: &str = "N/A";

impl Operations {
    /// The metrics, registered in `registry`.
    pub fn register(registry: &prometheus::Registry) -> Result<Operations, prometheus::Error> {
        let labels = ["plugin_name", "operation_name"];
        let seconds = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new(
                "volume_operation_total_seconds",
                "Storage operation end to end duration in seconds",
            )
            .buckets(vec![
                0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
            ]),
            &labels,
        )?;
        let errors = prometheus::IntCounterVec::new(
            Opts::new(
                "volume_operation_total_errors",
                "Total volume operation errors",
            ),
            &labels,
        )?;
        registry.register(Box::new(seconds.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        Ok(Operations {
            seconds,
            errors,
            started: Default::default(),
        })
    }

    /// `operation` of `plugin` started for `key` (the object with `uid`), unless one is under
    /// way for that object already.
    pub fn start(&self, key: &str, uid: &str, plugin: &str, operation: &'static str) {
        let mut started = self.started.lock();
        if started.get(key).is_some_and(|s| s.uid == uid) {
            return;
        }
        started.insert(
            key.to_string(),
            Started {
                uid: uid.to_string(),
                plugin: plugin_label(plugin),
                operation,
                at: std::time::Instant::now(),
            },
        );
    }

    /// Ends the operations whose object is gone without a delete event (deleted while a watch
    /// was away): a claim's provision is dropped unobserved, a volume's delete is observed
    /// (its deletion is the operation's end). `claim_exists` and `volume_exists` take keys.
    pub fn sweep(&self, claim_exists: impl Fn(&str) -> bool, volume_exists: impl Fn(&str) -> bool) {
        let gone: Vec<(String, &'static str)> = self
            .started
            .lock()
            .iter()
            .filter(|(key, s)| match s.operation {
                "delete" => !volume_exists(key),
                _ => !claim_exists(key),
            })
            .map(|(key, s)| (key.clone(), s.operation))
            .collect();
        for (key, operation) in gone {
            match operation {
                "delete" => self.finish(&key),
                _ => self.forget(&key),
            }
        }
    }

    /// The operation under way for `key` ended: its duration is observed.
    pub fn finish(&self, key: &str) {
        let Some(started) = self.started.lock().remove(key) else {
            return;
        };
        self.seconds
            .with_label_values(&[started.plugin.as_str(), started.operation])
            .observe(started.at.elapsed().as_secs_f64());
    }

    /// A step of the operation under way for `key` failed; the operation goes on.
    pub fn failed(&self, key: &str) {
        let started = self.started.lock().get(key).cloned();
        if let Some(started) = started {
            self.error(&started.plugin, started.operation);
        }
    }

    /// `operation` of `plugin` failed, whether or not one was under way.
    pub fn error(&self, plugin: &str, operation: &str) {
        self.errors
            .with_label_values(&[plugin_label(plugin).as_str(), operation])
            .inc();
    }

    /// `key`'s object is gone: its operation is dropped unobserved.
    pub fn forget(&self, key: &str) {
        self.started.lock().remove(key);
    }

    /// How many operations are under way.
    pub fn under_way(&self) -> usize {
        self.started.lock().len()
    }
}

fn plugin_label(plugin: &str) -> String {
    if plugin.is_empty() {
        NO_PLUGIN.to_string()
    } else {
        plugin.to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use sidecar_kit::testing;

    #[test]
    fn volumes_and_claims_are_counted_by_kube_controller_managers_labels() {
        let mut csi = testing::csi_volume("a", "d.example").phase("Bound").build();
        csi.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
        let mut block = testing::csi_volume("b", "d.example")
            .phase("Available")
            .build();
        block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let mut host = testing::volume("c").phase("Released").build();
        host.spec.as_mut().unwrap().host_path = Some(Default::default());
        let mut bound = testing::claim("c1", "a");
        bound.metadata.namespace = Some("ns".into());
        bound.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
        bound.spec.as_mut().unwrap().volume_attributes_class_name = Some("gold".into());
        bound.status = Some(k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        });
        let pending = testing::claim("c2", "");
        let counts = count([&csi, &block, &host], [&bound, &pending]);
        let s = String::from;
        assert_eq!(
            counts.total_pv,
            BTreeMap::from([
                ((s("kubernetes.io/csi:d.example"), s("Block")), 1),
                ((s("kubernetes.io/csi:d.example"), s("Filesystem")), 1),
                ((s("kubernetes.io/host-path"), s("Filesystem")), 1),
            ])
        );
        assert_eq!(counts.bound_pv, BTreeMap::from([(s("fast"), 1)]));
        assert_eq!(
            counts.unbound_pv,
            BTreeMap::from([(s(""), 2)]),
            "Available and Released"
        );
        assert_eq!(
            counts.bound_pvc,
            BTreeMap::from([((s("ns"), s("fast"), s("gold")), 1)])
        );
        assert_eq!(
            counts.unbound_pvc,
            BTreeMap::from([((s("default"), s(""), s("")), 1)])
        );
    }

    #[test]
    fn the_collector_reports_each_gauge_with_its_labels() {
        let (volumes, mut volume_writer) = kube::runtime::reflector::store();
        let (claims, _claim_writer) = kube::runtime::reflector::store();
        let mut pv = testing::csi_volume("a", "d.example").phase("Bound").build();
        pv.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
        volume_writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pv));
        let registry = prometheus::Registry::new();
        registry
            .register(Box::new(PvCollector::new(volumes, claims)))
            .unwrap();
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        for wanted in [
            r#"pv_collector_bound_pv_count{storage_class="fast"} 1"#,
            r#"pv_collector_total_pv_count{plugin_name="kubernetes.io/csi:d.example",volume_mode="Filesystem"} 1"#,
        ] {
            assert!(text.contains(wanted), "{wanted} missing from\n{text}");
        }
    }

    #[test]
    fn operations_are_timed_end_to_end_and_their_failures_counted_by_plugin() {
        let registry = prometheus::Registry::new();
        let ops = Operations::register(&registry).unwrap();
        ops.start("default/a", "u1", "d.example", "provision");
        // A second start for the same claim keeps the first (and its plugin).
        ops.start("default/a", "u1", "other.example", "provision");
        ops.failed("default/a");
        ops.finish("default/a");
        ops.start("pv-1", "v1", "", "delete");
        ops.finish("pv-1");
        ops.start("default/gone", "u2", "d.example", "provision");
        ops.forget("default/gone");
        // Deleted while the watches were away: the claim's provision is dropped, the volume's
        // delete observed; what still exists keeps its operation.
        ops.start("default/missed", "u3", "d.example", "provision");
        ops.start("pv-missed", "v2", "d.example", "delete");
        ops.start("default/kept", "u4", "d.example", "provision");
        ops.sweep(|claim| claim == "default/kept", |_| false);
        assert_eq!(ops.under_way(), 1);
        // The same name made again is a new object: its operation starts anew.
        ops.start("default/kept", "u5", "new.example", "provision");
        ops.finish("default/kept");
        // Nothing under way: neither observed nor counted.
        ops.finish("default/never");
        ops.failed("default/never");
        ops.error("d.example", "provision");
        assert_eq!(ops.under_way(), 0);
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        for wanted in [
            r#"volume_operation_total_seconds_count{operation_name="provision",plugin_name="d.example"} 1"#,
            r#"volume_operation_total_seconds_count{operation_name="delete",plugin_name="N/A"} 1"#,
            r#"volume_operation_total_seconds_count{operation_name="delete",plugin_name="d.example"} 1"#,
            r#"volume_operation_total_seconds_count{operation_name="provision",plugin_name="new.example"} 1"#,
            r#"volume_operation_total_errors{operation_name="provision",plugin_name="d.example"} 2"#,
            r#"volume_operation_total_seconds_bucket{operation_name="delete",plugin_name="N/A",le="600"} 1"#,
        ] {
            assert!(text.contains(wanted), "{wanted} missing from\n{text}");
        }
        assert!(!text.contains("other.example"), "{text}");
        assert_eq!(
            text.matches("volume_operation_total_seconds_count").count(),
            4,
            "the claims dropped or never started are not observed: {text}"
        );
    }

    #[test]
    fn retroactive_class_assignments_are_counted_under_kube_controller_managers_names() {
        let registry = prometheus::Registry::new();
        let counters = Retroactive::register(&registry).unwrap();
        counters.record(true);
        counters.record(true);
        counters.record(false);
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert!(
            text.contains("retroactive_storageclass_total 3"),
            "every attempt counts in the total: {text}"
        );
        assert!(
            text.contains("retroactive_storageclass_errors_total 1"),
            "{text}"
        );
    }
}
