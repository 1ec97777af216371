//! Events (`watermarkd::adapters::events`) against a real kube-apiserver: what a stuck autoscaler's
//! failures cost the API server.
//!
//! Needs kube-apiserver and etcd: scripts/install-test-deps installs them. Missing binaries fail
//! the tests rather than skip them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and panic, and the helpers beside them do the same"
)]

#[path = "support/kube_cluster.rs"]
mod kube_cluster;

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube_cluster::KubeCluster;
use watermarkd::adapters::events::{EventPublisher, EventType, Published, Repeats};

/// An outage: every cycle's failure names its own duration and resourceVersion. One Event
/// reaches the API server per object and reason; another reason is another Event.
#[tokio::test]
async fn failures_whose_texts_differ_give_one_event_per_reason() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("events").await;
    cluster.create_deployment(&ns, "billing", 2).await;
    let publisher = EventPublisher::new(cluster.client(), "test", Duration::from_secs(300));
    let object = ObjectReference {
        api_version: Some("apps/v1".into()),
        kind: Some("Deployment".into()),
        namespace: Some(ns.clone()),
        name: Some("billing".into()),
        ..ObjectReference::default()
    };
    let mut sent = 0;
    for cycle in 0..30 {
        let note = format!("cannot scale: no answer within {}.{cycle}s (resourceVersion {})", cycle % 4, 900 + cycle);
        let published = publisher
            .publish(&object, EventType::Warning, "FailedGetScale", &note, "GetScale", Repeats::Suppress)
            .await
            .expect("the API server takes the event");
        if published == Published::Sent {
            sent += 1;
        }
    }
    let other = publisher
        .publish(
            &object,
            EventType::Warning,
            "FailedRescale",
            "could not scale to 3: timeout",
            "Scale",
            Repeats::Suppress,
        )
        .await
        .expect("the API server takes the event");
    assert_eq!((sent, other), (1, Published::Sent));

    let api: Api<Event> = Api::namespaced(cluster.client(), &ns);
    let events = api.list(&ListParams::default()).await.expect("list events").items;
    let mut reasons: Vec<(String, String)> =
        events.iter().map(|e| (e.reason.clone().unwrap_or_default(), e.note.clone().unwrap_or_default())).collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            ("FailedGetScale".to_string(), "cannot scale: no answer within 0.0s (resourceVersion 900)".to_string()),
            ("FailedRescale".to_string(), "could not scale to 3: timeout".to_string()),
        ]
    );
}
