//! `keiro stream NAME ID KEY`: prints a workflow's stream, one JSON line per item
//! (`{"offset": n, "value": ...}`), from an offset; with `--follow`, it goes on printing items
//! as the run writes them until the run closes the stream or ends.

use std::io::Write;

use clap::Args;
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::common::{Global, Outcome, Result, ResultExt};
use crate::ops::{keiro, KeyArgs};

/// Which stream, from where, and whether to follow it.
#[derive(Debug, Clone, Args)]
pub(crate) struct StreamArgs {
    #[command(flatten)]
    pub(crate) key: KeyArgs,
    /// The stream's key, as the workflow writes it (`ctx.write_stream(KEY, ..)`).
    pub(crate) stream: String,
    /// The first offset to print: the last one seen + 1 to go on where a reader stopped.
    #[arg(long, default_value_t = 0)]
    pub(crate) from: u64,
    /// Go on printing new items until the run closes the stream or ends; without it, print
    /// what is there now and stop.
    #[arg(long)]
    pub(crate) follow: bool,
}

/// `keiro stream`: prints the items, one JSON line each, flushed per line so a pipe sees
/// them at once.
pub(crate) async fn run(global: &Global, args: &StreamArgs) -> Result<Outcome> {
    let keiro = keiro(global).await?;
    let what = format!(
        "stream {:?} of {}/{}",
        args.stream, args.key.name, args.key.id
    );
    if !args.follow {
        return print_now(&keiro, args, &what).await;
    }
    let mut items = keiro
        .read_stream::<Value>(&args.key, &args.stream, args.from)
        .context(format!("reading {what}"))?;
    let mut out = std::io::stdout().lock();
    while let Some(item) = items.next().await {
        let (offset, value) = item.context(format!("reading {what}"))?;
        line(&mut out, offset, value)?;
    }
    Ok(Outcome::Success)
}

/// Without `--follow`: the items there now, page by page, then stop.
async fn print_now(keiro: &keiro::Keiro, args: &StreamArgs, what: &str) -> Result<Outcome> {
    let mut out = std::io::stdout().lock();
    let mut from = args.from;
    loop {
        let page = keiro
            .stream_page(&args.key, &args.stream, from)
            .await
            .context(format!("reading {what}"))?;
        let Some(page) = page else {
            eprintln!("no instance {}/{}", args.key.name, args.key.id);
            return Ok(Outcome::Failed);
        };
        let Some(last) = page.items.last().map(|item| item.offset) else {
            return Ok(Outcome::Success);
        };
        for item in page.items {
            line(&mut out, item.offset, item.value)?;
        }
        from = last + 1;
    }
}

fn line(out: &mut impl Write, offset: u64, value: Value) -> Result<()> {
    writeln!(out, "{}", json!({ "offset": offset, "value": value }))
        .and_then(|()| out.flush())
        .context("writing to stdout")
}
