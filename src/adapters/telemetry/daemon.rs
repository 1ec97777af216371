//! The daemon's own series: evaluations, Kubernetes writes, reloads, leadership.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

#[derive(Clone)]
pub struct DaemonMetrics {
    /// Evaluations by result: `scaled`, `held`, `dry_run`, `failed`, `skipped` (still running
    /// when it fell due again).
    pub evaluations: IntCounterVec,
    /// Time from an evaluation's start (its metrics already queried) to its last write.
    pub evaluation_seconds: HistogramVec,
    /// Metric queries of one due group, from request to answer, by backend.
    pub cycle_seconds: HistogramVec,
    /// How late the daemon's loop took up the autoscalers that fell due: from the instant they
    /// were due to the one it handed them out. What anything that holds the loop's thread adds
    /// shows here first.
    pub loop_lateness_seconds: prometheus::Histogram,
    /// Kubernetes writes by what (`scale`, `state`, `status`, `event`) and outcome (`ok`,
    /// `conflict`, `error`).
    pub kubernetes_writes: IntCounterVec,
    /// Rule reloads by result (`success`, `failure`).
    pub reloads: IntCounterVec,
    /// 1 when the last reload attempt was valid.
    pub last_reload_successful: IntGauge,
    /// 1 while this daemon holds the Lease (or runs without one).
    pub leader: IntGauge,
    /// Autoscalers by source (`file`, `crd`) and state (`running`, `invalid`).
    pub autoscalers: IntGaugeVec,
}

impl DaemonMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = DaemonMetrics {
            evaluations: IntCounterVec::new(
                Opts::new("watermarkd_evaluations_total", "Autoscaler evaluations by result"),
                &["result"],
            )?,
            evaluation_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "watermarkd_evaluation_duration_seconds",
                    "Time from metrics in hand to decision written",
                )
                .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
                &["source"],
            )?,
            cycle_seconds: HistogramVec::new(
                HistogramOpts::new("watermarkd_query_cycle_duration_seconds", "Time to query one due group's metrics")
                    .buckets(vec![0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
                &["backend"],
            )?,
            loop_lateness_seconds: prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "watermarkd_loop_lateness_seconds",
                    "Time from the instant autoscalers fell due to the one the daemon's loop started them",
                )
                .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            )?,
            kubernetes_writes: IntCounterVec::new(
                Opts::new("watermarkd_kubernetes_writes_total", "Writes to the Kubernetes API by kind and outcome"),
                &["kind", "outcome"],
            )?,
            reloads: IntCounterVec::new(
                Opts::new("watermarkd_config_reloads_total", "Rules reloads by result"),
                &["result"],
            )?,
            last_reload_successful: IntGauge::new(
                "watermarkd_config_last_reload_successful",
                "1 when the last rules reload was valid",
            )?,
            leader: IntGauge::new("watermarkd_leader", "1 while this daemon is the one that scales")?,
            autoscalers: IntGaugeVec::new(
                Opts::new("watermarkd_autoscalers", "Autoscalers by source and state"),
                &["source", "state"],
            )?,
        };
        registry.register(Box::new(metrics.evaluations.clone()))?;
        registry.register(Box::new(metrics.evaluation_seconds.clone()))?;
        registry.register(Box::new(metrics.cycle_seconds.clone()))?;
        registry.register(Box::new(metrics.loop_lateness_seconds.clone()))?;
        registry.register(Box::new(metrics.kubernetes_writes.clone()))?;
        registry.register(Box::new(metrics.reloads.clone()))?;
        registry.register(Box::new(metrics.last_reload_successful.clone()))?;
        registry.register(Box::new(metrics.leader.clone()))?;
        registry.register(Box::new(metrics.autoscalers.clone()))?;
        Ok(metrics)
    }

    pub fn write(&self, kind: &str, outcome: &str) {
        self.kubernetes_writes.with_label_values(&[kind, outcome]).inc();
    }
}
