//! Push wake-ups: one `LISTEN` connection per store, fanned out to every subscription.
//!
//! # Design
//!
//! ```text
//!   first subscribe ──► spawn listener ──► connect ──► LISTEN "<schema>.wake" ──► Reconnected
//!                             ▲                                                      │
//!                             │ backoff 100 ms … 5 s                                 ▼
//!                             └──────── connection lost ◄──── forward payloads as Instance / Timer / Remote
//! ```
//!
//! The database is authoritative for what is runnable and when timers are due; a notification
//! only tells a loop to look now instead of at its next poll. So nothing here needs to be
//! reliable, only prompt: the listener forwards each payload of the wake channel (`timer`,
//! `remote`, or `<name>/<id>` for an instance) into a `tokio::sync::broadcast`, and each subscription
//! filters it. Notifications sent while the listener is not listening are lost, so every
//! time it (re)establishes `LISTEN` it broadcasts `Reconnected`, and the loops poll at once.
//! A `done:<name>/<id>` payload (an instance closed, migration 0016) is not broadcast: it wakes
//! only the result waiters of that instance ([`ClosedWaiters`]), so callers awaiting results
//! share this one connection without waking each other or the loops. A `msg:<name>/<id>`
//! payload (the instance set an event or wrote to a stream, message.sql) wakes only the
//! readers of that instance, in a second registry; a `done:` wakes them too.
//! That includes the first connection: a subscription exists before the `LISTEN` takes
//! effect, and what was sent in between is missed.
//!
//! A connection can die without either end hearing of it: a NAT or a load balancer that drops
//! an idle flow leaves the listener waiting on a socket nothing will ever arrive on, and every
//! wake then waits for the loops' fallback poll. So the connection has TCP keepalives (a peer
//! that is gone), and the listener makes a round trip on it every
//! [`Config::listen_check_interval`] (a path that went silent, which keepalives answered by a
//! middlebox do not reveal): a check unanswered within [`Config::listen_check_timeout`], or
//! failing, ends the session like a lost connection, so the listener reconnects and the loops
//! hear `Reconnected`.
//!
//! The listener uses its own connection, not a pooled one: it is held for the store's lifetime
//! and must never be recycled into a store operation. It runs as a task on the runtime of the
//! first subscription (or of the first wait, when subscribing outside a runtime) and holds no
//! handle of the store: the store holds the only sender of a stop signal, so the task ends,
//! closing its connection, when the last [`PgStore`] clone is dropped. Its statements (the
//! `LISTEN` and the checks) are not counted in [`PgStore::round_trips`].

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use keiro_journal::Backoff;
use keiro_journal::InstanceKey;
use keiro_resume::{
    BroadcastWake, ClosedOutcome, ClosedWaiters, Notifier, WakeFilter, WakeMessage, WakeReason,
    WakeSource,
};
use tokio::sync::{broadcast, oneshot};
use tokio_postgres::AsyncMessage;

use crate::store::WeakStore;
use crate::{Config, PgStore, TlsConnector};

/// How many notifications a subscription may fall behind before older ones are dropped; a
/// subscription that lagged counts as notified, so nothing but precision is lost.
const WAKE_BUFFER_LEN: usize = 256;

/// The payload `keiro_notify_timer` sends when a timer is armed.
const TIMER_PAYLOAD: &str = "timer";

/// The payload `keiro_notify_remote` sends when a remote task becomes claimable.
const REMOTE_PAYLOAD: &str = "remote";

/// The prefix of the payload `keiro_notify_terminal` (migration 0016) sends when an instance
/// closes: `done:<name>/<id>`. Names cannot contain `:`, so no instance payload starts so.
const CLOSED_PREFIX: &str = "done:";

/// The prefix of the payload `keiro_notify_message` (message.sql) sends when an instance sets
/// an event or writes to a stream: `msg:<name>/<id>`. Like `done:`, never an instance payload.
const MESSAGE_PREFIX: &str = "msg:";

/// The listener's reconnect delays: 100 ms after a lost connection, doubling with each failed
/// attempt up to 5 s, jittered so a fleet does not reconnect in lockstep after a database
/// restart.
const RECONNECT_BACKOFF: Backoff =
    Backoff::exponential(Duration::from_millis(100), Duration::from_secs(5));

