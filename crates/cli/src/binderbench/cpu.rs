//! Where a run's CPU went: each process's CPU seconds (user + system, from `/proc`) between
//! the clock's start and the moment every claim was Bound.

use std::collections::BTreeMap;
use std::time::Duration;

/// The CPU seconds each process had used when the clock started.
#[derive(Debug, Default)]
pub(super) struct CpuMeter {
    before: BTreeMap<u32, (String, f64)>,
}

/// One process's share of a run.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Used {
    /// The name it was started under (processes of one name are added up).
    pub(super) name: String,
    /// CPU seconds since the clock started.
    pub(super) seconds: f64,
}

impl CpuMeter {
    /// Reads every process's CPU seconds now; `processes` are (name, pid).
    pub(super) fn start(processes: &[(String, u32)]) -> Self {
        CpuMeter {
            before: read(processes),
        }
    }

    /// The CPU seconds each process used since [`CpuMeter::start`], by name, most first; a
    /// process started since counts all its CPU, one that is gone is left out.
    pub(super) fn since(&self, processes: &[(String, u32)]) -> Vec<Used> {
        used(&self.before, &read(processes))
    }
}

/// pid to (name, CPU seconds) of the processes still there.
fn read(processes: &[(String, u32)]) -> BTreeMap<u32, (String, f64)> {
    processes
        .iter()
        .filter_map(|(name, pid)| Some((*pid, (name.clone(), crate::bench::cpu_seconds(*pid)?))))
        .collect()
}

/// The CPU each named process used between two readings (the stack's per-thread
/// [`cpu_since`](crate::embedded::lanes::cpu_since), which also ignores a reused pid), most first.
fn used(before: &BTreeMap<u32, (String, f64)>, now: &BTreeMap<u32, (String, f64)>) -> Vec<Used> {
    let mut out: Vec<Used> = crate::embedded::lanes::cpu_since(before, now)
        .into_iter()
        .map(|(name, seconds)| Used { name, seconds })
        .collect();
    out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    out
}

/// The line the bench prints: each process's CPU seconds, the total, and how much of the
/// machine's `cores` that kept busy over `elapsed`.
pub(super) fn line(used: &[Used], elapsed: Duration, cores: usize) -> String {
    let total: f64 = used.iter().map(|u| u.seconds).sum();
    let each: Vec<String> = used
        .iter()
        .map(|u| format!("{} {:.2}", u.name, u.seconds))
        .collect();
    let busy = total / elapsed.as_secs_f64().max(1e-9);
    format!(
        "CPU-s from the clock to all Bound: {} (total {total:.2} in {:.1} s: {busy:.2} of {cores} cores)",
        each.join(", "),
        elapsed.as_secs_f64(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_are_counted_from_the_start_added_up_by_name_and_sorted() {
        let named = |name: &str, seconds: f64| (name.to_string(), seconds);
        let before = BTreeMap::from([
            (10, named("kube-apiserver", 5.0)),
            (11, named("volstack", 1.0)),
            (12, named("volstack", 2.0)),
        ]);
        let now = BTreeMap::from([
            (10, named("kube-apiserver", 12.5)),
            (11, named("volstack", 1.5)),
            (12, named("volstack", 2.25)),
            // Started after the clock: all its CPU counts.
            (13, named("csi-provisioner", 0.75)),
        ]);
        let got = used(&before, &now);
        let want = [
            ("kube-apiserver", 7.5),
            ("csi-provisioner", 0.75),
            ("volstack", 0.75),
        ];
        assert_eq!(
            got.iter()
                .map(|u| (u.name.as_str(), u.seconds))
                .collect::<Vec<_>>(),
            want
        );
        assert_eq!(
            line(&got, Duration::from_secs(4), 2),
            "CPU-s from the clock to all Bound: kube-apiserver 7.50, csi-provisioner 0.75, volstack 0.75 (total 9.00 in 4.0 s: 2.25 of 2 cores)"
        );
    }

    #[test]
    fn this_process_is_measured_and_one_not_there_left_out() {
        let me = std::process::id();
        let meter = CpuMeter::start(&[("me".to_string(), me)]);
        // Burn a little CPU, then look: the figure is there and not negative.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        let got = meter.since(&[("me".to_string(), me), ("gone".to_string(), u32::MAX)]);
        assert_eq!(got.len(), 1, "a process that is not there is left out");
        assert_eq!(got[0].name, "me");
        assert!(got[0].seconds >= 0.0);
    }
}
