//! Leader election with a `coordination.k8s.io/v1` Lease, so that two daemons can run and only
//! one scales.
//!
//! Like client-go's elector, a follower does not compare the holder's `renewTime` with its own
//! clock (the two hosts' clocks may disagree): it notes when it last saw the lease record
//! change, on its own monotonic clock, and takes over only when the record has not changed for a
//! whole lease duration. Every write carries the `resourceVersion` it read, so two candidates
//! racing for an expired lease cannot both win. A leader that shuts down releases the lease so
//! the other daemon takes over at its next retry instead of a full duration later.
//!
//! # Writing only while the lease is provably held
//! A follower may take over a whole lease duration after it first saw our last renewal, and
//! that renewal was written after we sent it. So this process counts its right to write,
//! [`Authority`], from the moment it *sent* its last successful renewal, for the renew
//! deadline (shorter than the lease duration), on its own monotonic clock. Every attempt to
//! renew is bounded by that same moment, so a hanging API server (etcd down) cannot keep a
//! leader believing it leads; and every write the daemon makes is bounded by the time left
//! ([`Authority::write_budget`]), so none can still be in flight, as far as this process
//! knows, when another daemon may start writing.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Who scales, as this process knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Not known yet (before the first look at the lease).
    Unknown,
    Leader,
    /// Another daemon holds the lease (`None`: nobody, but it has not expired for us yet).
    Follower {
        holder: Option<String>,
    },
}

/// The Lease name when none is configured.
pub const DEFAULT_NAME: &str = "watermarkd";
/// The Lease namespace when none is configured and the daemon does not run in a pod.
pub const DEFAULT_NAMESPACE: &str = "watermarkd";
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The `[lease]` settings, and what [`LeaderElector`] runs with.
///
/// `enabled: false` (`--no-leader-election`) keeps the other fields: `identity` still names
/// this daemon in the Events it publishes, and the durations are still checked, so turning
/// election back on cannot reveal a bad value only then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Whether the daemon elects a leader at all; the elector itself does not read it.
    pub enabled: bool,
    pub namespace: String,
    pub name: String,
    /// This process, unique among the candidates (e.g. the pod name, or host plus pid).
    pub identity: String,
    /// How long a lease holds without renewal (`[lease] duration`).
    pub lease_duration: Duration,
    /// A leader that could not renew for this long stops scaling (shorter than the lease
    /// duration so it stops before another daemon may start).
    pub renew_deadline: Duration,
    /// How often to renew or retry.
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// Election on, with the default durations.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        LeaseSettings {
            enabled: true,
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }

    /// The ordering the elector relies on: it retries before its deadline, and stops leading
    /// before another daemon may take over.
    pub fn validate(&self) -> Result<(), String> {
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "lease.renew_deadline ({}) must be shorter than lease.duration ({})",
                humantime::format_duration(self.renew_deadline),
                humantime::format_duration(self.lease_duration)
            ));
        }
        if self.retry_period >= self.renew_deadline {
            return Err("lease.retry_period must be shorter than lease.renew_deadline".into());
        }
        Ok(())
    }
}

/// Without a lease, a write is still bounded: a request that hangs must not hold its
/// autoscaler's evaluation (and its next cycle) forever.
pub const UNLEASED_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A write is not started with less time than this left: it could hardly complete.
const MIN_WRITE_BUDGET: Duration = Duration::from_millis(200);

/// Whether, and for how long, this process may write to the cluster as the one that scales.
/// Shared by the elector, which extends it at each successful renewal, and every writer.
#[derive(Clone, Debug)]
pub struct Authority(AuthorityKind);

#[derive(Clone, Debug)]
enum AuthorityKind {
    /// No leader election: this process always scales.
    Unleased,
    /// Until the instant held, or not at all.
    Leased(Arc<Mutex<Option<Instant>>>),
}

impl Authority {
    /// For a daemon that runs without a lease.
    pub fn unleased() -> Self {
        Authority(AuthorityKind::Unleased)
    }

    fn leased() -> Self {
        Authority(AuthorityKind::Leased(Arc::new(Mutex::new(None))))
    }

