//! Which pods count and what their usage adds up to: a pure function of the pods, their
//! PodMetrics and the time, so that every rule here is unit tested without a cluster.
//!
//! The Datadog controller's rules (`GetResourceReplicas`, `groupPods`), and where this differs:
//! - usage per pod is the sum over its containers; a pod one of whose containers lacks the
//!   resource, or that has no containers in its PodMetrics, has no usage (as there);
//! - pods that are Failed (evicted), Succeeded, Pending, or of unknown phase do not count
//!   (there: Failed and Pending; the others there have no metrics and fall out as missing);
//! - pods being deleted (`deletionTimestamp` set) do not count: their load is moving to the
//!   others. The Datadog controller counts them for Resource metrics (it leaves them out of its
//!   ready count for External metrics only);
//! - for cpu only, a pod counts once Ready and Ready for at least the readiness delay (its
//!   start-up burst is not load). The Datadog controller's own test compares the pod's start
//!   time plus the delay with the Ready transition, which leaves out for good any pod that
//!   became ready within the delay of starting; "ready for at least the delay" is what the delay
//!   is for. Memory counts every Running pod, ready or not, as there (and in the HPA): memory has
//!   no start-up burst;
//! - a pod that counts but has no usable sample (none, stale, or a container without the
//!   resource) is *missing*. The Datadog controller drops it silently, which turns a metrics
//!   gap into a lower reading and so into a scale-down. Here the reading is then *partial*: a
//!   lower bound (missing pods at 0), which the daemon uses to scale up and never down.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use watermarkd_engine::{Decimal, Timestamp};

use crate::domain::rules::{parse_quantity, PodAggregation, ResourceName};

/// What decides whether one pod counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    /// `status.phase`; empty when the pod has no status yet.
    pub phase: String,
    pub deleting: bool,
    /// The Ready condition: `Some(true)` when True, `Some(false)` when False or Unknown,
    /// `None` when absent.
    pub ready: Option<bool>,
    /// When the Ready condition last changed (`lastTransitionTime`).
    pub ready_since: Option<Timestamp>,
    /// `status.startTime`.
    pub started: Option<Timestamp>,
}

impl PodView {
    pub fn from_pod(pod: &Pod) -> PodView {
        let status = pod.status.as_ref();
        let ready = status.and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
        let time = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
            Timestamp::from_unix_millis(t.0.as_millisecond())
        };
        PodView {
            name: pod.metadata.name.clone().unwrap_or_default(),
            phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            ready: ready.map(|c| c.status == "True"),
            ready_since: ready.and_then(|c| c.last_transition_time.as_ref()).map(time),
            started: status.and_then(|s| s.start_time.as_ref()).map(time),
        }
    }
}

/// One PodMetrics object, with the usage of each container parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSample {
    pub name: String,
    /// `timestamp`: the end of the window the usage was measured over. `None` when absent or
    /// unreadable, which makes the sample unusable.
    pub at: Option<Timestamp>,
    pub containers: Vec<ContainerSample>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ContainerSample {
    pub name: String,
    /// Usage in cores; `None` when absent or not a quantity.
    pub cpu: Option<Decimal>,
    /// Usage in bytes; `None` when absent or not a quantity.
    pub memory: Option<Decimal>,
}

