//! A meter provider wired to the SDK's in-memory exporter, and a plain view of what it
//! exported so tests can compare whole instruments with `assert_eq!`.

// Each test binary compiles this module and uses a different subset of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::error::Error;

use keiro_telemetry::Metrics;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

pub(crate) type TestResult = Result<(), Box<dyn Error>>;

/// Attributes of one data point, sorted by key so comparisons ignore recording order.
pub(crate) type Attributes = BTreeMap<String, String>;

/// Builds [`Attributes`] from literal pairs.
pub(crate) fn attrs(pairs: &[(&str, &str)]) -> Attributes {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

/// One data point: its attributes and its value.
pub(crate) type Point = (Attributes, Value);

/// How the SDK aggregated an instrument, which tells the instrument kind apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    UpDownCounter,
    Gauge,
    Histogram,
}

/// The value of one data point.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    U64(u64),
    I64(i64),
    Histogram {
        count: u64,
        sum: f64,
        bounds: Vec<f64>,
    },
}

/// One exported instrument.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exported {
    pub(crate) scope: String,
    pub(crate) scope_version: Option<String>,
    pub(crate) name: String,
    pub(crate) unit: String,
    pub(crate) description: String,
    pub(crate) kind: Kind,
    pub(crate) points: Vec<Point>,
}

pub(crate) struct Harness {
    provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
    pub(crate) metrics: Metrics,
}

impl Harness {
    pub(crate) fn new() -> Self {
        let exporter = InMemoryMetricExporter::default();
        // The periodic reader's interval (60 s by default) never elapses during a test;
        // `collect` flushes explicitly, so exports happen exactly when a test asks.
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let metrics = Metrics::from_provider(&provider);
        Self {
            provider,
            exporter,
            metrics,
        }
    }

    /// Every instrument with data, as of now.
    pub(crate) fn collect(&self) -> Result<Vec<Exported>, Box<dyn Error>> {
        self.provider.force_flush()?;
        // Temporality is cumulative, so the latest export holds everything recorded so far.
        let Some(latest) = self.exporter.get_finished_metrics()?.pop() else {
            return Ok(Vec::new());
        };
        let mut exported = Vec::new();
        for scope_metrics in latest.scope_metrics() {
            let scope = scope_metrics.scope();
            for metric in scope_metrics.metrics() {
                let (kind, points) = points(metric.data())?;
                exported.push(Exported {
                    scope: scope.name().to_owned(),
                    scope_version: scope.version().map(str::to_owned),
                    name: metric.name().to_owned(),
                    unit: metric.unit().to_owned(),
                    description: metric.description().to_owned(),
                    kind,
                    points,
                });
            }
        }
        Ok(exported)
    }

    /// The one exported instrument called `name`; an error if it is missing.
    pub(crate) fn instrument(&self, name: &str) -> Result<Exported, Box<dyn Error>> {
        self.collect()?
            .into_iter()
            .find(|exported| exported.name == name)
            .ok_or_else(|| format!("instrument {name} was not exported").into())
    }

    /// The data points of `name`, sorted by attributes.
    pub(crate) fn points(&self, name: &str) -> Result<Vec<Point>, Box<dyn Error>> {
        let mut points = self.instrument(name)?.points;
        points.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(points)
    }
}

fn attributes<'a>(kvs: impl Iterator<Item = &'a opentelemetry::KeyValue>) -> Attributes {
    kvs.map(|kv| (kv.key.as_str().to_owned(), kv.value.to_string()))
        .collect()
}

fn points(data: &AggregatedMetrics) -> Result<(Kind, Vec<Point>), Box<dyn Error>> {
    Ok(match data {
        AggregatedMetrics::U64(MetricData::Sum(sum)) => {
            let kind = if sum.is_monotonic() {
                Kind::Counter
            } else {
                Kind::UpDownCounter
            };
            let points = sum
                .data_points()
                .map(|p| (attributes(p.attributes()), Value::U64(p.value())))
                .collect();
            (kind, points)
        }
        AggregatedMetrics::I64(MetricData::Sum(sum)) => {
            let kind = if sum.is_monotonic() {
                Kind::Counter
            } else {
                Kind::UpDownCounter
            };
            let points = sum
                .data_points()
                .map(|p| (attributes(p.attributes()), Value::I64(p.value())))
                .collect();
            (kind, points)
        }
        AggregatedMetrics::U64(MetricData::Gauge(gauge)) => {
            let points = gauge
                .data_points()
                .map(|p| (attributes(p.attributes()), Value::U64(p.value())))
                .collect();
            (Kind::Gauge, points)
        }
        AggregatedMetrics::U64(MetricData::Histogram(histogram)) => {
            let points = histogram
                .data_points()
                .map(|p| {
                    let sum = p.sum();
                    // Exact for the small sums tests record; `as` would be a lossy cast.
                    let sum = u32::try_from(sum).map(f64::from).unwrap_or(f64::NAN);
                    let value = Value::Histogram {
                        count: p.count(),
                        sum,
                        bounds: p.bounds().collect(),
                    };
                    (attributes(p.attributes()), value)
                })
                .collect();
            (Kind::Histogram, points)
        }
        AggregatedMetrics::F64(MetricData::Histogram(histogram)) => {
            let points = histogram
                .data_points()
                .map(|p| {
                    let value = Value::Histogram {
                        count: p.count(),
                        sum: p.sum(),
                        bounds: p.bounds().collect(),
                    };
                    (attributes(p.attributes()), value)
                })
                .collect();
            (Kind::Histogram, points)
        }
        other => return Err(format!("unexpected aggregation {other:?}").into()),
    })
}