    /// How long a write started now may take: `None` when this process may not write now.
    pub fn write_budget(&self) -> Option<Duration> {
        match &self.0 {
            AuthorityKind::Unleased => Some(UNLEASED_WRITE_TIMEOUT),
            AuthorityKind::Leased(_) => {
                let left = self.until()?.checked_duration_since(Instant::now())?;
                (left >= MIN_WRITE_BUDGET).then_some(left)
            }
        }
    }

    /// The end of the right to write (`None`: none, or unleased).
    fn until(&self) -> Option<Instant> {
        match &self.0 {
            AuthorityKind::Unleased => None,
            AuthorityKind::Leased(until) => *until.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    fn set(&self, value: Option<Instant>) {
        if let AuthorityKind::Leased(until) = &self.0 {
            *until.lock().unwrap_or_else(PoisonError::into_inner) = value;
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("lease {namespace}/{name}: the API server refused to {verb} it (forbidden): grant {verb} on leases.coordination.k8s.io")]
    Forbidden { namespace: String, name: String, verb: &'static str },
    #[error("lease {namespace}/{name}: {source}")]
    Api { namespace: String, name: String, source: kube::Error },
    #[error("lease {namespace}/{name}: no answer from the API server within {seconds:.1}s")]
    Timeout { namespace: String, name: String, seconds: f64 },
}

/// What to do about the lease as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// No lease object yet: create it, holding it.
    Create,
    /// Ours: renew it.
    Renew,
    /// Free (released) or expired: take it over.
    TakeOver,
    /// Held by someone else and not expired (as far as we have observed).
    Wait { holder: Option<String> },
}

/// The record that tells whether a holder is alive: it changes at every renewal.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    duration_seconds: Option<i32>,
}

/// Decides from the lease as read and from when this process last saw its record change.
pub(crate) fn claim(spec: Option<&LeaseSpec>, me: &str, record_unchanged_for: Duration, default: Duration) -> Claim {
    let Some(spec) = spec else { return Claim::Create };
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    match holder {
        None => Claim::TakeOver,
        Some(h) if h == me => Claim::Renew,
        Some(h) => {
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or(default);
            if record_unchanged_for >= duration {
                Claim::TakeOver
            } else {
                Claim::Wait { holder: Some(h) }
            }
        }
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
    observed: Option<(Observed, Instant)>,
    authority: Authority,
    role: watch::Sender<Role>,
}

impl LeaderElector {
    pub fn new(client: Client, settings: LeaseSettings) -> Self {
        let api = Api::namespaced(client, &settings.namespace);
        let (role, _) = watch::channel(Role::Unknown);
        LeaderElector { api, settings, observed: None, authority: Authority::leased(), role }
    }

    /// The right to write that this elector maintains, for the writers.
    pub fn authority(&self) -> Authority {
        self.authority.clone()
    }

    /// Follows the role as it changes.
    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }

    fn error(&self, verb: &'static str, source: kube::Error) -> LeaseError {
        let (namespace, name) = (self.settings.namespace.clone(), self.settings.name.clone());
        match &source {
            kube::Error::Api(status) if status.code == 403 => LeaseError::Forbidden { namespace, name, verb },
            _ => LeaseError::Api { namespace, name, source },
        }
    }

    /// One attempt to acquire or renew; publishes and returns the resulting role. A leader's
    /// attempt is given only until its right to write ends; anyone else's, the renew deadline.
    pub async fn step(&mut self) -> Result<Role, LeaseError> {
        let started = Instant::now();
        let bound =
            self.authority.until().filter(|until| *until > started).unwrap_or(started + self.settings.renew_deadline);
        let result = match tokio::time::timeout_at(bound, self.try_step(started)).await {
            Ok(result) => result,
            Err(_) => Err(LeaseError::Timeout {
                namespace: self.settings.namespace.clone(),
                name: self.settings.name.clone(),
                seconds: bound.duration_since(started).as_secs_f64(),
            }),
        };
        // A leader keeps its role through short API trouble, but only while its right to write
        // lasts; a renewal whose answer came too late to leave any does not make a leader.
        let holds = self.authority.write_budget().is_some();
        let role = match &result {
            Ok(Role::Leader) if holds => Role::Leader,
            Err(_) if holds && self.is_leader() => Role::Leader,
            Ok(Role::Leader) => Role::Follower { holder: None },
            Err(_) if self.is_leader() => Role::Follower { holder: None },
            Ok(role) => role.clone(),
            Err(_) => self.role.borrow().clone(),
        };
        if role != Role::Leader {
            self.authority.set(None);
        }
        self.publish(role.clone());
        result.map(|_| role)
    }

    fn is_leader(&self) -> bool {
        *self.role.borrow() == Role::Leader
    }

    fn publish(&self, role: Role) {
        self.role.send_if_modified(|current| {
            if *current == role {
                return false;
            }
            tracing::info!(lease = %self.settings.name, identity = %self.settings.identity, ?role, "leader election role changed");
            *current = role;
            true
        });
    }

    /// `started`: when this attempt began, before anything was sent.
    async fn try_step(&mut self, started: Instant) -> Result<Role, LeaseError> {
        let current = self.api.get_opt(&self.settings.name).await.map_err(|e| self.error("get", e))?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let unchanged_for = self.note(spec);
        match claim(spec, &self.settings.identity, unchanged_for, self.settings.lease_duration) {
            Claim::Wait { holder } => Ok(Role::Follower { holder }),
            Claim::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.settings.name.clone()),
                        namespace: Some(self.settings.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.held(None, 0)),
                };
                let result = self.api.create(&PostParams::default(), &lease).await;
                self.write(result, "create", started)
            }
            Claim::Renew | Claim::TakeOver => {
                let Some(mut lease) = current else { return Ok(Role::Follower { holder: None }) };
                let previous = lease.spec.take().unwrap_or_default();
                let ours = previous.holder_identity.as_deref() == Some(self.settings.identity.as_str());
                let transitions = previous.lease_transitions.unwrap_or(0) + i32::from(!ours);
                let acquired = if ours { previous.acquire_time } else { None };
                lease.spec = Some(self.held(acquired, transitions));
                // `lease` still carries the resourceVersion we read: a racing write gets a 409.
                let result = self.api.replace(&self.settings.name, &PostParams::default(), &lease).await;
                self.write(result, "update", started)
            }
        }
    }

    /// Records when the lease record last changed; returns how long it has been unchanged.
    fn note(&mut self, spec: Option<&LeaseSpec>) -> Duration {
        let record = Observed {
            holder: spec.and_then(|s| s.holder_identity.clone()),
            renew_time: spec.and_then(|s| s.renew_time.clone()),
            duration_seconds: spec.and_then(|s| s.lease_duration_seconds),
        };
        match &self.observed {
            Some((seen, at)) if *seen == record => at.elapsed(),
            _ => {
                self.observed = Some((record, Instant::now()));
                Duration::ZERO
            }
        }
    }

    fn held(&self, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        let now = micro_now();
        LeaseSpec {
            holder_identity: Some(self.settings.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.settings.lease_duration.as_secs()).unwrap_or(i32::MAX)),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn write(
        &mut self,
        result: Result<Lease, kube::Error>,
        verb: &'static str,
        sent: Instant,
    ) -> Result<Role, LeaseError> {
        match result {
            Ok(_) => {
                // Counted from before the request went out: the record others time us by was
                // written after that.
                self.authority.set(Some(sent + self.settings.renew_deadline));
                Ok(Role::Leader)
            }
            // Someone else wrote first (409) or created it first: they hold it now.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Role::Follower { holder: None }),
            Err(e) => Err(self.error(verb, e)),
        }
    }

    /// Gives the lease up so another daemon can take over at once (graceful shutdown).
    pub async fn release(&mut self) -> Result<(), LeaseError> {
        if !self.is_leader() {
            return Ok(());
        }
        self.publish(Role::Follower { holder: None });
        self.authority.set(None);
        let Some(mut lease) = self.api.get_opt(&self.settings.name).await.map_err(|e| self.error("get", e))? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else { return Ok(()) };
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(micro_now());
        match self.api.replace(&self.settings.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            // Taken over already: nothing left to release.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(e) => Err(self.error("update", e)),
        }
    }

    /// Renews or retries every retry period until `stop` is cancelled, then releases.
    pub async fn run(mut self, stop: CancellationToken) {
        loop {
            if let Err(err) = self.step().await {
                tracing::warn!(error = %err, "leader election attempt failed");
            }
            // A leader whose renewals keep failing wakes when its right to write ends, so that
            // it stops saying it leads then, not a retry period later.
            let mut next = Instant::now() + self.settings.retry_period;
            if let Some(until) = self.authority.until().filter(|_| self.is_leader()) {
                next = next.min(until);
            }
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                () = stop.cancelled() => break,
            }
        }
        if let Err(err) = self.release().await {
            tracing::warn!(error = %err, "could not release the lease; the other daemon takes over when it expires");
        }
    }
}