/// TCP keepalives of the `LISTEN` connection: the first probe after 30 s without traffic, then
/// every 10 s, and the connection is given up after 3 unanswered ones, so a peer that vanished is
/// noticed within about a minute even between health checks. Shorter than the idle timeouts of
/// the usual NATs and load balancers (minutes), which the probes also keep from expiring.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 3;

/// The round trip of a health check: the cheapest statement that needs an answer.
const CHECK: &str = "SELECT 1";

/// How the listener connects and checks its connection.
#[derive(Clone)]
struct Settings {
    /// The pool's settings plus TCP keepalives.
    connection: tokio_postgres::Config,
    /// The pool's TLS: the LISTEN connection is encrypted and verified as the pool's are.
    tls: TlsConnector,
    check_interval: Duration,
    check_timeout: Duration,
}

impl Settings {
    fn new(config: &Config, connection: &tokio_postgres::Config, tls: &TlsConnector) -> Self {
        let mut connection = connection.clone();
        connection
            .keepalives(true)
            .keepalives_idle(KEEPALIVE_IDLE)
            .keepalives_interval(KEEPALIVE_INTERVAL)
            .keepalives_retries(KEEPALIVE_RETRIES);
        Self {
            connection,
            tls: tls.clone(),
            check_interval: config.listen_check_interval,
            check_timeout: config.listen_check_timeout,
        }
    }
}

/// One message of the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// An instance became runnable (any payload but `timer` and `remote`; an instance's
    /// always contains a `/`).
    Instance,
    /// A timer was armed.
    Timer,
    /// A remote task became claimable (dispatched, redispatched or requeued).
    Remote,
    /// The listener (re)started listening; notifications may have been missed.
    Reconnected,
}

impl Wake {
    fn from_payload(payload: &str) -> Self {
        match payload {
            TIMER_PAYLOAD => Self::Timer,
            REMOTE_PAYLOAD => Self::Remote,
            _ => Self::Instance,
        }
    }
}

impl WakeMessage for Wake {
    fn wakes(&self, filter: WakeFilter) -> Option<WakeReason> {
        let wanted = match self {
            Self::Instance => WakeFilter::Instances,
            Self::Timer => WakeFilter::Timers,
            Self::Remote => WakeFilter::RemoteTasks,
            Self::Reconnected => return Some(WakeReason::Reconnected),
        };
        (filter == wanted).then_some(WakeReason::Notified)
    }
}

/// The store's side of push notifications: the broadcast every subscription receives from,
/// and the stop signal of the running listener task.
pub(crate) struct Hub {
    sender: broadcast::Sender<Wake>,
    /// Result waiters by instance: a `done:` payload wakes only those of its instance.
    closed: ClosedWaiters,
    /// Readers of events and streams by instance: a `msg:` payload (and a `done:`, since a
    /// run that ends ends its streams) wakes only those of its instance.
    messages: ClosedWaiters,
    /// `Some` once a listener was spawned. Dropping it (with the store) stops the task; it
    /// reads as closed when the task is gone (its runtime shut down), so a later subscription
    /// starts a new one.
    stop: Mutex<Option<oneshot::Sender<()>>>,
    settings: Settings,
}

impl Hub {
    /// The hub of a store with `config`, whose pooled connections use `connection` and `tls`.
    pub(crate) fn new(
        config: &Config,
        connection: &tokio_postgres::Config,
        tls: &TlsConnector,
    ) -> Self {
        Self {
            sender: broadcast::channel(WAKE_BUFFER_LEN).0,
            closed: ClosedWaiters::default(),
            messages: ClosedWaiters::default(),
            stop: Mutex::new(None),
            settings: Settings::new(config, connection, tls),
        }
    }
}

