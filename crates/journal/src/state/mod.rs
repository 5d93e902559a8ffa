//! The run's state: what one drive of a workflow body knows and has done, and the
//! mechanisms every context call shares over it.
//!
//! [`Run`] is the run a [`Ctx`](crate::Ctx) handle shares: its store, identity and options,
//! and [`State`] behind a lock: the replay model of the loaded journal ([`Replay`]), the halt
//! that stops the run ([`Halt`], first reason wins), what a suspension waits on, the counts
//! ([`RunStats`]) and the journal's size for the budget. The checks before a fresh call are a
//! plain function over it ([`fresh`]); the held-back last append ([`held_back`]) and the lease
//! heartbeat ([`heartbeat`]) are the run's, shared by every family of context calls.

pub(crate) mod fresh;
pub(crate) mod heartbeat;
pub(crate) mod held_back;
pub(crate) mod options;
pub(crate) mod race_marks;
pub(crate) mod replay;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;

use crate::model::budget::{journal_full, JournalSize};
use crate::store::contract::{self as store, Append, AppendOutcome, JournalStore, ParkOutcome};
use crate::{
    encode_payload, Event, Generation, InstanceKey, Marker, RunOptions, StepKind, WorkflowError,
};

use held_back::HeldBack;
use race_marks::RaceMarks;
use replay::Replay;

/// Counts of what a run did, for summaries and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Steps whose action ran (journal misses).
    pub executed: u64,
    /// Steps answered from the journal (journal hits).
    pub replayed: u64,
    /// Events this run appended (steps, patch decisions, markers).
    pub appended: u64,
}

/// Why a run stopped early; the first reason wins.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Halt {
    Terminal(Marker),
    LeaseLost,
    Store,
    Conflict {
        step: String,
    },
    NonDeterminism {
        step: String,
        detail: String,
    },
    ContinueAsNew {
        input: Value,
    },
    /// The run must fail at once with this reason: a value the store refused, or a step result
    /// found unstorable after its action ran (running the action again would not help).
    Fail {
        reason: String,
    },
    /// The run crashes (injected by [`Faults`](crate::faults::Faults)): retried like a failing step.
    Crash {
        message: String,
    },
}

impl Halt {
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Terminal(m) => format!("the instance is {}", m.kind_str()),
            Self::LeaseLost => "the lease was lost".into(),
            Self::Store => "a store call failed".into(),
            Self::Conflict { step } => format!("append of {step} conflicted"),
            Self::NonDeterminism { step, detail } => format!("non-determinism at {step}: {detail}"),
            Self::ContinueAsNew { .. } => "continuing as new".into(),
            Self::Fail { reason } => format!("the run fails: {reason}"),
            Self::Crash { message } => format!("the run crashed: {message}"),
        }
    }
}

/// The park at the end of a suspended run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parked {
    /// What the park did.
    pub outcome: ParkOutcome,
    /// The `wake_after` it wrote.
    pub wake_after: Option<OffsetDateTime>,
}

