//! Reading back what keiro recorded, through the OpenTelemetry SDK's in-memory exporter
//! (feature `testing`): for tests of code that takes a [`Metrics`].
//!
//! ```
//! use keiro_telemetry::testing::Recorder;
//! let recorder = Recorder::new();
//! recorder.metrics.resumed("order");
//! assert_eq!(recorder.total("keiro.workflow.resumed").unwrap(), 1.0);
//! ```

use std::collections::BTreeMap;
use std::error::Error;

use super::Metrics;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

/// Attributes of one data point, sorted by key so comparisons ignore recording order.
pub type Attributes = BTreeMap<String, String>;

/// Builds [`Attributes`] from literal pairs.
pub fn attrs(pairs: &[(&str, &str)]) -> Attributes {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

/// One data point: its attributes and its value.
pub type Point = (Attributes, Value);

/// How the SDK aggregated an instrument, which tells the instrument kind apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A monotonic sum.
    Counter,
    /// A non-monotonic sum.
    UpDownCounter,
    /// A last-value gauge.
    Gauge,
    /// A histogram.
    Histogram,
}

/// The value of one data point.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An unsigned value.
    U64(u64),
    /// A signed value.
    I64(i64),
    /// A histogram's count, sum and bucket bounds.
    Histogram {
        /// Recordings.
        count: u64,
        /// Their sum.
        sum: f64,
        /// Bucket bounds.
        bounds: Vec<f64>,
    },
}

/// One exported instrument.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    /// Instrumentation scope name.
    pub scope: String,
    /// Instrumentation scope version.
    pub scope_version: Option<String>,
    /// Instrument name.
    pub name: String,
    /// Unit.
    pub unit: String,
    /// Description.
    pub description: String,
    /// Aggregation kind.
    pub kind: Kind,
    /// Data points.
    pub points: Vec<Point>,
}

/// A meter provider wired to the SDK's in-memory exporter, with a [`Metrics`] handle on it.
pub struct Recorder {
    provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
    /// The handle to pass to keiro.
    pub metrics: Metrics,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// A fresh provider, exporter and handle.
    pub fn new() -> Self {
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
    pub fn collect(&self) -> Result<Vec<Exported>, Box<dyn Error + Send + Sync>> {
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
    pub fn instrument(&self, name: &str) -> Result<Exported, Box<dyn Error + Send + Sync>> {
        self.collect()?
            .into_iter()
            .find(|exported| exported.name == name)
            .ok_or_else(|| format!("instrument {name} was not exported").into())
    }

    /// The data points of `name`, sorted by attributes.
    pub fn points(&self, name: &str) -> Result<Vec<Point>, Box<dyn Error + Send + Sync>> {
        let mut points = self.instrument(name)?.points;
        points.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(points)
    }
}

fn attributes<'a>(kvs: impl Iterator<Item = &'a opentelemetry::KeyValue>) -> Attributes {
    kvs.map(|kv| (kv.key.as_str().to_owned(), kv.value.to_string()))
        .collect()
}

fn points(data: &AggregatedMetrics) -> Result<(Kind, Vec<Point>), Box<dyn Error + Send + Sync>> {
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

impl Recorder {
    /// The sum over all data points of `name` (a counter's total, an up-down counter's
    /// current value, a gauge's last values summed, a histogram's count); 0 when nothing was
    /// recorded.
    pub fn total(&self, name: &str) -> Result<f64, Box<dyn Error + Send + Sync>> {
        let Some(exported) = self.collect()?.into_iter().find(|e| e.name == name) else {
            return Ok(0.0);
        };
        let mut total = 0.0;
        for (_, value) in exported.points {
            total += match value {
                Value::U64(v) => u32::try_from(v).map(f64::from).unwrap_or(f64::INFINITY),
                Value::I64(v) => i32::try_from(v).map(f64::from).unwrap_or(f64::INFINITY),
                Value::Histogram { count, .. } => {
                    u32::try_from(count).map(f64::from).unwrap_or(f64::INFINITY)
                }
            };
        }
        Ok(total)
    }
}