impl PgStore {
    /// Spawns the listener task unless one is running; a no-op outside a tokio runtime (the
    /// subscription's first wait, which runs inside one, tries again).
    fn listener_start(&self) {
        let hub = self.wakes();
        // The guarded value is a plain handle, valid whatever a panicking holder did.
        let mut stop = hub.stop.lock().unwrap_or_else(PoisonError::into_inner);
        if stop.as_ref().is_some_and(|running| !running.is_closed()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let listener = listen(
            hub.settings.clone(),
            self.wake_channel().to_owned(),
            Outlets {
                sender: hub.sender.clone(),
                closed: hub.closed.clone(),
                messages: hub.messages.clone(),
            },
        );
        runtime.spawn(async move {
            tokio::select! {
                biased;
                // Sent never; the error means the store (the sender's only holder) is gone.
                _ = stop_rx => {}
                () = listener => {}
            }
        });
        *stop = Some(stop_tx);
    }
}

impl PgStore {
    /// Wakes this process's result waiters of `append`'s instance when the append (committed)
    /// closed it: a run driven by a worker of this process wakes its waiters here at once,
    /// without the round trip through the database's NOTIFY, and without its waiters having
    /// marked it awaited (see [`ClosedSubscription`]). Waiters in other processes still learn
    /// of it from the trigger's `done:` payload once marked.
    pub(crate) fn closed_here(&self, append: &keiro_journal::Append) {
        use keiro_journal::Event;
        // The marker's append is what set the row's status and output, in the same commit.
        let outcome = match &append.event {
            Event::WorkflowCompleted { output } => ClosedOutcome::Completed(output.clone()),
            Event::WorkflowFailed { reason } => ClosedOutcome::Failed(reason.clone()),
            Event::WorkflowCancelled => ClosedOutcome::Cancelled,
            _ => return,
        };
        self.wakes().closed.closed_with(&append.key, &outcome);
        self.wakes().messages.closed(&append.key);
    }

    /// Wakes this process's readers of `key`'s events and streams: a write of this store
    /// committed (readers elsewhere hear the `msg:` payload).
    pub(crate) fn messages_here(&self, key: &InstanceKey) {
        self.wakes().messages.closed(key);
    }

    /// A reader of `key`'s events and streams that marks the instance watched after
    /// `watch_after` without a wake from this process.
    fn message_subscription(
        &self,
        key: &InstanceKey,
        watch_after: Duration,
    ) -> Box<dyn WakeSource> {
        // Registered before the listener starts, so its first `Reconnected` reaches this one.
        let wait = self.wakes().messages.subscribe(key);
        self.listener_start();
        let store = self.downgrade();
        Box::new(MessageSubscription {
            key: key.clone(),
            watched: false,
            watch_after,
            unwatched_until: None,
            wait,
            store,
        })
    }
}

/// Where the listener sends what it hears: the loops' broadcast, the result waiters, and the
/// readers of events and streams.
struct Outlets {
    sender: broadcast::Sender<Wake>,
    closed: ClosedWaiters,
    messages: ClosedWaiters,
}

impl Outlets {
    /// Tells every subscription and every result waiter that notifications may have been
    /// missed. Nobody subscribed is fine: the next subscriber starts after this anyway.
    fn reconnected(&self) {
        let _ = self.sender.send(Wake::Reconnected);
        self.closed.reconnected();
        self.messages.reconnected();
    }
}

/// Listens forever, reconnecting with [`RECONNECT_BACKOFF`].
async fn listen(settings: Settings, channel: String, sender: Outlets) {
    // Failed attempts since the last established connection.
    let mut failures: u32 = 0;
    loop {
        let (listened, ended) = session(&settings, &channel, &sender).await;
        let error = ended.to_string();
        if listened {
            failures = 0;
            tracing::warn!(
                channel,
                error,
                "wake listener lost its connection; reconnecting"
            );
        } else {
            failures = failures.saturating_add(1);
            tracing::warn!(
                channel,
                error,
                failures,
                "wake listener cannot listen; retrying"
            );
        }
        tokio::time::sleep(RECONNECT_BACKOFF.delay_random(failures.saturating_add(1))).await;
    }
}

/// Why a session ended.
#[derive(Debug)]
enum Ended {
    /// The connection failed.
    Error(tokio_postgres::Error),
    /// The server closed the connection without an error.
    Closed,
    /// A health check went unanswered for this long: the connection is presumed dead.
    Unanswered(Duration),
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Error(error) => write!(f, "{error}"),
            Self::Closed => f.write_str("the server closed the connection"),
            Self::Unanswered(after) => {
                write!(f, "a health check went unanswered for {after:?}")
            }
        }
    }
}

