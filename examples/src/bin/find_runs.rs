//! Finding runs by their search attributes: orders start with a customer and an amount
//! (`StartOptions::attribute`), each run marks its stage as it goes (`ctx.set_attributes`), and
//! the list finds them by equality and by range, combined with the other filters. Run it again:
//! the starts find their runs, and the answers are the same.

use keiro::operate::{AttrFilter, AttrOp, ListRequest};
use keiro::queue::StartOptions;
use keiro::workflow::Attributes;
use keiro::{Ctx, Keiro, WorkflowError};

/// Ships an order: marks it `stage = shipped` once the (pretend) shipment went out.
async fn order(ctx: Ctx, sku: u32) -> Result<u32, WorkflowError> {
    let parcel = ctx
        .step("ship", || async move { Ok::<_, String>(sku * 10) })
        .await?;
    ctx.set_attributes(
        &Attributes::new()
            .with("stage", "shipped")
            .with("parcel", parcel),
    )
    .await?;
    Ok(parcel)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut config = keiro::postgres::Config::new(url);
    config.schema = "keiro_find_runs".into();
    let keiro = Keiro::connect(config).await?; // migrates

    for (id, customer, amount) in [
        ("order-1", "acme", 1_200),
        ("order-2", "acme", 300),
        ("order-3", "globex", 5_000),
    ] {
        let options = StartOptions::default()
            .attribute("customer", customer)
            .attribute("amount", amount)
            .attribute("region", "eu");
        keiro.start_with("order", id, &7_u32, &options).await?;
    }
    keiro
        .worker()
        .register("order", order)
        .build()?
        .drain()
        .await?;

    // The same filters as `keiro list --attr customer=acme --attr 'amount>=1000'`.
    let request = ListRequest::from_pairs([("attr", "customer=acme"), ("attr", "amount>=1000")])?;
    for row in keiro.list(&request).await?.instances {
        let stage = row.attributes.get("stage").map(ToString::to_string);
        println!(
            "{} {} stage {}",
            row.key,
            row.status,
            stage.unwrap_or_default()
        );
    }
    // Or typed, with the other filters and the keyset cursor as usual.
    let mut request = ListRequest::default();
    request.filter.name = Some("order".parse()?);
    request.filter.attributes = vec![
        AttrFilter::eq("stage", "shipped"),
        AttrFilter::new("amount", AttrOp::Lt, 1_000),
    ];
    let page = keiro.list(&request).await?;
    println!(
        "shipped under 1000: {:?}",
        page.instances
            .iter()
            .map(|r| r.key.to_string())
            .collect::<Vec<_>>()
    );
    for (name, value) in keiro.attributes(("order", "order-3")).await?.iter() {
        println!("order-3 {name} = {value} ({})", value.kind());
    }
    Ok(())
}
