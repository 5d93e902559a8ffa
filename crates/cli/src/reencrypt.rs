//! `keiro reencrypt`: the payloads of a chosen set of runs sealed again with the current key of
//! `KEIRO_ENCRYPTION_KEYS` (`Keiro::reencrypt`), each run in a transaction of its own, so the
//! keys they were sealed with before can be retired. Runs are chosen by ids, or by workflow
//! name and status (every page of the list).

use clap::Args;
use keiro::operate::{ListRequest, LIST_LIMIT_MAX};
use keiro::InstanceKey;

use crate::common::{failure, keiro, Global, Outcome, Result, ResultExt};

/// Which runs `keiro reencrypt` rewrites.
#[derive(Debug, Clone, Args)]
pub(crate) struct ReencryptArgs {
    /// Only this workflow (required with --id).
    #[arg(long)]
    name: Option<String>,
    /// Only this status: running, suspended, completed, failed or cancelled.
    #[arg(long)]
    status: Option<String>,
    /// These instance ids of --name (repeat it); without it, every run the filters select.
    #[arg(long = "id")]
    ids: Vec<String>,
}

/// `keiro reencrypt`.
pub(crate) async fn run(global: &Global, args: &ReencryptArgs) -> Result<Outcome> {
    let keiro = keiro(global, 2).await?;
    if keiro.codec().is_none() {
        return Err(failure(
            "keiro reencrypt needs the keys: set KEIRO_ENCRYPTION_KEYS=kid:base64key,... \
             (the first key is the one payloads are sealed with again)",
        ));
    }
    let keys = match (&args.name, args.ids.is_empty()) {
        (Some(name), false) => args
            .ids
            .iter()
            .map(|id| InstanceKey::parse(name, id).context("reading --name and --id"))
            .collect::<Result<Vec<_>>>()?,
        (None, false) => return Err(failure("--id needs --name")),
        (_, true) => selected(&keiro, args).await?,
    };
    let (mut runs, mut payloads) = (0_u64, 0_u64);
    for key in &keys {
        let rewritten = keiro
            .reencrypt(key)
            .await
            .context(format!("re-encrypting {key}"))?;
        if rewritten > 0 {
            println!("{key}: {rewritten} payload(s) sealed again");
            runs += 1;
            payloads += rewritten;
        }
    }
    println!(
        "{payloads} payload(s) of {runs} run(s) sealed with the current key; {} run(s) looked at",
        keys.len()
    );
    Ok(Outcome::Success)
}

/// Every run the filters select, page by page.
async fn selected(keiro: &keiro::Keiro, args: &ReencryptArgs) -> Result<Vec<InstanceKey>> {
    let mut keys = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let limit = LIST_LIMIT_MAX.to_string();
        let mut pairs: Vec<(&str, &str)> = vec![("limit", &limit)];
        if let Some(name) = &args.name {
            pairs.push(("name", name));
        }
        if let Some(status) = &args.status {
            pairs.push(("status", status));
        }
        if let Some(cursor) = &cursor {
            pairs.push(("cursor", cursor));
        }
        let request = ListRequest::from_pairs(pairs).context("reading the filters")?;
        let page = keiro.list(&request).await.context("listing instances")?;
        keys.extend(page.instances.into_iter().map(|row| row.key));
        match page.next_cursor {
            Some(next) => cursor = Some(next.encode()),
            None => return Ok(keys),
        }
    }
}