/// One connection: connects, listens, broadcasts [`Wake::Reconnected`], then forwards
/// notifications and checks the connection every `check_interval` until it ends. Returns
/// whether it got to listen, and why it ended; dropping the client and the connection on the
/// way out closes the socket, dead or not.
async fn session(settings: &Settings, channel: &str, sender: &Outlets) -> (bool, Ended) {
    let (client, mut driver) = match settings.connection.connect(settings.tls.clone()).await {
        Ok(connected) => connected,
        Err(e) => return (false, Ended::Error(e)),
    };
    // The connection's messages: query responses are routed to `client` while this is polled,
    // notifications come out here.
    let mut messages = futures_util::stream::poll_fn(move |cx| driver.poll_message(cx));
    // The channel is an identifier (it contains a dot, so it is quoted); LISTEN takes no bind
    // parameter. It is `<schema>.wake` and the schema is a validated plain identifier.
    let statement = format!("LISTEN \"{channel}\"");
    // Bounded like a check: a connection that accepts the LISTEN and never answers is as dead.
    if let Err(ended) = round_trip(
        client.batch_execute(&statement),
        &mut messages,
        sender,
        settings.check_timeout,
    )
    .await
    {
        return (false, ended);
    }
    tracing::debug!(channel, "wake listener listening");
    sender.reconnected();
    let mut checks = tokio::time::interval_at(
        tokio::time::Instant::now() + settings.check_interval,
        settings.check_interval,
    );
    checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = messages.next() => {
                if let Err(ended) = received(sender, message) {
                    return (true, ended);
                }
            }
            _ = checks.tick() => {
                let check = client.simple_query(CHECK);
                if let Err(ended) =
                    round_trip(check, &mut messages, sender, settings.check_timeout).await
                {
                    return (true, ended);
                }
            }
        }
    }
}

/// Awaits `request` on the connection whose messages are `messages` (which must be polled for
/// the answer to arrive), forwarding the notifications that come meanwhile; at most `timeout`.
async fn round_trip<T>(
    request: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    messages: &mut (impl Stream<Item = Result<AsyncMessage, tokio_postgres::Error>> + Unpin),
    sender: &Outlets,
    timeout: Duration,
) -> Result<(), Ended> {
    tokio::pin!(request);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            result = &mut request => return result.map(drop).map_err(Ended::Error),
            message = messages.next() => received(sender, message)?,
            () = &mut deadline => return Err(Ended::Unanswered(timeout)),
        }
    }
}

/// Forwards what the connection yielded; its end or error ends the session.
fn received(
    sender: &Outlets,
    message: Option<Result<AsyncMessage, tokio_postgres::Error>>,
) -> Result<(), Ended> {
    match message {
        Some(Ok(message)) => {
            forward(sender, &message);
            Ok(())
        }
        Some(Err(e)) => Err(Ended::Error(e)),
        None => Err(Ended::Closed),
    }
}

/// Broadcasts a notification, or wakes the result waiters of an instance that closed; notices
/// and other messages are ignored.
fn forward(sender: &Outlets, message: &AsyncMessage) {
    if let AsyncMessage::Notification(notification) = message {
        let payload = notification.payload();
        if let Some(closed) = payload.strip_prefix(CLOSED_PREFIX) {
            if let Some(key) = closed_key(closed) {
                sender.closed.closed(&key);
                sender.messages.closed(&key);
            }
            return;
        }
        if let Some(written) = payload.strip_prefix(MESSAGE_PREFIX) {
            if let Some(key) = closed_key(written) {
                sender.messages.closed(&key);
            }
            return;
        }
        let _ = sender.sender.send(Wake::from_payload(payload));
    }
}

/// The instance of a `done:` payload's `<name>/<id>` (neither may contain `/`); `None` for one
/// no instance could have sent, which is ignored.
fn closed_key(payload: &str) -> Option<InstanceKey> {
    let (name, id) = payload.split_once('/')?;
    InstanceKey::parse(name, id).ok()
}

