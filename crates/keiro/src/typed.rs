//! Typed workflows: a definition names its workflow and fixes its input and output types, so
//! starting one with the wrong input, or reading its result as the wrong type, does not compile.
//!
//! A trait rather than a macro or a builder: the associated types are what the compiler checks
//! `start_workflow::<W>(id, &input)` and `Handle<W>::result` against, a trait is the one place
//! both the starting side and the worker side can name them, and it needs no proc-macro crate.
//! The stringly API ([`Keiro::start`], [`WorkerBuilder::register`](crate::WorkerBuilder::register))
//! stays for dynamic callers; a typed definition is registered under its [`WorkflowDef::NAME`],
//! so both address the same instances. Remote handlers get the same kind of contract,
//! [`RemoteHandlerDef`](crate::remote::RemoteHandlerDef): `ctx.remote_typed::<H>(step, ..)` on the
//! workflow side, [`RemoteWorkerBuilder::handle_typed`](crate::remote::RemoteWorkerBuilder::handle_typed)
//! on the worker side.
//!
//! ```no_run
//! use keiro::{Ctx, Keiro, WorkflowDef, WorkflowError};
//!
//! #[derive(Default)]
//! struct Greet;
//!
//! impl WorkflowDef for Greet {
//!     const NAME: &'static str = "greet";
//!     type Input = String;
//!     type Output = String;
//!
//!     async fn run(&self, ctx: Ctx, name: String) -> Result<String, WorkflowError> {
//!         ctx.step("compose", || async move { Ok::<_, std::io::Error>(format!("hello {name}")) })
//!             .await
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let keiro = Keiro::connect("postgres://postgres@127.0.0.1:5432/postgres").await?;
//! let worker = keiro.worker().register_workflow::<Greet>().build()?;
//! tokio::spawn(async move { worker.run().await });
//! let greeting = keiro.start_workflow::<Greet>("greet-1", &"ada".to_owned()).await?;
//! assert_eq!(greeting.result().await?, "hello ada");
//! # Ok(()) }
//! ```
//!
//! A wrong input type is a compile error:
//!
//! ```compile_fail
//! # use keiro::{Ctx, Keiro, WorkflowDef, WorkflowError};
//! # #[derive(Default)]
//! # struct Greet;
//! # impl WorkflowDef for Greet {
//! #     const NAME: &'static str = "greet";
//! #     type Input = String;
//! #     type Output = String;
//! #     async fn run(&self, _ctx: Ctx, name: String) -> Result<String, WorkflowError> { Ok(name) }
//! # }
//! # async fn demo(keiro: Keiro) -> Result<(), keiro::Error> {
//! keiro.start_workflow::<Greet>("greet-1", &42_u32).await?; // expected `&String`, found `&u32`
//! # Ok(()) }
//! ```

use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use keiro_journal::{
    AppendOutcome, CancelOutcome, Ctx, IdError, Instance, InstanceKey, IntoInstanceKey,
    SignalSendOutcome, WorkflowError,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{Error, Keiro, ResultError, ResultOptions};

/// A workflow definition: its registered name, its input and output types, and its body.
///
/// Implement it on a unit struct (registered with
/// [`register_workflow`](crate::WorkerBuilder::register_workflow)) or on a struct holding the
/// body's dependencies, such as a client or a pool (registered as a value with
/// [`register_workflow_with`](crate::WorkerBuilder::register_workflow_with)). Write `run` as an
/// `async fn`; its future must be `Send`, as a worker drives runs on a multi-threaded runtime.
///
/// ```
/// use keiro::{Ctx, WorkflowDef, WorkflowError};
///
/// struct Double;
///
/// impl WorkflowDef for Double {
///     const NAME: &'static str = "double";
///     type Input = u32;
///     type Output = u64;
///
///     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
///         ctx.step("double", || async move { Ok::<_, std::io::Error>(u64::from(n) * 2) }).await
///     }
/// }
/// ```
pub trait WorkflowDef: Send + Sync + 'static {
    /// The name instances are started and registered under: a valid workflow name (no `:`,
    /// `#`, `/`, surrounding whitespace or control characters), checked when it is used.
    const NAME: &'static str;
    /// What `start_workflow` takes and the body receives.
    type Input: Serialize + DeserializeOwned + Send + 'static;
    /// What the body returns and `Handle::result` decodes.
    type Output: Serialize + DeserializeOwned + Send + 'static;

    /// The body: runs (and re-runs) with the instance's input; journaled steps replay.
    fn run(
        &self,
        ctx: Ctx,
        input: Self::Input,
    ) -> impl Future<Output = Result<Self::Output, WorkflowError>> + Send;
}