fn micro_now() -> MicroTime {
    let micros = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0);
    let micros = i64::try_from(micros).unwrap_or(i64::MAX);
    MicroTime(
        k8s_openapi::jiff::Timestamp::from_microsecond(micros).unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: &str, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        }
    }

    const DEFAULT: Duration = Duration::from_secs(15);

    #[test]
    fn a_missing_lease_is_created_and_our_own_is_renewed() {
        assert_eq!(claim(None, "a", Duration::ZERO, DEFAULT), Claim::Create);
        assert_eq!(claim(Some(&held_by("a", 15)), "a", Duration::from_secs(99), DEFAULT), Claim::Renew);
    }

    #[test]
    fn another_holder_is_waited_out_for_a_whole_duration_of_silence() {
        let other = held_by("b", 15);
        assert_eq!(
            claim(Some(&other), "a", Duration::from_secs(14), DEFAULT),
            Claim::Wait { holder: Some("b".into()) }
        );
        assert_eq!(claim(Some(&other), "a", Duration::from_secs(15), DEFAULT), Claim::TakeOver);
        // The holder's own duration counts, not ours.
        assert_eq!(
            claim(Some(&held_by("b", 40)), "a", Duration::from_secs(30), DEFAULT),
            Claim::Wait { holder: Some("b".into()) }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_right_to_write_ends_at_its_deadline_and_bounds_each_write() {
        assert_eq!(Authority::unleased().write_budget(), Some(UNLEASED_WRITE_TIMEOUT));
        let authority = Authority::leased();
        assert_eq!(authority.write_budget(), None, "nothing before the first renewal");
        authority.set(Some(Instant::now() + Duration::from_secs(10)));
        assert_eq!(authority.write_budget(), Some(Duration::from_secs(10)));
        tokio::time::advance(Duration::from_millis(9_700)).await;
        assert_eq!(authority.write_budget(), Some(Duration::from_millis(300)));
        // Too little left for a write to complete: none is started.
        tokio::time::advance(Duration::from_millis(150)).await;
        assert_eq!(authority.write_budget(), None);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(authority.write_budget(), None);
    }

    /// An API server that accepts connections and never answers (etcd down).
    async fn hanging_api_server() -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let config = kube::Config::new(url.parse().expect("url"));
        Client::try_from(config).expect("client")
    }

    #[tokio::test]
    async fn a_leader_whose_api_server_hangs_stops_leading_at_its_deadline() {
        let mut settings = LeaseSettings::new("default", "watermarkd", "a");
        settings.renew_deadline = Duration::from_millis(1_500);
        let mut elector = LeaderElector::new(hanging_api_server().await, settings);
        // As after a renewal sent 500 ms ago.
        let sent = Instant::now() - Duration::from_millis(500);
        elector.authority.set(Some(sent + Duration::from_millis(1_500)));
        elector.publish(Role::Leader);
        let authority = elector.authority();
        let role = elector.subscribe();

        let step = elector.step().await;
        let deadline = sent + Duration::from_millis(1_500);
        assert!(matches!(step, Err(LeaseError::Timeout { .. })), "{step:?}");
        // The attempt was cut at the deadline, not at some request timeout after it.
        assert!(Instant::now() >= deadline && Instant::now() < deadline + Duration::from_millis(500));
        assert_eq!(*role.borrow(), Role::Follower { holder: None });
        assert_eq!(authority.write_budget(), None);
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let mut released = held_by("b", 1);
        released.holder_identity = None;
        assert_eq!(claim(Some(&released), "a", Duration::ZERO, DEFAULT), Claim::TakeOver);
        released.holder_identity = Some(String::new());
        assert_eq!(claim(Some(&released), "a", Duration::ZERO, DEFAULT), Claim::TakeOver);
    }
}