/// Push wake-ups over `LISTEN` on [`PgStore::wake_channel`].
///
/// The first subscription starts one listener connection for this store (all clones share
/// it); every subscription sees the notifications sent after it subscribed.
/// [`WakeFilter::Instances`] wakes on instance payloads, [`WakeFilter::Timers`] on timer
/// arms, [`WakeFilter::RemoteTasks`] on remote tasks becoming claimable. A wait returns [`WakeReason::Reconnected`] whenever the listener starts listening,
/// the first time included, because notifications sent before were missed: poll at once.
/// The listener reconnects by itself (100 ms doubling to 5 s) and stops with the last clone of
/// the store. Its connection has TCP keepalives and is checked with a round trip every
/// [`Config::listen_check_interval`]; one that stops answering is replaced, as a lost one is.
///
/// ```no_run
/// use std::time::Duration;
/// use keiro_postgres::{Config, PgStore};
/// use keiro_resume::{Notifier, WakeFilter, WakeReason};
///
/// # async fn demo() -> Result<(), keiro_postgres::Error> {
/// let store = PgStore::connect(Config::default()).await?;
/// let mut wakes = store.subscribe(WakeFilter::Instances);
/// loop {
///     match wakes.wait(Duration::from_secs(30)).await {
///         WakeReason::Notified => println!("something became runnable"),
///         WakeReason::Reconnected => println!("listening (again): poll now"),
///         WakeReason::Timeout => println!("fallback poll"),
///     }
/// }
/// # }
/// ```
impl Notifier for PgStore {
    fn subscribe(&self, filter: WakeFilter) -> Box<dyn WakeSource> {
        // Subscribed before the listener starts, so its first `Reconnected` reaches this one.
        let receiver = self.wakes().sender.subscribe();
        self.listener_start();
        // The listener may not have started (no runtime when subscribing): each wait tries
        // again, through a weak handle that does not keep the store alive.
        let store = self.downgrade();
        Box::new(BroadcastWake::new(filter, receiver).before_wait(move || {
            if let Some(store) = store.upgrade() {
                store.listener_start();
            }
        }))
    }

    /// Wakes when `key` sets an event, writes to or closes a stream, or closes (in this
    /// process at the commit; elsewhere by the `msg:` and `done:` payloads), or when the
    /// listener (re)connects. Every reader shares the store's one listener connection.
    ///
    /// Only a watched instance notifies its writes (migration 0023): a reader its own process
    /// has not woken for `WATCH_AFTER` (1 s, the reader's fallback poll) marks its instance
    /// watched (and awaited, so its close notifies too), then answers
    /// [`WakeReason::Notified`] so its caller reads again: a write committed before the mark
    /// notified nobody. A reader in the writing process, woken by each commit there, does not
    /// mark while the run writes, and the run's writes send no NOTIFY.
    fn subscribe_messages(&self, key: &InstanceKey) -> Box<dyn WakeSource> {
        self.message_subscription(key, WATCH_AFTER)
    }

    /// As [`subscribe_messages`](Self::subscribe_messages), but the reader marks its instance
    /// watched after `MARK_AFTER` (50 ms) without a wake from its own process, as a result
    /// waiter marks its instance awaited: a caller waiting for one event's value makes at most
    /// the run's later writes notify, where a stream's reader would make every item of a
    /// stream written in its own process pay a NOTIFY.
    fn subscribe_event(&self, key: &InstanceKey) -> Box<dyn WakeSource> {
        self.message_subscription(key, MARK_AFTER)
    }

    /// Wakes when `key` closes (in this process: a worker of this store completed it; or a
    /// `done:<name>/<id>` payload, sent by migration 0016's trigger when an awaited instance
    /// closes) or when the listener (re)connects. Every waiter of this store shares its one
    /// listener connection; a notification wakes only the waiters of its instance.
    ///
    /// The mark that makes a close notify (one UPDATE of the row, batched with the marks of
    /// the waiters that start at the same moment through the awaited lane) is lazy: the first
    /// waits give the run 50 ms from the first wait to close in this process, which
    /// wakes the waiter with no write at all (a service that starts a run and awaits it, served by its own worker);
    /// only then is the instance marked. The mark returns [`WakeReason::Notified`] at once when
    /// the instance is already closed, and a failed mark falls back to the plain fallback (it is
    /// tried again at the next wait).
    fn subscribe_closed(&self, key: &InstanceKey) -> Box<dyn WakeSource> {
        // Registered before the listener starts, so its first `Reconnected` reaches this one.
        let wait = self.wakes().closed.subscribe(key);
        self.listener_start();
        Box::new(ClosedSubscription {
            key: key.clone(),
            marked: false,
            unmarked_until: None,
            wait,
            store: self.downgrade(),
        })
    }
}