impl PodSample {
    /// Reads a `metrics.k8s.io/v1beta1` PodMetrics (as JSON). Nothing in it is trusted to be
    /// there: a missing or malformed part makes that part missing, never 0.
    pub fn from_json(object: &Value) -> PodSample {
        let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        let at = object.get("timestamp").and_then(Value::as_str).and_then(Timestamp::parse_rfc3339);
        let quantity = |usage: &Value, key: &str| {
            usage.get(key).and_then(Value::as_str).and_then(|q| parse_quantity(q).ok()).filter(|d| !d.is_negative())
        };
        let containers = object
            .get("containers")
            .and_then(Value::as_array)
            .map(|containers| {
                containers
                    .iter()
                    .map(|c| {
                        let usage = c.get("usage").cloned().unwrap_or(Value::Null);
                        ContainerSample {
                            name: c.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                            cpu: quantity(&usage, "cpu"),
                            memory: quantity(&usage, "memory"),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        PodSample { name, at, containers }
    }

    /// The pod's usage of `resource`: the sum over its containers, or `None` when it has no
    /// container or one of them lacks the resource.
    fn usage(&self, resource: ResourceName) -> Option<Decimal> {
        if self.containers.is_empty() {
            return None;
        }
        self.containers.iter().try_fold(Decimal::zero(), |sum, c| {
            let value = match resource {
                ResourceName::Cpu => c.cpu.as_ref(),
                ResourceName::Memory => c.memory.as_ref(),
            }?;
            Some(sum.add(value))
        })
    }
}

/// How one resource metric reads its pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TallyRule {
    pub resource: ResourceName,
    pub aggregation: PodAggregation,
    /// cpu: a pod counts once it has been Ready this long.
    pub readiness_delay: Duration,
    /// A sample older than this is no sample.
    pub max_age: Duration,
}

/// Why a pod does not count, or counts but has no usable sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Excluded {
    pub pod: String,
    pub why: String,
}

/// The value of a resource metric, and how it came about.
#[derive(Clone, Debug, PartialEq)]
pub struct Tally {
    pub outcome: TallyOutcome,
    /// Pods that count and have a usable sample.
    pub measured: Vec<String>,
    /// Pods that count but have no usable sample.
    pub missing: Vec<Excluded>,
    /// Pods that do not count.
    pub ignored: Vec<Excluded>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TallyOutcome {
    /// Every pod that counts was measured. `at` is the oldest sample used.
    Complete { value: f64, at: Timestamp },
    /// Some pods that count were not measured: `value` is what the value would be with them at
    /// 0, so the true value is at least this. Good for showing usage is too high, never for
    /// showing it is low.
    Partial { value: f64, at: Timestamp },
    /// No value at all.
    Unavailable(String),
}

/// The metric's value over `pods` (those its selector selects) from `samples` (their
/// PodMetrics) at `now`. See the module documentation for the rules.
pub fn tally(rule: &TallyRule, pods: &[PodView], samples: &[PodSample], now: Timestamp) -> Tally {
    let mut tally = Tally {
        outcome: TallyOutcome::Unavailable(String::new()),
        measured: Vec::new(),
        missing: Vec::new(),
        ignored: Vec::new(),
    };
    let mut sum = Decimal::zero();
    let mut oldest: Option<Timestamp> = None;
    let mut counted = 0u32;
    for pod in pods {
        if let Some(why) = not_counted(rule, pod, now) {
            tally.ignored.push(Excluded { pod: pod.name.clone(), why });
            continue;
        }
        counted += 1;
        match measure(rule, pod, samples, now) {
            Ok((usage, at)) => {
                sum = sum.add(&usage);
                oldest = Some(oldest.map_or(at, |o| o.min(at)));
                tally.measured.push(pod.name.clone());
            }
            Err(why) => tally.missing.push(Excluded { pod: pod.name.clone(), why }),
        }
    }
    let total = sum.to_f64();
    let value = match rule.aggregation {
        PodAggregation::Sum => total,
        // Missing pods are in the divisor: at 0 they make the average a lower bound as well.
        PodAggregation::Average => total / f64::from(counted.max(1)),
    };
    tally.outcome = match oldest {
        _ if counted == 0 && pods.is_empty() => TallyOutcome::Unavailable("no pod matches the selector".into()),
        _ if counted == 0 => TallyOutcome::Unavailable(format!(
            "none of the {} selected pods counts ({})",
            pods.len(),
            summarize(&tally.ignored)
        )),
        None => TallyOutcome::Unavailable(format!(
            "no usable metrics for any of the {counted} pods that count ({})",
            summarize(&tally.missing)
        )),
        Some(at) if tally.missing.is_empty() => TallyOutcome::Complete { value, at },
        Some(at) => TallyOutcome::Partial { value, at },
    };
    tally
}

/// Why a pod does not count, if it does not.
fn not_counted(rule: &TallyRule, pod: &PodView, now: Timestamp) -> Option<String> {
    if pod.deleting {
        return Some("being deleted".into());
    }
    match pod.phase.as_str() {
        "Running" => {}
        "Failed" => return Some("failed (evicted or crashed)".into()),
        "" => return Some("no phase yet".into()),
        other => return Some(other.to_lowercase()),
    }
    if rule.resource == ResourceName::Memory {
        return None;
    }
    if pod.ready != Some(true) {
        return Some("not ready".into());
    }
    // Without any time to go by, the delay cannot be judged: the pod counts.
    let since = pod.ready_since.or(pod.started)?;
    let ready_for = now.since(since);
    (ready_for < rule.readiness_delay).then(|| {
        format!("ready for {}s, under the readiness delay of {}s", ready_for.as_secs(), rule.readiness_delay.as_secs())
    })
}

/// The pod's usage and sample time, or why it has none.
fn measure(
    rule: &TallyRule,
    pod: &PodView,
    samples: &[PodSample],
    now: Timestamp,
) -> Result<(Decimal, Timestamp), String> {
    let sample = samples.iter().find(|s| s.name == pod.name).ok_or_else(|| "no metrics".to_string())?;
    let at = sample.at.ok_or_else(|| "metrics without a timestamp".to_string())?;
    let age = now.since(at);
    if age > rule.max_age {
        return Err(format!("metrics {}s old, over the max age of {}s", age.as_secs(), rule.max_age.as_secs()));
    }
    let usage = sample.usage(rule.resource).ok_or_else(|| format!("no {} usage for every container", rule.resource))?;
    Ok((usage, at))
}

/// `web-1: not ready; web-2: pending`, at most five, then how many more.
fn summarize(excluded: &[Excluded]) -> String {
    let mut parts: Vec<String> = excluded.iter().take(5).map(|e| format!("{}: {}", e.pod, e.why)).collect();
    if excluded.len() > 5 {
        parts.push(format!("{} more", excluded.len() - 5));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests;
