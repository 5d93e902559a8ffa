//! `keiro list --attr` and `keiro show`: finding runs by their search attributes, and seeing a
//! run's attributes.

use std::process::{Command, Output};

use keiro::queue::StartOptions;
use keiro::Keiro;
use keiro_tests::pg::TestDb;
use keiro_tests::TestResult;

fn keiro_cmd(db: &TestDb, args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        .args(["--database-url", db.url(), "--schema", db.schema()])
        .args(args)
        .output()
}

fn stdout_of(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test]
async fn list_finds_runs_by_attribute_and_show_prints_them() -> TestResult {
    let db = TestDb::new().await;
    let keiro = Keiro::builder(db.store()).without_push().build();
    for (id, customer, amount) in [
        ("o-1", "acme", 1200),
        ("o-2", "acme", 300),
        ("o-3", "globex", 5000),
    ] {
        let options = StartOptions::default()
            .attribute("customer", customer)
            .attribute("amount", amount);
        keiro.start_with("order", id, &1, &options).await?;
    }
    keiro.start("order", "bare", &1).await?;

    let found = stdout_of(&keiro_cmd(
        &db,
        &["list", "--attr", "customer=acme", "--attr", "amount>=1000"],
    )?);
    assert!(found.contains("o-1"), "{found}");
    assert!(
        !found.contains("o-2") && !found.contains("o-3") && !found.contains("bare"),
        "{found}"
    );
    assert!(found.contains("{amount=1200 customer=acme}"), "{found}");
    assert!(found.contains("1 row(s)"), "{found}");

    let json = stdout_of(&keiro_cmd(
        &db,
        &["list", "--attr", "customer=acme", "--json"],
    )?);
    let page: serde_json::Value = serde_json::from_str(&json)?;
    assert_eq!(
        page["instances"].as_array().map(Vec::len),
        Some(2),
        "{json}"
    );
    assert_eq!(
        page["instances"][0]["attributes"]["customer"],
        serde_json::json!({"type": "text", "value": "acme"})
    );

    let bad = keiro_cmd(&db, &["list", "--attr", "customer>acme"])?;
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("numbers or times"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    let show = stdout_of(&keiro_cmd(&db, &["show", "order", "o-3"])?);
    assert!(show.contains("attributes   2"), "{show}");
    assert!(show.contains("customer"), "{show}");
    assert!(show.contains("int   5000"), "{show}");
    Ok(())
}
