//! The benchmark command runs end to end, judges the end state and draws its charts (figures
//! are printed, not asserted: speed is measured by running it, not by tests).

#![allow(clippy::unwrap_used)]

/// Runs `volstack bench` with `args`; fails the test with its output unless it succeeds.
fn bench(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_volstack"))
        .arg("bench")
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_benchmark_runs_and_checks_its_end_state() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("results.json");
    let stdout = bench(&[
        "--claims=20",
        "--scenarios=storm,steady",
        "--rate=20",
        "--duration=1s",
        &format!("--chart-dir={}", dir.path().display()),
        &format!("--output={}", output.display()),
    ]);
    assert!(
        stdout.contains("end state                  correct"),
        "{stdout}"
    );
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&output).unwrap()).unwrap();
    let storm = &results[0];
    assert_eq!(storm["scenario"], "storm");
    assert_eq!(storm["correct"], true);
    assert_eq!(storm["claims"], 20);
    assert!(
        storm["writes_per_deleted_volume"].as_f64().unwrap() <= 2.0 + 1e-9,
        "{storm}"
    );
    // Requests are counted by verb and resource.
    let per = &storm["requests_per_provisioned_volume"];
    let pvs = per["CREATE persistentvolumes"].as_f64().unwrap();
    let events = per["CREATE events"].as_f64().unwrap();
    assert!(
        pvs >= 1.0 && events >= 1.0,
        "a PV and an event per volume: {storm}"
    );
    assert!(
        storm["requests_per_deleted_volume"]["DELETE persistentvolumes"]
            .as_f64()
            .unwrap()
            >= 1.0,
        "{storm}"
    );
    let steady = &results[1];
    assert_eq!(steady["scenario"], "steady");
    assert_eq!(steady["claims"], 20, "rate 20/s for 1 s");
    assert_eq!(steady["correct"], true);
    for name in ["bench-storm.png", "bench-steady.png"] {
        let png = std::fs::read(dir.path().join(name)).unwrap();
        assert_eq!(&png[1..4], b"PNG", "{name}");
    }
}

#[test]
fn unknown_scenarios_and_rates_are_refused() {
    for args in [
        &["bench", "--scenarios=nope"][..],
        &["bench", "--rate=0"][..],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_volstack"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(args[1].split('=').next().unwrap()),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn the_pool_scenario_serves_every_claim_from_the_warm_pool() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("pool.json");
    bench(&[
        "--scenarios=pool",
        "--rate=20",
        "--duration=1s",
        "--pool-minimum=25",
        "--create-latency=200ms",
        "--pool-creates=25",
        &format!("--pool-output={}", output.display()),
    ]);
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&output).unwrap()).unwrap();
    assert_eq!(r["problems"], serde_json::json!([]), "{r}");
    assert_eq!(r["dynamic"]["claims"], 20);
    assert_eq!(
        r["dynamic"]["from_pool"], 0,
        "no pool in the first run: {r}"
    );
    assert_eq!(r["pool"]["claims"], 20);
    assert_eq!(
        r["pool"]["from_pool"], 20,
        "a pool of 25 serves 20 claims: {r}"
    );
    assert_eq!(r["pool_maximum"], 45);
    // A claim cannot bind before CreateVolume returns: the injected latency is a floor.
    assert!(r["dynamic"]["p50_ms"].as_f64().unwrap() >= 200.0, "{r}");
    assert_eq!(r["create_volume_latency_ms"], 200);
}
