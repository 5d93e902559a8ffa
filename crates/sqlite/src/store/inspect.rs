//! [`SqliteStore`]'s operators' reads (`InspectStore`): a page of instances, the counts, the
//! terminal instances per time bucket and one instance's waits, each from one snapshot of a
//! read connection.

use keiro_journal::store::{Result, Throughput, ThroughputRequest};
use keiro_journal::{Counts, InstanceKey, ListRequest, Page, Waits};
use time::OffsetDateTime;

use crate::inspect;

use super::SqliteStore;

const LIST: &str = "listing instances";
const COUNTS: &str = "counting instances";
const THROUGHPUT: &str = "counting terminal instances by time";
const WAITS: &str = "reading an instance's waits";

impl SqliteStore {
    /// One page of the instances `request` selects, in its order, after its cursor
    /// (`InspectStore::instances_list`). The request is validated by the caller
    /// (`ListRequest::validate`), as for every store.
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instances_list(&self, request: &ListRequest) -> Result<Page> {
        let request = request.clone();
        self.read(LIST, move |conn, _| inspect::instances_list(conn, &request))
            .await
    }

    /// Instances by workflow and status, the timer backlog at `now` (the store's clock when
    /// `None`) and the remote tasks waiting per group (`InspectStore::instances_counts`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a workflow name or status keiro cannot read.
    pub async fn instances_counts(&self, now: Option<OffsetDateTime>) -> Result<Counts> {
        self.read(COUNTS, move |conn, clock| {
            inspect::instances_counts(conn, now.unwrap_or(clock))
        })
        .await
    }

    /// The instances that went terminal in each bucket of `request`, the last bucket holding
    /// its `until` (the store's clock when `None`) (`InspectStore::instances_throughput`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a status keiro cannot read.
    pub async fn instances_throughput(&self, request: &ThroughputRequest) -> Result<Throughput> {
        let request = *request;
        self.read(THROUGHPUT, move |conn, clock| {
            inspect::instances_throughput(conn, &request, request.until.unwrap_or(clock))
        })
        .await
    }

    /// The timers, awakeables and pending signal waits of `key`, up to `limit` of each kind,
    /// newest first (`InspectStore::instance_waits`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instance_waits(&self, key: &InstanceKey, limit: u32) -> Result<Waits> {
        let key = key.clone();
        self.read(WAITS, move |conn, _| {
            inspect::instance_waits(conn, key.name.as_str(), key.id.as_str(), limit)
        })
        .await
    }
}
