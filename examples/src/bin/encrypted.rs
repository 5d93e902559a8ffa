//! Payload encryption: a handle built with an AES-256-GCM codec seals every payload it stores
//! (the input, each step's result, the output), so a reader of the database sees ids, statuses
//! and step names but no customer data; its workers open them again. The keys come from
//! `KEIRO_ENCRYPTION_KEYS` (`kid:base64,...`, the first the current one) or, unset, a key made
//! for this run. The example then reads the same row through a handle without the key: the
//! input is a sealed envelope naming its key id.

use std::sync::Arc;
use std::time::Duration;

use keiro::codec::AesGcmCodec;
use keiro::{Ctx, Keiro, WorkflowError};

/// Charges a card and returns a receipt that names it.
async fn charge(ctx: Ctx, card: String) -> Result<String, WorkflowError> {
    let last4 = card[card.len().saturating_sub(4)..].to_owned();
    let receipt: String = ctx
        .step("charge", || async move {
            Ok::<_, std::io::Error>(format!("charged card ending {last4}"))
        })
        .await?;
    Ok(receipt)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut config = keiro::postgres::Config::new(url);
    config.schema = "keiro_encrypted".into();
    let store = keiro::postgres::PgStore::connect(config).await?;
    store.migrate().await?;

    let codec = match AesGcmCodec::from_env()? {
        Some(codec) => codec,
        None => AesGcmCodec::from_keys(&format!("k1:{}", AesGcmCodec::generate_key_text()))?,
    };
    let keiro = Keiro::builder(store.clone()).codec(Arc::new(codec)).build();

    let id = format!("order-{}", std::process::id());
    keiro.start("charge", &id, &"4242 4242 4242 4242").await?;
    keiro
        .worker()
        .register("charge", charge)
        .build()?
        .drain()
        .await?;
    let receipt: String = keiro
        .result(("charge", id.as_str()), Duration::from_secs(10))
        .await?;
    println!("with the key:    {receipt}");

    // The same row through a handle without the key: what the database holds.
    let bare = Keiro::builder(store).build();
    let row = bare
        .instance(("charge", id.as_str()))
        .await?
        .expect("the run's row");
    println!(
        "without the key: input sealed with key {:?}, status {}",
        keiro::codec::sealed_key_id(&row.input).unwrap_or("(none)"),
        row.status.as_str()
    );
    Ok(())
}
