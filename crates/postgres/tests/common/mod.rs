//! Helpers shared by the store's integration tests.

#![allow(dead_code)] // each test file uses a different subset

use std::time::Duration;

use futures_util::StreamExt;
use keiro_journal::{InstanceKey, StartRequest};
use keiro_postgres::PgStore;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

/// What a test returns: `?` works on every error.
pub(crate) type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Parses a key, for brevity.
pub(crate) fn key(name: &str, id: &str) -> InstanceKey {
    InstanceKey::parse(name, id).expect("test keys are valid")
}

/// A start request with `input` and no parent.
pub(crate) fn start(key: &InstanceKey, input: serde_json::Value) -> StartRequest {
    StartRequest {
        key: key.clone(),
        input,
        parent: None,
        priority: 0,
    }
}

/// A dedicated connection listening on a store's wake channel; payloads arrive on the receiver.
pub(crate) struct Listener {
    _client: tokio_postgres::Client,
    received: mpsc::UnboundedReceiver<(String, String)>,
}

impl Listener {
    /// Listens on `store`'s wake channel.
    pub(crate) async fn on(
        store: &PgStore,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let (client, mut connection) = store.connection_config().connect(NoTls).await?;
        let (sender, received) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    if sender
                        .send((n.channel().to_owned(), n.payload().to_owned()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        });
        // The channel contains a dot, so it must be quoted.
        client
            .batch_execute(&format!("LISTEN \"{}\"", store.wake_channel()))
            .await?;
        Ok(Self {
            _client: client,
            received,
        })
    }

    /// Every notification that arrives within `quiet` of the previous one (or of the call).
    pub(crate) async fn drain(&mut self, quiet: Duration) -> Vec<(String, String)> {
        let mut got = Vec::new();
        while let Ok(Some(n)) = tokio::time::timeout(quiet, self.received.recv()).await {
            got.push(n);
        }
        got
    }
}
