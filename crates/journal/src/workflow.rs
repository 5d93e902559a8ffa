//! Workflow definitions: an ordinary async function, erased to JSON in and out so definitions
//! of different types live in one registry.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::{BoxFuture, Ctx, WorkflowError};

/// A workflow body with its input and output erased to JSON.
///
/// Implemented for every `Fn(Ctx, I) -> impl Future<Output = Result<O, WorkflowError>>` through
/// [`workflow_fn`]; implement it by hand only for dynamic dispatch of your own.
pub trait Workflow: Send + Sync + 'static {
    /// Decodes `input`, runs the body, encodes its output.
    fn call(&self, ctx: Ctx, input: Value) -> BoxFuture<'static, Result<Value, WorkflowError>>;
}

/// A plain async function as a [`Workflow`].
pub struct FnWorkflow<F, I, O> {
    f: F,
    // `fn(I) -> O` keeps the wrapper Send + Sync whatever I and O are.
    _types: PhantomData<fn(I) -> O>,
}

/// Wraps an async function `async fn(Ctx, I) -> Result<O, WorkflowError>` as a definition.
///
/// ```
/// use keiro_journal::{workflow_fn, Ctx, WorkflowError};
///
/// async fn greet(ctx: Ctx, name: String) -> Result<String, WorkflowError> {
///     ctx.step("greet", || async move { Ok::<_, std::io::Error>(format!("hello {name}")) }).await
/// }
/// let definition = workflow_fn(greet);
/// # let _ = definition;
/// ```
pub fn workflow_fn<F, Fut, I, O>(f: F) -> Arc<dyn Workflow>
where
    F: Fn(Ctx, I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
    I: DeserializeOwned + 'static,
    O: Serialize + 'static,
{
    Arc::new(FnWorkflow {
        f,
        _types: PhantomData,
    })
}

/// The pseudo step name input decoding errors are reported under.
pub const INPUT_STEP: &str = "<input>";
/// The pseudo step name output encoding errors are reported under.
pub const OUTPUT_STEP: &str = "<output>";

impl<F, Fut, I, O> Workflow for FnWorkflow<F, I, O>
where
    F: Fn(Ctx, I) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
    I: DeserializeOwned + 'static,
    O: Serialize + 'static,
{
    fn call(&self, ctx: Ctx, input: Value) -> BoxFuture<'static, Result<Value, WorkflowError>> {
        let input = match serde_json::from_value::<I>(input) {
            Ok(input) => input,
            Err(source) => {
                return Box::pin(std::future::ready(Err(WorkflowError::Decode {
                    step: INPUT_STEP.to_owned(),
                    source,
                })))
            }
        };
        let fut = (self.f)(ctx, input);
        Box::pin(async move {
            let output = fut.await?;
            serde_json::to_value(&output).map_err(|source| WorkflowError::Encode {
                step: OUTPUT_STEP.to_owned(),
                source,
            })
        })
    }
}
