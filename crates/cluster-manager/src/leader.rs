//! Leader election on a coordination.k8s.io/v1 Lease, for running more than one cluster
//! manager replica (`--leader-elect`). The decision is a pure function ([`decide`]); the shell
//! gets, creates or replaces the Lease with optimistic concurrency, so two candidates can never
//! both win the same round (the loser's write is a 409 Conflict).
//!
//! A leader that cannot renew before its lease would expire stops ([`run_as_leader`] returns an
//! error) rather than risk two writers; the process supervisor restarts it as a candidate.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};

/// Leader election settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This candidate's identity (unique per process).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// How often the leader renews (and a candidate retries).
    pub retry_period: Duration,
}

/// What a candidate should do with the Lease it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease yet: create it holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Nobody holds it or the holder let it expire: take it over.
    TakeOver,
    /// Someone else holds a valid lease.
    Follow {
        /// The current holder.
        holder: String,
    },
}

/// Decides from the Lease as read at `now`.
pub fn decide(lease: Option<&Lease>, me: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return if lease.is_none() {
            Decision::Create
        } else {
            Decision::TakeOver
        };
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return Decision::Renew;
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0).max(0));
    let last = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    let expired = match last {
        Some(t) => t
            .checked_add(SignedDuration::from_secs(duration))
            .map_or(true, |end| end < now),
        None => true,
    };
    if holder.is_empty() || expired {
        Decision::TakeOver
    } else {
        Decision::Follow { holder }
    }
}

fn spec(
    cfg: &LeaseConfig,
    now: Timestamp,
    acquired: Option<MicroTime>,
    transitions: i32,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(cfg.identity.clone()),
        lease_duration_seconds: Some(
            cfg.lease_duration.as_secs().max(1).min(i32::MAX as u64) as i32
        ),
        acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

/// One round: returns whether we hold the lease afterwards.
async fn round(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let cur = api.get_opt(&cfg.name).await?;
    let pp = PostParams::default();
    let res = match decide(cur.as_ref(), &cfg.identity, now) {
        Decision::Follow { holder } => {
            tracing::debug!(holder = %holder, "lease held by another candidate");
            return Ok(false);
        }
        Decision::Create => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec(cfg, now, None, 0)),
            };
            api.create(&pp, &lease).await
        }
        Decision::Renew | Decision::TakeOver => {
            let Some(mut lease) = cur else {
                return Ok(false);
            };
            let old = lease.spec.clone().unwrap_or_default();
            let renewing = old.holder_identity.as_deref() == Some(cfg.identity.as_str());
            let transitions = old.lease_transitions.unwrap_or(0) + i32::from(!renewing);
            let acquired = if renewing { old.acquire_time } else { None };
            lease.spec = Some(spec(cfg, now, acquired, transitions));
            api.replace(&cfg.name, &pp, &lease).await
        }
    };
    match res {
        Ok(_) => Ok(true),
        // Another candidate wrote first: not ours this round.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Waits until this candidate holds the Lease, then runs `work` while renewing it. Returns
/// `work`'s result, or an error once leadership is lost (not renewed within the lease
/// duration, or taken by another candidate).
pub async fn run_as_leader<F, Fut>(client: Client, cfg: LeaseConfig, work: F) -> anyhow::Result<()>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    tracing::info!(lease = %cfg.name, namespace = %cfg.namespace, identity = %cfg.identity, "waiting for leadership");
    loop {
        match round(&api, &cfg).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "leader election round failed"),
        }
        tokio::time::sleep(cfg.retry_period).await;
    }
    tracing::info!(identity = %cfg.identity, "became leader");
    let renew = async {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(cfg.retry_period).await;
            match round(&api, &cfg).await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => anyhow::bail!(
                    "leadership lost: lease {} taken by another candidate",
                    cfg.name
                ),
                Err(e) => tracing::warn!(error = %e, "renewing the lease failed"),
            }
            if last_ok.elapsed() >= cfg.lease_duration {
                anyhow::bail!("leadership lost: lease {} not renewed in time", cfg.name);
            }
        }
    };
    tokio::select! {
        r = work() => r,
        r = renew => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed: Timestamp, secs: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(secs),
                renew_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::from_second(1_000_000).expect("ts");
        let ago = |s: i64| now.checked_sub(SignedDuration::from_secs(s)).expect("ts");
        assert_eq!(decide(None, "me", now), Decision::Create);
        assert_eq!(
            decide(Some(&lease("me", ago(100), 15)), "me", now),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&lease("other", ago(5), 15)), "me", now),
            Decision::Follow {
                holder: "other".into()
            }
        );
        assert_eq!(
            decide(Some(&lease("other", ago(16), 15)), "me", now),
            Decision::TakeOver
        );
        assert_eq!(
            decide(Some(&lease("", ago(1), 15)), "me", now),
            Decision::TakeOver
        );
        let no_spec = Lease::default();
        assert_eq!(decide(Some(&no_spec), "me", now), Decision::TakeOver);
    }
}
