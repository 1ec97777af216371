//! Leader election against a real kube-apiserver: one leader at a time, takeover after a
//! holder goes silent for a lease duration, immediate takeover after a release.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[path = "support/kube_cluster.rs"]
mod kube_cluster;

use std::time::{Duration, Instant};

use kube_cluster::KubeCluster;
use watermarkd::adapters::lease::{LeaderElector, LeaseError, LeaseSettings, Role};

fn settings(namespace: &str, identity: &str) -> LeaseSettings {
    let mut s = LeaseSettings::new(namespace, "watermarkd", identity);
    s.lease_duration = Duration::from_secs(3);
    s.renew_deadline = Duration::from_secs(2);
    s.retry_period = Duration::from_millis(200);
    s
}

#[tokio::test]
async fn one_leader_then_takeover_after_silence_or_release() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("lease").await;
    let mut a = LeaderElector::new(cluster.client(), settings(&ns, "daemon-a"));
    let mut b = LeaderElector::new(cluster.client(), settings(&ns, "daemon-b"));

    assert_eq!(a.step().await.unwrap(), Role::Leader);
    assert_eq!(b.step().await.unwrap(), Role::Follower { holder: Some("daemon-a".into()) });
    // A renews; B keeps waiting however often it asks.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(a.step().await.unwrap(), Role::Leader);
        assert_eq!(b.step().await.unwrap(), Role::Follower { holder: Some("daemon-a".into()) });
    }

    // A goes silent (as after kill -9): B takes over once the record has been unchanged for a
    // lease duration, not before.
    let silent_since = Instant::now();
    let took_over_after = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if b.step().await.unwrap() == Role::Leader {
            break silent_since.elapsed();
        }
        assert!(silent_since.elapsed() < Duration::from_secs(10), "B never took over");
    };
    assert!(took_over_after >= Duration::from_millis(2800), "B took over after only {took_over_after:?}");
    assert!(took_over_after < Duration::from_secs(5), "B took {took_over_after:?}");
    // A comes back: the lease is B's now.
    assert_eq!(a.step().await.unwrap(), Role::Follower { holder: Some("daemon-b".into()) });

    // B releases on shutdown: A takes over at its next attempt, without waiting a duration.
    b.release().await.unwrap();
    assert_eq!(a.step().await.unwrap(), Role::Leader);
    assert_eq!(b.step().await.unwrap(), Role::Follower { holder: Some("daemon-a".into()) });
}

#[tokio::test]
async fn racing_candidates_never_both_lead() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("lease-race").await;
    let mut electors: Vec<LeaderElector> =
        (0..4).map(|i| LeaderElector::new(cluster.client(), settings(&ns, &format!("daemon-{i}")))).collect();
    let roles = futures_join_all(&mut electors).await;
    let leaders = roles.iter().filter(|r| **r == Role::Leader).count();
    assert_eq!(leaders, 1, "{roles:?}");
}

/// Steps every elector at the same moment.
async fn futures_join_all(electors: &mut [LeaderElector]) -> Vec<Role> {
    let mut set = tokio::task::JoinSet::new();
    for (i, elector) in electors.iter_mut().enumerate() {
        // Move each elector into its task and back, so all requests are in flight together.
        let mut owned = std::mem::replace(elector, placeholder());
        set.spawn(async move {
            let role = owned.step().await.unwrap_or(Role::Unknown);
            (i, owned, role)
        });
    }
    let mut roles = vec![Role::Unknown; electors.len()];
    while let Some(joined) = set.join_next().await {
        let (i, owned, role) = joined.unwrap();
        electors[i] = owned;
        roles[i] = role;
    }
    roles
}

fn placeholder() -> LeaderElector {
    LeaderElector::new(KubeCluster::shared().client(), settings("unused", "unused"))
}

#[tokio::test]
async fn a_daemon_without_rights_on_leases_is_told_which() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("lease-rbac").await;
    let mut elector = LeaderElector::new(cluster.client_as("no-lease-rights"), settings(&ns, "daemon-x"));
    let err = elector.step().await.unwrap_err();
    assert!(matches!(err, LeaseError::Forbidden { verb: "get", .. }), "{err}");
    assert!(err.to_string().contains("grant get on leases.coordination.k8s.io"), "{err}");
}