/// A typed handle on one instance of workflow `W`: await its result, cancel it, deliver to it.
/// Cheap to clone; holding one keeps nothing open.
pub struct Handle<W> {
    keiro: Keiro,
    key: InstanceKey,
    created: bool,
    // `fn() -> W`: the handle is Send + Sync whatever W is, and owns no W.
    _workflow: PhantomData<fn() -> W>,
}

impl<W> Clone for Handle<W> {
    fn clone(&self) -> Self {
        Self {
            keiro: self.keiro.clone(),
            key: self.key.clone(),
            created: self.created,
            _workflow: PhantomData,
        }
    }
}

impl<W> std::fmt::Debug for Handle<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("key", &self.key)
            .field("created", &self.created)
            .finish_non_exhaustive()
    }
}

impl<W: WorkflowDef> Handle<W> {
    /// The instance: `W::NAME` and the id.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// assert_eq!(handle.key().to_string(), "double/double-1");
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn key(&self) -> &InstanceKey {
        &self.key
    }

    /// The instance id.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// assert_eq!(handle.id(), "double-1");
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn id(&self) -> &str {
        self.key.id.as_str()
    }

    /// Whether the start that returned this handle created the instance (`false`: it existed
    /// already, and its original input stands). `false` for a handle from
    /// [`Keiro::handle`].
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// assert!(handle.created());
    /// let again = keiro.start_workflow::<Double>("double-1", &5).await?;
    /// assert!(!again.created()); // the first input, 21, stands
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn created(&self) -> bool {
        self.created
    }

    /// Waits, as long as it takes, until the instance is terminal, and returns its output.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// handle.deliver("factor", &2).await?;
    /// worker.drain().await?;
    /// assert_eq!(handle.result().await?, 42);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Keiro::result`], but never [`ResultError::Timeout`].
    pub async fn result(&self) -> Result<W::Output, ResultError> {
        self.result_with(&ResultOptions::default()).await
    }

    /// [`result`](Self::result), giving up after `timeout`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// handle.deliver("factor", &2).await?;
    /// worker.drain().await?;
    /// assert_eq!(handle.result_within(std::time::Duration::from_secs(5)).await?, 42);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Keiro::result`].
    pub async fn result_within(&self, timeout: Duration) -> Result<W::Output, ResultError> {
        let options = ResultOptions {
            timeout: Some(timeout),
            ..ResultOptions::default()
        };
        self.result_with(&options).await
    }

    /// [`result`](Self::result) with options.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// handle.deliver("factor", &2).await?;
    /// worker.drain().await?;
    /// let options = keiro::ResultOptions { timeout: None, ..keiro::ResultOptions::default() };
    /// assert_eq!(handle.result_with(&options).await?, 42);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Keiro::result`].
    pub async fn result_with(&self, options: &ResultOptions) -> Result<W::Output, ResultError> {
        self.keiro.result_of(&self.key, options).await
    }

    /// The current value of the instance's event `event`, waiting up to `timeout` for the
    /// first one ([`Keiro::get_event`]).
    ///
    /// # Errors
    ///
    /// As [`Keiro::get_event`].
    pub async fn get_event<T: DeserializeOwned>(
        &self,
        event: &str,
        timeout: Duration,
    ) -> Result<Option<T>, Error> {
        self.keiro.get_event(&self.key, event, timeout).await
    }