/// What one drive knows and has done (see the module docs).
pub(crate) struct State {
    pub(crate) replay: Replay,
    pub(crate) halt: Option<Halt>,
    pub(crate) store_error: Option<store::Error>,
    /// Awaited steps of a suspension, with the earliest natural deadline among them.
    pub(crate) awaiting: Vec<String>,
    pub(crate) wake_at: Option<OffsetDateTime>,
    /// Whether any await had no natural deadline (so the reconcile fallback applies).
    pub(crate) open_ended: bool,
    /// When the lease was last confirmed (a renewal, or an append's implicit one).
    pub(crate) last_confirmed: Instant,
    pub(crate) stats: RunStats,
    /// How many signal waits on each token this run has made, for their step names.
    pub(crate) signal_ordinals: std::collections::HashMap<String, u32>,
    /// How many writes of each event and stream key (`event:<key>`, `stream:<key>`) this run
    /// has made, for their step names.
    pub(crate) message_ordinals: std::collections::HashMap<String, u32>,
    /// The stream items and their encoded bytes this generation wrote so far (replayed and
    /// fresh), for the per-generation stream budget.
    pub(crate) stream_written: (u64, u64),
    /// The answer steps of the updates this run answered (replayed and fresh), so a second
    /// answer to one update is refused.
    pub(crate) updates_answered: std::collections::HashSet<String>,
    /// The park at the end of the run, if it parked.
    pub(crate) parked: Option<Parked>,
    /// Remote steps armed but not yet written: they go with the park, or before the body's
    /// next other fresh action.
    pub(crate) deferred: Vec<crate::RemoteArm>,
    /// Step actions running now (concurrent branches of a `join`): while one runs, a remote
    /// step is dispatched at once instead of waiting for the park.
    pub(crate) actions_running: u32,
    /// Actions holding the instance row locked in their own transaction, fenced
    /// ([`StepJournal::hold_lease`](crate::ctx::transaction::StepJournal::hold_lease)): while any does, nobody
    /// else can take the lease over and the heartbeat renews nothing.
    pub(crate) leases_held: u32,
    /// Set while the body polls a branch that lost a decided [`Ctx::select`]: it may replay,
    /// but any fresh work (an arm, an action) suspends instead of happening.
    pub(crate) disarmed: bool,
    /// The steps of signal waits this drive registered, so a race can withdraw its losers'.
    pub(crate) signal_waits_armed: Vec<String>,
    /// While a [`Ctx::select`] polls one of its branches: what the branch has read so far, to
    /// decide the race by journal order and give back the signals a losing branch took.
    pub(crate) race_marks: Option<RaceMarks>,
    /// What the generation's journal holds, for the journal budget.
    pub(crate) journal_size: JournalSize,
    /// Set by the driver, which sends a held-back append whenever the body waits: only then
    /// may a step's append be held back (`held_back`).
    pub(crate) drives_held_back: bool,
    /// The last step's append, held back for the completion to carry (`held_back`).
    pub(crate) held_back: Option<HeldBack>,
    /// Set while someone sends the held-back append; the others wait for `held_back_sent`.
    pub(crate) held_back_sending: bool,
}

impl State {
    /// The state of a drive that starts over `replay`, whose generation's journal holds
    /// `journal_size`, on a lease last confirmed at `last_confirmed`.
    pub(crate) fn new(replay: Replay, journal_size: JournalSize, last_confirmed: Instant) -> Self {
        Self {
            replay,
            halt: None,
            store_error: None,
            awaiting: Vec::new(),
            wake_at: None,
            open_ended: false,
            last_confirmed,
            stats: RunStats::default(),
            signal_ordinals: std::collections::HashMap::new(),
            message_ordinals: std::collections::HashMap::new(),
            stream_written: (0, 0),
            updates_answered: std::collections::HashSet::new(),
            parked: None,
            deferred: Vec::new(),
            actions_running: 0,
            leases_held: 0,
            disarmed: false,
            signal_waits_armed: Vec::new(),
            race_marks: None,
            journal_size,
            drives_held_back: false,
            held_back: None,
            held_back_sending: false,
        }
    }

    /// What the budget counts now: the loaded entries but the deliveries, what this run
    /// appended, and the deliveries its awaits read.
    pub(crate) fn journal_size(&self) -> JournalSize {
        self.journal_size.with(self.replay.deliveries_read())
    }
}

/// One run, shared by every clone of its [`Ctx`](crate::Ctx).
pub(crate) struct Run {
    pub(crate) store: Arc<dyn JournalStore>,
    pub(crate) key: InstanceKey,
    pub(crate) generation: Generation,
    pub(crate) options: RunOptions,
    pub(crate) state: Mutex<State>,
    /// Told when a held-back append has been answered.
    pub(crate) held_back_sent: tokio::sync::Notify,
}

