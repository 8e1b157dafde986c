//! The benchmark command runs end to end and judges the end state (figures are printed, not
//! asserted: speed is measured by running it, not by tests).

#![allow(clippy::unwrap_used)]

#[test]
fn the_benchmark_runs_and_checks_its_end_state() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("results.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_volstack"))
        .args([
            "bench",
            "--claims=20",
            "--scenarios=storm",
            &format!("--output={}", output.display()),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    assert!(
        storm["requests_per_provisioned_volume"]["CREATE"]
            .as_f64()
            .unwrap()
            >= 2.0,
        "a PV and an event per volume: {storm}"
    );
}

#[test]
fn unknown_scenarios_are_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_volstack"))
        .args(["bench", "--scenarios=nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--scenarios"));
}