    /// Sends update `name` with `request` to the instance and waits up to `timeout` for the
    /// body's answer ([`Keiro::update`]).
    ///
    /// # Errors
    ///
    /// As [`Keiro::update`].
    pub async fn update<R: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        name: &str,
        request: &R,
        timeout: Duration,
    ) -> Result<T, Error> {
        self.keiro.update(&self.key, name, request, timeout).await
    }

    /// Sends `call` to the instance and waits for the answer ([`Keiro::update_with`]).
    ///
    /// # Errors
    ///
    /// As [`Keiro::update_with`].
    pub async fn update_with<R: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        call: crate::workflow::UpdateCall<'_, R>,
    ) -> Result<T, Error> {
        self.keiro.update_with(&self.key, call).await
    }

    /// Follows the instance's stream `stream` from offset `from` ([`Keiro::read_stream`]).
    ///
    /// # Errors
    ///
    /// As [`Keiro::read_stream`].
    pub fn read_stream<T: DeserializeOwned + Send + 'static>(
        &self,
        stream: &str,
        from: u64,
    ) -> Result<crate::workflow::StreamReader<T>, Error> {
        self.keiro.read_stream(&self.key, stream, from)
    }

    /// Cancels the instance ([`Keiro::cancel`]).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// assert_eq!(handle.cancel().await?, keiro::operate::CancelOutcome::Recorded);
    /// assert!(handle.result().await.unwrap_err().is_final());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Keiro::cancel`].
    pub async fn cancel(&self) -> Result<CancelOutcome, Error> {
        self.keiro.cancel(&self.key).await
    }

    /// Cancels the instance and its live descendants ([`Keiro::cancel_cascade`]).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// assert_eq!(handle.cancel_cascade().await?, keiro::operate::CancelOutcome::Recorded);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Keiro::cancel_cascade`].
    pub async fn cancel_cascade(&self) -> Result<CancelOutcome, Error> {
        self.keiro.cancel_cascade(&self.key).await
    }

    /// Journals `value` for the instance's `ctx.await_step(step)` and wakes it
    /// ([`Keiro::deliver`]).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// assert_eq!(handle.deliver("factor", &2).await?, keiro::store::AppendOutcome::Appended);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Keiro::deliver`].
    pub async fn deliver<T: Serialize + ?Sized>(
        &self,
        step: &str,
        value: &T,
    ) -> Result<AppendOutcome, Error> {
        self.keiro.deliver(&self.key, step, value).await
    }

    /// Sends a signal on `token` ([`Keiro::signal`]). Signals are addressed by token, not by
    /// instance: the instance receives it when one of its `ctx.wait_signal(token, ..)` is the
    /// oldest wait on the token, so give each instance tokens of its own (such as
    /// `<id>/approval`).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// let outcome = handle.signal("double-1/nudge", &()).await?;
    /// assert_eq!(outcome, keiro::workflow::SignalSendOutcome::Buffered);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Keiro::signal`].
    pub async fn signal<T: Serialize + ?Sized>(
        &self,
        token: &str,
        payload: &T,
    ) -> Result<SignalSendOutcome, Error> {
        self.keiro.signal(token, payload).await
    }

    /// The instance row as it is now; `None` only if it was never started (a handle from
    /// [`Keiro::handle`]) or has been deleted.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// let row = handle.instance().await?.expect("started");
    /// assert_eq!(row.status, keiro::Status::Running);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Keiro::instance`].
    pub async fn instance(&self) -> Result<Option<Instance>, Error> {
        Ok(self.keiro.store().instance_get(&self.key).await?)
    }
}

impl<W> Handle<W> {
    /// The handle on a run `keiro` just started.
    pub(crate) fn from_started(keiro: Keiro, started: crate::store::Started) -> Self {
        Self {
            keiro,
            key: started.instance.key,
            created: started.created,
            _workflow: PhantomData,
        }
    }
}

/// A handle names its instance, so it can be passed to any [`Keiro`] call that takes a key.
impl<W> IntoInstanceKey for &Handle<W> {
    fn into_instance_key(self) -> Result<InstanceKey, IdError> {
        Ok(self.key.clone())
    }
}

impl Keiro {
    /// Starts instance `id` of the typed workflow `W` with `input` (checked against
    /// `W::Input` at compile time) and returns its handle. Durable and idempotent by id like
    /// [`start`](Self::start): a second start returns a handle on the existing instance
    /// ([`Handle::created`] is `false`).
    ///
    /// ```no_run
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, _ctx: Ctx, n: u32) -> Result<u64, WorkflowError> { Ok(u64::from(n) * 2) }
    /// # }
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), Box<dyn std::error::Error>> {
    /// let doubled = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// assert_eq!(doubled.result().await?, 42);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start): [`Error::InvalidId`] (also for an invalid `W::NAME`),
    /// [`Error::Payload`], [`Error::Store`].
    pub async fn start_workflow<W: WorkflowDef>(
        &self,
        id: &str,
        input: &W::Input,
    ) -> Result<Handle<W>, Error> {
        let started = self.start(W::NAME, id, input).await?;
        Ok(Handle::from_started(self.clone(), started))
    }

    /// A handle on instance `id` of `W`, started before or elsewhere; nothing is read.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// # let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// let handle = keiro.start_workflow::<Double>("double-1", &21).await?;
    /// // Elsewhere, with the id alone:
    /// let later = keiro.handle::<Double>("double-1")?;
    /// later.deliver("factor", &2).await?;
    /// worker.drain().await?;
    /// assert_eq!(later.result().await?, 42);
    /// # let _ = handle;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`].
    pub fn handle<W: WorkflowDef>(&self, id: &str) -> Result<Handle<W>, Error> {
        Ok(Handle {
            keiro: self.clone(),
            key: InstanceKey::parse(W::NAME, id)?,
            created: false,
            _workflow: PhantomData,
        })
    }
}
