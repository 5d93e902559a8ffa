//! `keiro bench --phases` (issue 39 §1): a direct run prints where its calls' time went, lane by
//! lane, with the server's split, and carries the same in its JSON line. Speed is never
//! asserted: a small run measures nothing; the shape and the bookkeeping are checked.

use std::process::Command;

use keiro_tests::pg::TestDb;
use keiro_tests::TestResult;
use serde_json::Value;

#[tokio::test]
async fn a_direct_run_with_phases_splits_each_lane_call_and_reads_the_server() -> TestResult {
    let db = TestDb::new().await;
    let output = Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        .args([
            "--database-url",
            db.url(),
            "bench",
            "--bench-schema",
            db.schema(),
        ])
        .args(["--mode", "direct", "-n", "40", "-c", "8", "--phases"])
        .output()?;
    let stdout = String::from_utf8(output.stdout)?;
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "bench: phases: append: ",
        "bench: phases: the runs' lane calls in flight: ",
        "bench: phases: server: keiro_journal_append_batch executed ",
        "bench: phases: server: WAL flushes ",
    ] {
        assert!(stdout.contains(line), "no `{line}` in:\n{stdout}");
    }
    let json: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())?;
    let phases = &json["phases"];
    let lanes = phases["lanes"].as_array().expect("lanes");
    let calls: u64 = lanes.iter().map(|l| l["calls"].as_u64().unwrap_or(0)).sum();
    // 40 runs of three steps: a direct start and three appends each (the last with the
    // completion), every one through a lane.
    assert_eq!(calls, 40 * 4, "{phases}");
    for lane in lanes {
        let part = |key: &str| lane[key].as_f64().expect(key);
        // A call's queue ends before its answer does; the hand-off is what the call took
        // beyond its queue and statement (none when the caller was answered while the batch
        // was still answering the others).
        assert!(part("queue_ms") <= part("call_ms"), "{lane}");
        assert!(
            part("statement_ms") > 0.0 && part("hand_off_ms") >= 0.0,
            "{lane}"
        );
        let whole = part("queue_ms") + part("statement_ms") + part("hand_off_ms");
        assert!(whole >= part("call_ms") - 0.001, "{lane}");
    }
    assert!(phases["outside_ms_per_call"].as_f64().is_some(), "{phases}");
    let functions = phases["server"]["functions"].as_array().expect("functions");
    assert!(
        functions
            .iter()
            .any(|f| f["name"] == "keiro_journal_append_batch"
                || f["name"] == "keiro_journal_append_to"),
        "{phases}"
    );
    Ok(())
}
