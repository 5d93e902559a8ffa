//! The registry: workflow name to definition.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use keiro_journal::{workflow_fn, Ctx, IdError, Workflow, WorkflowError, WorkflowName};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The name is not a valid workflow name.
    #[error("invalid workflow name")]
    InvalidName(#[from] IdError),
    /// The name is already registered.
    #[error("workflow {0} is registered twice")]
    Duplicate(WorkflowName),
}

/// Maps workflow names to definitions. Definitions of different input and output types live
/// side by side: each is erased to JSON at registration.
///
/// ```
/// use keiro_journal::{Ctx, WorkflowError};
/// use keiro_resume::Registry;
///
/// async fn double(_ctx: Ctx, n: u64) -> Result<u64, WorkflowError> { Ok(n * 2) }
/// async fn shout(_ctx: Ctx, s: String) -> Result<String, WorkflowError> { Ok(s.to_uppercase()) }
///
/// let mut registry = Registry::new();
/// registry.register("double", double)?;
/// registry.register("shout", shout)?;
/// assert_eq!(registry.len(), 2);
/// # Ok::<(), keiro_resume::RegistryError>(())
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    definitions: HashMap<WorkflowName, Arc<dyn Workflow>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&str> = self.definitions.keys().map(WorkflowName::as_str).collect();
        names.sort_unstable();
        f.debug_struct("Registry").field("names", &names).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers an async function `async fn(Ctx, I) -> Result<O, WorkflowError>` under `name`.
    ///
    /// # Errors
    ///
    /// [`RegistryError`] for an invalid or duplicate name.
    pub fn register<F, Fut, I, O>(
        &mut self,
        name: &str,
        body: F,
    ) -> Result<&mut Self, RegistryError>
    where
        F: Fn(Ctx, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
        I: DeserializeOwned + 'static,
        O: Serialize + 'static,
    {
        self.register_dyn(WorkflowName::new(name)?, workflow_fn(body))
    }

    /// Registers an already erased definition.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Duplicate`] when the name is taken.
    pub fn register_dyn(
        &mut self,
        name: WorkflowName,
        definition: Arc<dyn Workflow>,
    ) -> Result<&mut Self, RegistryError> {
        if self.definitions.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        self.definitions.insert(name, definition);
        Ok(self)
    }

    /// The definition registered under `name`.
    pub fn get(&self, name: &WorkflowName) -> Option<&Arc<dyn Workflow>> {
        self.definitions.get(name)
    }

    /// How many definitions are registered.
    pub fn len(&self) -> usize {
        self.definitions.len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.definitions.is_empty()
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<WorkflowName> {
        let mut names: Vec<WorkflowName> = self.definitions.keys().cloned().collect();
        names.sort();
        names
    }
}
