//! The message lane: the event and stream writes of concurrent runs (`ctx.set_event`,
//! `ctx.write_stream`, `ctx.close_stream`) share one transaction.
//!
//! A run that streams its progress writes one item per step, and each item is a commit the run
//! waits for before it goes on: alone, a run is bound by the commit's latency, and runs writing
//! side by side each pay a WAL flush of their own. The lane sends the writes that arrive while
//! its earlier batch is in flight as one call of `keiro_messages_write` (`ops::message`), which
//! runs each exactly as its own function would, in the instances' key order, and leaves a
//! write whose instance row another transaction holds to be sent alone; a write that arrives
//! alone takes its own function at once.

use std::sync::Arc;

use keiro_journal::store::{Append, Result, StreamOutcome};

use super::lane::{Batched, Lane};
use crate::db::Db;
use crate::ops::message::{self as op, MessageWrite, MESSAGES_WRITE};

/// One write with the append that journals it.
pub(super) struct MessageRequest {
    append: Append,
    write: MessageWrite,
}

impl Batched for MessageRequest {
    type Output = StreamOutcome;

    const OPERATION: &'static str = MESSAGES_WRITE;

    const NAME: &'static str = "message_write";

    async fn send_many(db: &Db, batch: &[Self]) -> Result<Vec<Option<Result<Self::Output>>>> {
        let writes: Vec<(&Append, &MessageWrite)> = batch
            .iter()
            .map(|request| (&request.append, &request.write))
            .collect();
        op::messages_write(db, &writes).await
    }

    async fn send_one(db: &Db, request: &Self) -> Result<Self::Output> {
        op::message_write(db, &request.append, &request.write).await
    }
}

/// One write through the message lane.
pub(super) async fn message_write(
    lane: &Lane<MessageRequest>,
    db: &Arc<Db>,
    append: &Append,
    write: MessageWrite,
) -> Result<StreamOutcome> {
    let request = MessageRequest {
        append: append.clone(),
        write,
    };
    lane.call(db, request).await
}