impl Run {
    pub(crate) fn new(
        store: Arc<dyn JournalStore>,
        key: InstanceKey,
        generation: Generation,
        replay: Replay,
        journal_size: JournalSize,
        options: RunOptions,
    ) -> Self {
        let last_confirmed = options.confirmed_at.unwrap_or_else(Instant::now);
        Self {
            store,
            key,
            generation,
            options,
            state: Mutex::new(State::new(replay, journal_size, last_confirmed)),
            held_back_sent: tokio::sync::Notify::new(),
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic while holding it; the state is plain data updated in
        // single assignments, so it is still consistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes a confirmation of the lease that was asked for at `at` (concurrent confirmations
    /// may finish out of order; the newest wins).
    pub(crate) fn confirmed(&self, at: Instant) {
        let mut state = self.state();
        if at > state.last_confirmed {
            state.last_confirmed = at;
        }
    }

    /// The append a fresh step makes, carrying the run's fence and lease renewal.
    pub(crate) fn fresh_append(&self, step: &str, kind: StepKind, json: Value) -> Append {
        Append {
            key: self.key.clone(),
            generation: Some(self.generation),
            event: Event::StepRecorded {
                step: step.to_owned(),
                kind,
                result: json,
            },
            fence: self.options.fence.clone(),
            renew: self.options.fence.as_ref().map(|_| self.options.lease_ttl),
        }
    }

    pub(crate) fn encode<T: Serialize + ?Sized>(
        &self,
        step: &str,
        value: &T,
    ) -> Result<Value, WorkflowError> {
        encode_payload(step, value, self.options.payload_len_max)
    }

    /// Refuses to journal a value of `len` encoded bytes at `step` when it would take the
    /// journal past its budget. The action has run by then, so the run fails at once instead
    /// of running it again.
    pub(crate) fn check_budget_for(&self, step: &str, len: usize) -> Result<(), WorkflowError> {
        let budget = self.options.journal_budget;
        let size = self.state().journal_size();
        let grown = JournalSize {
            steps: size.steps + 1,
            bytes: size.bytes + len,
        };
        if grown.steps > budget.steps || grown.bytes > budget.bytes {
            let error = journal_full(step, grown, budget);
            self.halt(Halt::Fail {
                reason: error.to_string(),
            });
            return Err(error);
        }
        Ok(())
    }

    /// Counts an entry of `len` encoded bytes this run appended.
    pub(crate) fn count_appended(&self, len: usize) {
        let mut state = self.state();
        state.journal_size.steps += 1;
        state.journal_size.bytes += len;
    }

    /// Takes what a fresh append of `step` answered into the run: the value every reader must
    /// adopt, or the halt the answer implies. `len` is `json`'s encoded length. `started` is when the append (or the action that
    /// made it) began, which its success confirms the lease as of.
    pub(crate) fn adopt(
        &self,
        step: &str,
        kind: StepKind,
        json: Value,
        len: usize,
        outcome: AppendOutcome,
        started: Instant,
    ) -> Result<Value, WorkflowError> {
        match outcome {
            AppendOutcome::Appended => {
                self.confirmed(started);
                self.count_appended(len);
                {
                    let mut state = self.state();
                    state.stats.appended += 1;
                    state.replay.record_fresh(step, kind, json.clone());
                }
                if let Some(faults) = &self.options.faults {
                    if faults.crash_after(&self.key, step) {
                        return Err(self.halt(Halt::Crash {
                            message: format!("injected crash after step {step:?} was journaled"),
                        }));
                    }
                }
                Ok(json)
            }
            AppendOutcome::AlreadyPresent(value) => {
                // Nothing was written, so the lease was not renewed: keep the old confirmation.
                self.state().replay.record_fresh(step, kind, value.clone());
                Ok(value)
            }
            AppendOutcome::RefusedTerminal(marker) => Err(self.halt(Halt::Terminal(marker))),
            AppendOutcome::Conflict => Err(self.halt(Halt::Conflict {
                step: step.to_owned(),
            })),
        }
    }

    pub(crate) fn diverged(&self, step: &str, detail: String) -> WorkflowError {
        self.halt(Halt::NonDeterminism {
            step: step.to_owned(),
            detail: detail.clone(),
        });
        WorkflowError::NonDeterminism {
            step: step.to_owned(),
            detail,
        }
    }

    /// The error a failed store call at `step` gives the body, with the halt it implies: a
    /// refused value fails the run at once; a lost lease or any other store error stops it.
    pub(crate) fn store_failed(&self, step: &str, error: store::Error) -> WorkflowError {
        if let store::Error::ValueRefused { reason, .. } = &error {
            return self.fail_at_once(WorkflowError::PayloadRefused {
                step: step.to_owned(),
                reason: reason.clone(),
            });
        }
        let halt = if error.is_lease_lost() {
            Halt::LeaseLost
        } else {
            Halt::Store
        };
        let reason = halt.describe();
        let mut state = self.state();
        if state.halt.is_none() {
            state.halt = Some(halt);
            state.store_error = Some(error);
        }
        WorkflowError::Halted { reason }
    }

    /// Makes the run fail at once with `error` as its reason (first halt wins), and returns
    /// `error` for the body, which may see it but can no longer do fresh work.
    pub(crate) fn fail_at_once(&self, error: WorkflowError) -> WorkflowError {
        self.halt(Halt::Fail {
            reason: crate::error_chain(&error),
        });
        error
    }

    /// Sets the halt reason (first wins) and returns the error the caller propagates.
    pub(crate) fn halt(&self, halt: Halt) -> WorkflowError {
        let mut state = self.state();
        let reason = halt.describe();
        state.halt.get_or_insert(halt);
        WorkflowError::Halted { reason }
    }
}
