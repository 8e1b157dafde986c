//! The figures of a provisioning run by name, and their median and spread over `--repeat`
//! runs (also what `--compare` sets side by side).

use super::Report;

/// A figure: its name, its value, its unit.
pub(super) type Figure = (String, f64, &'static str);

/// The figures of one run, in the order they are printed.
pub(super) fn figures(r: &Report) -> Vec<Figure> {
    let mut out: Vec<Figure> = vec![
        ("all Bound after".into(), r.seconds_to_all_bound, "s"),
        ("volumes per second".into(), r.volumes_per_second, "/s"),
        ("claim-to-PV latency p50".into(), r.latency_p50_ms, "ms"),
        ("claim-to-PV latency p99".into(), r.latency_p99_ms, "ms"),
        (
            "bound per second, first half".into(),
            r.bound_rate_halves.0,
            "/s",
        ),
        (
            "bound per second, second half".into(),
            r.bound_rate_halves.1,
            "/s",
        ),
        ("all deleted after".into(), r.seconds_to_all_deleted, "s"),
        (
            "deleted per second, first half".into(),
            r.deleted_rate_halves.0,
            "/s",
        ),
        (
            "deleted per second, second half".into(),
            r.deleted_rate_halves.1,
            "/s",
        ),
        ("provisioner peak RSS".into(), r.peak_rss_mib, "MiB"),
        ("provisioner CPU".into(), r.cpu_seconds, "s"),
        (
            "writes per provisioned volume".into(),
            r.writes_per_provisioned_volume,
            "",
        ),
        (
            "writes per deleted volume".into(),
            r.writes_per_deleted_volume,
            "",
        ),
    ];
    for (phase, by_process) in [
        ("provisioning", &r.cpu_seconds_provisioning),
        ("deleting", &r.cpu_seconds_deleting),
    ] {
        out.extend(
            by_process
                .iter()
                .map(|(name, s)| (format!("CPU {phase}: {name}"), *s, "s")),
        );
    }
    out
}

/// Median (the mean of the middle two for an even count), minimum and maximum.
pub(super) fn median_spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    let median = if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    };
    Some((median, sorted[0], sorted[sorted.len() - 1]))
}

/// Each figure's median, minimum and maximum over `runs` (figures missing from a run, such as
/// a process the older results did not report, are left out of that figure's set).
pub(super) fn summarize(runs: &[Report]) -> Vec<(String, &'static str, (f64, f64, f64))> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let all: Vec<Vec<Figure>> = runs.iter().map(figures).collect();
    figures(first)
        .into_iter()
        .filter_map(|(name, _, unit)| {
            let values: Vec<f64> = all
                .iter()
                .filter_map(|f| f.iter().find(|(n, _, _)| *n == name).map(|f| f.1))
                .collect();
            median_spread(&values).map(|m| (name, unit, m))
        })
        .collect()
}

/// The run whose time to all Bound is the median (the lower one of an even count).
pub(super) fn median_run(runs: &[&Report]) -> Option<Report> {
    let mut sorted: Vec<&Report> = runs.to_vec();
    sorted.sort_by(|a, b| a.seconds_to_all_bound.total_cmp(&b.seconds_to_all_bound));
    sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .map(|r| (*r).clone())
}

/// Prints the median and spread of each figure.
pub(super) fn print(runs: &[Report]) {
    let Some(first) = runs.first() else {
        return;
    };
    println!(
        "scenario {}: median (min to max) of {} runs",
        first.scenario,
        runs.len()
    );
    for (name, unit, (median, min, max)) in summarize(runs) {
        println!("  {name:<44} {median:>10.2} {unit:<4} ({min:.2} to {max:.2})");
    }
}

/// Events per second in the first and the second half of `times` (seconds since the phase
/// began, sorted): the first half runs from the start to its last event, the second from there
/// to the last event. Zeros when there are fewer than two events.
pub(super) fn half_rates(times: &[f64]) -> (f64, f64) {
    let n = times.len();
    if n < 2 {
        return (0.0, 0.0);
    }
    let mid = n / 2;
    let (at_mid, last) = (times[mid - 1], times[n - 1]);
    let rate = |count: usize, seconds: f64| {
        if seconds > 0.0 {
            count as f64 / seconds
        } else {
            0.0
        }
    };
    (rate(mid, at_mid), rate(n - mid, last - at_mid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        assert_eq!(median_spread(&[3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(median_spread(&[4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0)));
        assert_eq!(median_spread(&[f64::NAN]), None);
        assert_eq!(median_spread(&[]), None);
    }

    #[test]
    fn the_median_run_is_picked_by_its_time_to_all_bound() {
        let run = |run, seconds| Report {
            run,
            seconds_to_all_bound: seconds,
            ..Report::default()
        };
        let runs = [run(1, 3.0), run(2, 1.0), run(3, 2.0)];
        let refs: Vec<&Report> = runs.iter().collect();
        assert_eq!(median_run(&refs).map(|r| r.run), Some(3));
        let summary = summarize(&runs);
        let bound = summary.iter().find(|s| s.0 == "all Bound after");
        assert_eq!(bound.map(|s| s.2), Some((2.0, 1.0, 3.0)));
    }

    #[test]
    fn half_rates_split_the_events_by_count() {
        // 4 events: the first two by 1 s (2/s), the last two in the 3 s after (2 in 3 s).
        let (first, second) = half_rates(&[0.5, 1.0, 2.0, 4.0]);
        assert!((first - 2.0).abs() < 1e-9, "{first}");
        assert!((second - 2.0 / 3.0).abs() < 1e-9, "{second}");
        // A slowdown shows as a lower second half.
        let (first, second) = half_rates(&[0.1, 0.2, 0.3, 10.3]);
        assert!(second < first);
        assert_eq!(half_rates(&[1.0]), (0.0, 0.0));
        assert_eq!(half_rates(&[]), (0.0, 0.0));
    }
}