/// A reader of an instance's events and streams: its registration, and the store, to start the
/// listener if subscribing could not (no runtime then).
struct MessageSubscription {
    key: InstanceKey,
    /// Whether this reader marked its instance watched.
    watched: bool,
    /// How long it waits unmarked: [`WATCH_AFTER`] for a stream's reader, [`MARK_AFTER`] for
    /// a caller waiting for an event.
    watch_after: Duration,
    /// Until when it waits unmarked: `watch_after` after the first wait, or after the last
    /// wake-up.
    unwatched_until: Option<tokio::time::Instant>,
    wait: keiro_resume::ClosedWait,
    store: WeakStore,
}

/// How long a reader of events and streams goes without a wake-up from its own process before
/// it marks its instance watched, so that the instance's writes notify (message.sql): its
/// fallback poll. A reader in the process that runs the instance is woken by each write there
/// and does not mark while the run writes; one elsewhere reads by its poll until its mark.
pub(crate) const WATCH_AFTER: Duration = Duration::from_secs(1);

#[async_trait::async_trait]
impl WakeSource for MessageSubscription {
    async fn wait(&mut self, mut fallback: Duration) -> WakeReason {
        if let Some(store) = self.store.upgrade() {
            store.listener_start();
        }
        if !self.watched {
            let until = *self
                .unwatched_until
                .get_or_insert_with(|| tokio::time::Instant::now() + self.watch_after);
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if !left.is_zero() {
                let first = fallback.min(left);
                match self.wait.wait(first).await {
                    WakeReason::Timeout => fallback = fallback.saturating_sub(first),
                    woken => {
                        self.unwatched_until = None;
                        return woken;
                    }
                }
                if fallback.is_zero() {
                    return WakeReason::Timeout;
                }
            }
            if let Some(store) = self.store.upgrade() {
                match crate::ops::message::instance_watch(store.db(), &self.key).await {
                    Ok(live) => {
                        // Not live: nothing will notify; either way, read now (a write before
                        // the mark notified nobody).
                        self.watched = live;
                        return WakeReason::Notified;
                    }
                    // Only push is lost: the fallback still reads, and the next wait marks.
                    Err(error) => tracing::warn!(
                        key = %self.key,
                        error = %error,
                        "cannot mark an instance watched; its reader polls"
                    ),
                }
            }
        }
        self.wait.wait(fallback).await
    }
}

/// How long a result waiter waits for its run to close in this process before it marks the
/// instance awaited (so that a close elsewhere notifies it). A run served by a worker of this
/// process closes within it most of the time, and its waiter is woken here at no cost; a run
/// closed elsewhere within it is read at its end (the mark finds it closed).
pub(crate) const MARK_AFTER: Duration = Duration::from_millis(50);

/// A result waiter: its registration, whether its instance is marked awaited yet, and the
/// store, to mark it and to start the listener if subscribing could not (no runtime then).
struct ClosedSubscription {
    key: InstanceKey,
    marked: bool,
    /// Until when the waits go unmarked: [`MARK_AFTER`] after the first wait.
    unmarked_until: Option<tokio::time::Instant>,
    wait: keiro_resume::ClosedWait,
    store: WeakStore,
}

#[async_trait::async_trait]
impl WakeSource for ClosedSubscription {
    fn closed_outcome(&self) -> Option<ClosedOutcome> {
        self.wait.outcome()
    }

    fn fallback_floor(&self) -> Duration {
        self.wait.fallback_floor()
    }

