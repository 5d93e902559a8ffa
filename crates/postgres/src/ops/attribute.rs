//! `crates/migrations/functions/attribute.sql`: search attributes. A start with attributes
//! (`keiro_instance_start_attributed`, sent alone by the start lane) writes them with the
//! instance it creates; a body's set (`keiro_attributes_set`) is append-shaped, its fenced
//! journal step and, only when it was appended, the attribute rows, in one transaction. The
//! read of one instance's attributes is a plain statement.

use keiro_journal::attribute::{AttrValue, Attributes, ATTRIBUTES_MAX};
use keiro_journal::queue::QueueStart;
use keiro_journal::store::{Append, AttributesOutcome, Result, StartRequest};
use keiro_journal::{InstanceKey, Started};
use serde_json::Value;

use crate::db::Db;
use crate::ops::journal::{append_outcome, encoded_step, AppendArgs};
use crate::ops::queue::queue_started;
use crate::row::{column, count, instance_columns, malformed};

const START: &str = "starting an instance";
const ATTRIBUTES_SET: &str = "setting search attributes";
const ATTRIBUTES_READ: &str = "reading search attributes";

const INSTANCE_START_ATTRIBUTED: &str = concat!(
    "SELECT s.outcome, s.created, ",
    instance_columns!("(s.instance)."),
    " FROM keiro_instance_start_attributed($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) s"
);

/// `keiro_instance_start_attributed`: `request` (on its queue, if it has one) and its
/// attributes when the start created the instance.
pub(crate) async fn instance_start_attributed(db: &Db, request: &StartRequest) -> Result<Started> {
    let parent_name = request.parent.as_ref().map(|p| p.name.as_str());
    let parent_id = request.parent.as_ref().map(|p| p.id.as_str());
    let queue: Option<&QueueStart> = request.queue.as_ref();
    let queue_name = queue.map(|q| q.queue.as_str());
    let key = queue.and_then(|q| q.key.as_deref());
    let dedup_id = queue.and_then(|q| q.dedup_id.as_deref());
    let not_before = queue.and_then(|q| q.not_before);
    let attrs = attributes_json(&request.attributes, START)?;
    let row = db
        .query_one(
            START,
            INSTANCE_START_ATTRIBUTED,
            &[
                &request.key.name.as_str(),
                &request.key.id.as_str(),
                &request.input,
                &parent_name,
                &parent_id,
                &request.priority,
                &queue_name,
                &key,
                &dedup_id,
                &not_before,
                &attrs,
            ],
        )
        .await?;
    queue_started(&row, queue_name.unwrap_or(""))
}

const KEIRO_ATTRIBUTES_SET: &str = "SELECT outcome, recorded, marker, attributes_count \
     FROM keiro_attributes_set($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// `keiro_attributes_set`: the attributes step `append` (its payload the attributes), and the
/// attributes.
pub(crate) async fn attributes_set(db: &Db, append: &Append) -> Result<AttributesOutcome> {
    let max = i32::try_from(ATTRIBUTES_MAX).unwrap_or(i32::MAX);
    let args = AppendArgs::new(append, encoded_step(append, ATTRIBUTES_SET)?);
    let mut params = args.params();
    params.push(&max);
    let row = db
        .query_one(ATTRIBUTES_SET, KEIRO_ATTRIBUTES_SET, &params)
        .await?;
    let outcome: String = column(&row, "outcome", ATTRIBUTES_SET)?;
    if outcome == "too_many" {
        return Ok(AttributesOutcome::TooMany {
            count: count(&row, "attributes_count", ATTRIBUTES_SET)?,
        });
    }
    append_outcome(&row, ATTRIBUTES_SET, &append.key, append.fence.as_ref())
        .map(AttributesOutcome::Append)
}

const INSTANCE_ATTRIBUTES: &str = "SELECT attr, value FROM workflow_attributes \
     WHERE workflow_name = $1 AND workflow_id = $2 ORDER BY attr";

/// One instance's attributes, by name (its primary key's range).
pub(crate) async fn instance_attributes(db: &Db, key: &InstanceKey) -> Result<Attributes> {
    let rows = db
        .query(
            ATTRIBUTES_READ,
            INSTANCE_ATTRIBUTES,
            &[&key.name.as_str(), &key.id.as_str()],
        )
        .await?;
    let mut attributes = Attributes::new();
    for row in &rows {
        let name: String = column(row, "attr", ATTRIBUTES_READ)?;
        let value: Value = column(row, "value", ATTRIBUTES_READ)?;
        attributes.insert(name, attribute_value(value, ATTRIBUTES_READ)?);
    }
    Ok(attributes)
}

/// The attributes of a listed row (`jsonb_object_agg` of their tagged values; null for none).
pub(crate) fn listed_attributes(
    value: Option<Value>,
    operation: &'static str,
) -> Result<Attributes> {
    match value {
        None => Ok(Attributes::new()),
        Some(value) => serde_json::from_value(value)
            .map_err(|e| malformed(operation, format_args!("attributes: {e}"))),
    }
}

fn attribute_value(value: Value, operation: &'static str) -> Result<AttrValue> {
    serde_json::from_value(value).map_err(|e| malformed(operation, format_args!("attribute: {e}")))
}

/// The attributes as the functions take them: the JSON of [`Attributes`].
fn attributes_json(attributes: &Attributes, operation: &'static str) -> Result<Value> {
    serde_json::to_value(attributes)
        .map_err(|e| malformed(operation, format_args!("attributes: {e}")))
}
