//! Finding runs by their attributes: every attribute filter (equality on each kind, ranges on
//! numbers and times) against `AttrFilter::matches` as the oracle, alone and combined with the
//! other filters, in keyset pages of both orders.

use crate::contract::support::{append, key, TestResult, T0};
use crate::Harness;
use keiro::queue::StartOptions;
use keiro_journal::attribute::{AttrFilter, AttrOp, AttrValue, Attributes, ATTR_FILTERS_MAX};
use keiro_journal::{
    Cursor, Event, FilterError, InspectStore, ListFilter, ListOrder, ListRequest, Status,
    WorkflowName,
};
use serde_json::json;

/// Every page of `filter` in `order`, two rows a page, the cursor passed on in its text form.
async fn all_pages(
    inspect: &dyn InspectStore,
    filter: &ListFilter,
    order: ListOrder,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let mut request = ListRequest {
        filter: filter.clone(),
        order,
        limit: 2,
        cursor: None,
    };
    let mut keys = Vec::new();
    for _ in 0..50 {
        let page = inspect.instances_list(&request).await?;
        assert!(page.instances.len() <= 2, "{page:?}");
        keys.extend(page.instances.iter().map(|i| i.key.to_string()));
        match page.next_cursor {
            Some(cursor) => request.cursor = Some(Cursor::parse(&cursor.encode())?),
            None => return Ok(keys),
        }
    }
    Err(format!("the pages never ended: {keys:?}").into())
}

/// The attributes of run `i` of the scenario.
fn attributes_of(i: i64) -> Attributes {
    let mut attrs = Attributes::new()
        .with("customer", if i % 2 == 0 { "acme" } else { "globex" })
        .with("vip", i % 4 == 0)
        .with("due", T0 + time::Duration::hours(i));
    if i == 5 {
        attrs.insert("amount", 1250.5);
    } else {
        attrs.insert("amount", i * 250);
    }
    if i == 1 {
        // Text that reads like a boolean: only a quoted filter finds it.
        attrs.insert("flag", "true");
    }
    if i == 7 {
        attrs.insert("flag", true);
    }
    attrs
}

pub async fn attribute_filters_select_what_matches_selects_in_pages_of_both_orders(
    h: Harness,
) -> TestResult {
    let mut all = Vec::new();
    for i in 0..12_i64 {
        let name = if i % 3 == 0 { "refund" } else { "order" };
        let id = format!("r-{i:02}");
        let options = StartOptions::default().attributes(&attributes_of(i));
        h.keiro.start_with(name, &id, &1, &options).await?;
        if i % 4 == 2 {
            append(
                &*h.store,
                &key(name, &id),
                None,
                Event::WorkflowCompleted { output: json!(1) },
                None,
            )
            .await?;
        }
        all.push((key(name, &id), attributes_of(i)));
    }
    // One run with no attributes at all.
    h.keiro.start("order", "bare", &1).await?;
    let at = |hours| AttrValue::Time(T0 + time::Duration::hours(hours));
    let cases: Vec<Vec<AttrFilter>> = vec![
        vec![AttrFilter::eq("customer", "acme")],
        vec![AttrFilter::parse("customer=nobody")?],
        vec![AttrFilter::parse("amount>=1000")?],
        vec![AttrFilter::parse("amount<750")?],
        vec![
            AttrFilter::parse("amount>1000")?,
            AttrFilter::parse("amount<=2000")?,
        ],
        vec![AttrFilter::parse("amount=1250.5")?],
        vec![AttrFilter::parse("amount=500")?],
        vec![AttrFilter::parse("vip=true")?],
        vec![AttrFilter::parse("flag=\"true\"")?],
        vec![AttrFilter::parse("flag=true")?],
        vec![
            AttrFilter::new("due", AttrOp::Ge, at(5)),
            AttrFilter::new("due", AttrOp::Lt, at(8)),
        ],
        vec![AttrFilter::new("due", AttrOp::Eq, at(3))],
        vec![
            AttrFilter::eq("customer", "acme"),
            AttrFilter::eq("vip", false),
        ],
    ];
    let rows = h
        .inspect
        .instances_list(&ListRequest {
            limit: 1000,
            ..ListRequest::default()
        })
        .await?
        .instances;
    for attributes in cases {
        for (name, status) in [
            (None, None),
            (Some("order"), None),
            (None, Some(Status::Completed)),
        ] {
            let filter = ListFilter {
                name: name.map(WorkflowName::new).transpose()?,
                status,
                attributes: attributes.clone(),
                ..ListFilter::default()
            };
            let expected: Vec<String> = rows
                .iter()
                .filter(|r| name.is_none_or(|n| r.key.name.as_str() == n))
                .filter(|r| status.is_none_or(|s| r.status == s))
                .filter(|r| {
                    let attrs = all
                        .iter()
                        .find(|(k, _)| *k == r.key)
                        .map(|(_, a)| a.clone())
                        .unwrap_or_default();
                    attributes.iter().all(|f| f.matches(&attrs))
                })
                .map(|r| r.key.to_string())
                .collect();
            let newest = all_pages(&*h.inspect, &filter, ListOrder::NewestFirst).await?;
            assert_eq!(newest, expected, "{filter:?}");
            let mut oldest = all_pages(&*h.inspect, &filter, ListOrder::OldestFirst).await?;
            oldest.reverse();
            assert_eq!(oldest, expected, "{filter:?} oldest first");
        }
    }
    // The listed rows carry their attributes.
    let page = h
        .keiro
        .list(&ListRequest::from_pairs([("attr", "amount=1250.5")])?)
        .await?;
    assert_eq!(page.instances.len(), 1);
    assert_eq!(page.instances[0].attributes, attributes_of(5));
    Ok(())
}

pub async fn bad_attribute_filters_are_typed_errors(h: Harness) -> TestResult {
    for (pairs, field) in [
        (vec![("attr", "customer")], "attr"),
        (vec![("attr", "1st=a")], "attr"),
        (vec![("attr", "customer>acme")], "attr"),
        (vec![("attr", "vip<=true")], "attr"),
    ] {
        let refused = ListRequest::from_pairs(pairs.clone());
        assert!(
            matches!(&refused, Err(FilterError::InvalidValue { field: f, .. }) if *f == field),
            "{pairs:?}: {refused:?}"
        );
    }
    let mut request = ListRequest::default();
    request.filter.attributes = (0..=ATTR_FILTERS_MAX)
        .map(|i| AttrFilter::eq(format!("a{i}"), 1))
        .collect();
    let refused = h.keiro.list(&request).await;
    assert!(
        matches!(
            &refused,
            Err(keiro::Error::Filter(FilterError::InvalidValue {
                field: "attr",
                ..
            }))
        ),
        "{refused:?}"
    );
    request.filter.attributes = vec![AttrFilter::new("a", AttrOp::Gt, "text")];
    assert!(h.keiro.list(&request).await.is_err());
    // JSON keeps the shape.
    let json = json!({"filter": {"attributes": [
        {"name": "amount", "op": "ge", "value": {"type": "int", "value": 1000}}
    ]}});
    let request: ListRequest = serde_json::from_value(json)?;
    assert_eq!(
        request.filter.attributes,
        vec![AttrFilter::parse("amount>=1000")?]
    );
    Ok(())
}