    async fn wait(&mut self, mut fallback: Duration) -> WakeReason {
        if let Some(store) = self.store.upgrade() {
            store.listener_start();
            let unmarked_until = *self
                .unmarked_until
                .get_or_insert_with(|| tokio::time::Instant::now() + MARK_AFTER);
            let unmarked = unmarked_until.saturating_duration_since(tokio::time::Instant::now());
            if !self.marked && !unmarked.is_zero() {
                // Not held while waiting, as it is not while marking.
                drop(store);
                let first = fallback.min(unmarked);
                match self.wait.wait(first).await {
                    WakeReason::Timeout => fallback = fallback.saturating_sub(first),
                    woken => return woken,
                }
                if fallback.is_zero() {
                    return WakeReason::Timeout;
                }
            }
        }
        if let Some(store) = self.store.upgrade() {
            if !self.marked {
                match store
                    .lanes()
                    .instance_mark_awaited(store.db(), &self.key)
                    .await
                {
                    Ok(true) => self.marked = true,
                    // Closed already (or gone): nothing will notify; read now.
                    Ok(false) => return WakeReason::Notified,
                    // Only push is lost: the fallback still reads, and the next wait marks.
                    Err(error) => tracing::warn!(
                        key = %self.key,
                        error = %error,
                        "cannot mark an instance awaited; its waiter polls"
                    ),
                }
            }
        }
        self.wait.wait(fallback).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_reach_their_filters() {
        assert_eq!(Wake::from_payload("timer"), Wake::Timer);
        assert_eq!(Wake::from_payload("remote"), Wake::Remote);
        assert_eq!(Wake::from_payload("order/o-1"), Wake::Instance);
        // An instance named `remote` still has a `/` in its payload.
        assert_eq!(Wake::from_payload("remote/r-1"), Wake::Instance);
        let filters = [
            WakeFilter::Instances,
            WakeFilter::Timers,
            WakeFilter::RemoteTasks,
        ];
        for (wake, only) in [
            (Wake::Instance, WakeFilter::Instances),
            (Wake::Timer, WakeFilter::Timers),
            (Wake::Remote, WakeFilter::RemoteTasks),
        ] {
            for filter in filters {
                assert_eq!(
                    wake.wakes(filter),
                    (filter == only).then_some(WakeReason::Notified),
                    "{wake:?} {filter:?}"
                );
            }
        }
        for filter in filters {
            assert_eq!(
                Wake::Reconnected.wakes(filter),
                Some(WakeReason::Reconnected),
                "{filter:?}"
            );
        }
    }

    #[test]
    fn closed_payloads_name_their_instance() {
        let key = closed_key("order/o-1").unwrap();
        assert_eq!(key.to_string(), "order/o-1");
        assert!(closed_key("order").is_none());
        assert!(closed_key("order/").is_none());
    }

    #[test]
    fn reconnects_back_off_from_100_ms_to_5_s() {
        let exact = RECONNECT_BACKOFF.without_jitter();
        assert_eq!(exact.delay(1), Duration::from_millis(100));
        assert_eq!(exact.delay(2), Duration::from_millis(200));
        assert_eq!(exact.delay(10), Duration::from_secs(5));
        RECONNECT_BACKOFF.validate().unwrap();
    }

    #[test]
    fn the_listen_connection_has_keepalives_and_the_configured_checks() {
        let config = Config {
            listen_check_interval: Duration::from_secs(7),
            listen_check_timeout: Duration::from_secs(3),
            ..Config::default()
        };
        let pooled = config.connection_config().unwrap();
        let settings = Settings::new(&config, &pooled, &config.tls_connector().unwrap());
        assert!(settings.connection.get_keepalives());
        assert_eq!(settings.connection.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(
            settings.connection.get_keepalives_interval(),
            Some(KEEPALIVE_INTERVAL)
        );
        assert_eq!(
            settings.connection.get_keepalives_retries(),
            Some(KEEPALIVE_RETRIES)
        );
        // Otherwise the pool's: same server, schema and application name.
        assert_eq!(settings.connection.get_options(), pooled.get_options());
        assert_eq!(
            (settings.check_interval, settings.check_timeout),
            (Duration::from_secs(7), Duration::from_secs(3))
        );
    }

    #[tokio::test]
    async fn a_subscription_of_a_dropped_store_degrades_to_the_fallback() {
        let store = PgStore::connect_lazy(crate::Config::default()).unwrap();
        let mut wakes = store.subscribe(WakeFilter::Timers);
        drop(store);
        let fallback = Duration::from_millis(100);
        let before = tokio::time::Instant::now();
        assert_eq!(wakes.wait(fallback).await, WakeReason::Timeout);
        assert!(before.elapsed() >= fallback);
    }
}
