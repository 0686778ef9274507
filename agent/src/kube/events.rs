//! Kubernetes Events on pods (`HeadroomResized`, `HeadroomResizeRefused`,
//! `CgroupDrift`, `CgroupDriftCleared`, `HeadroomYielded`), rate-limited per pod and reason so a
//! flapping pod cannot flood the apiserver.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
pub use kube::runtime::events::EventType;
use kube::runtime::events::{Event, Recorder, Reporter};

use crate::model::{PodView, Uid};

pub const REASON_RESIZED: &str = "HeadroomResized";
pub const REASON_REFUSED: &str = "HeadroomResizeRefused";
pub const REASON_DRIFT: &str = "CgroupDrift";
/// A lowering made for a pod short of CPU was checked: it helped.
pub const REASON_LOWERING_HELPED: &str = "HeadroomLoweringHelped";
/// A lowering made for a pod short of CPU bought nothing and is undone.
pub const REASON_LOWERING_UNDONE: &str = "HeadroomLoweringUndone";
pub const REASON_DRIFT_CLEARED: &str = "CgroupDriftCleared";
/// Headroom leaves the pod's limits to another writer (`policy::writers`).
pub const REASON_YIELDED: &str = "HeadroomYielded";

/// Pure limiter: at most one event per (pod, reason) per `interval`, and at
/// most `burst` events per `interval` node-wide.
#[derive(Debug)]
pub struct EventLimiter {
    interval: Duration,
    burst: usize,
    last: HashMap<(Uid, &'static str), Duration>,
    window_start: Duration,
    in_window: usize,
}

impl EventLimiter {
    pub fn new(interval: Duration, burst: usize) -> Self {
        Self {
            interval,
            burst,
            last: HashMap::new(),
            window_start: Duration::ZERO,
            in_window: 0,
        }
    }

    /// Whether an event may be sent now; records it if so.
    pub fn allow(&mut self, pod_uid: &Uid, reason: &'static str, now: Duration) -> bool {
        if now.saturating_sub(self.window_start) >= self.interval {
            self.window_start = now;
            self.in_window = 0;
        }
        if self.in_window >= self.burst {
            return false;
        }
        let key = (pod_uid.clone(), reason);
        if let Some(t) = self.last.get(&key)
            && now.saturating_sub(*t) < self.interval
        {
            return false;
        }
        self.last.insert(key, now);
        self.in_window += 1;
        true
    }

    /// Drops the memory of a pod that is gone.
    pub fn forget(&mut self, pod_uid: &Uid) {
        self.last.retain(|(uid, _), _| uid != pod_uid);
    }

    /// Pods (uids) with an event remembered (once per reason).
    pub fn uids(&self) -> impl Iterator<Item = &Uid> {
        self.last.keys().map(|(uid, _)| uid)
    }
}

pub fn pod_reference(pod: &PodView) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.namespace.clone()),
        name: Some(pod.name.clone()),
        uid: Some(pod.uid.to_string()),
        resource_version: pod.resource_version.clone(),
        field_path: None,
    }
}

/// Where Events go: kube-runtime's [`Recorder`] (events.k8s.io/v1) in the
/// agent, a list in tests.
pub trait EventApi {
    fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> impl Future<Output = Result<(), kube::Error>>;
}

impl EventApi for Recorder {
    async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        Recorder::publish(self, event, regarding).await
    }
}

/// Rate-limits Events per pod and reason, then hands them to an [`EventApi`].
pub struct EventSink<R = Recorder> {
    recorder: R,
    limiter: EventLimiter,
}

/// Who the agent's Events say they come from.
pub fn reporter(node_name: &str) -> Reporter {
    Reporter {
        controller: "headroom-agent".into(),
        instance: Some(node_name.to_string()),
    }
}

impl<R: EventApi> EventSink<R> {
    pub fn with_recorder(recorder: R, interval: Duration) -> Self {
        Self {
            recorder,
            limiter: EventLimiter::new(interval, 20),
        }
    }

    /// Publishes unless rate-limited. Failures are logged, never fatal:
    /// an event is a courtesy, the metric is the record.
    pub async fn publish(
        &mut self,
        pod: &PodView,
        type_: EventType,
        reason: &'static str,
        note: String,
        now: Duration,
    ) -> bool {
        if !self.limiter.allow(&pod.uid, reason, now) {
            tracing::debug!(pod = %pod.key(), reason, "event rate-limited");
            return false;
        }
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(note, 1000)),
            action: "Resize".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &pod_reference(pod)).await {
            tracing::warn!(pod = %pod.key(), reason, error = %e, "could not publish event");
            return false;
        }
        true
    }

    pub fn forget(&mut self, pod_uid: &Uid) {
        self.limiter.forget(pod_uid);
    }

    /// Pods (uids) the rate limiter remembers an event of.
    pub fn uids(&self) -> impl Iterator<Item = &Uid> {
        self.limiter.uids()
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn one_event_per_pod_and_reason_per_interval() {
        let mut l = EventLimiter::new(S(60), 100);
        assert!(l.allow(&Uid::from("a"), REASON_RESIZED, S(0)));
        assert!(!l.allow(&Uid::from("a"), REASON_RESIZED, S(30)));
        assert!(
            l.allow(&Uid::from("a"), REASON_REFUSED, S(30)),
            "other reason has its own budget"
        );
        assert!(
            l.allow(&Uid::from("b"), REASON_RESIZED, S(30)),
            "other pod has its own budget"
        );
        assert!(l.allow(&Uid::from("a"), REASON_RESIZED, S(60)));
    }

    #[test]
    fn node_wide_burst_caps_a_storm() {
        let mut l = EventLimiter::new(S(60), 3);
        let sent = (0..50)
            .filter(|i| l.allow(&Uid::from(format!("pod{i}")), REASON_DRIFT, S(1)))
            .count();
        assert_eq!(sent, 3);
        assert!(
            l.allow(&Uid::from("pod99"), REASON_DRIFT, S(62)),
            "window refills"
        );
    }

    #[test]
    fn forget_resets_a_pod() {
        let mut l = EventLimiter::new(S(60), 10);
        assert!(l.allow(&Uid::from("a"), REASON_DRIFT, S(0)));
        l.forget(&Uid::from("a"));
        assert!(l.allow(&Uid::from("a"), REASON_DRIFT, S(1)));
    }

    #[test]
    fn uids_lists_pods_with_a_remembered_event_until_forgotten() {
        let mut l = EventLimiter::new(S(60), 10);
        assert!(l.allow(&Uid::from("a"), REASON_DRIFT, S(0)));
        assert!(l.allow(&Uid::from("a"), REASON_DRIFT_CLEARED, S(0)));
        assert!(l.allow(&Uid::from("b"), REASON_RESIZED, S(0)));
        let mut uids: Vec<&str> = l.uids().map(Uid::as_str).collect();
        uids.sort_unstable();
        assert_eq!(uids, ["a", "a", "b"]);
        l.forget(&Uid::from("a"));
        assert_eq!(l.uids().map(Uid::as_str).collect::<Vec<_>>(), ["b"]);
    }

    /// Records what reaches the API.
    #[derive(Default)]
    struct Recorded(std::sync::Mutex<Vec<(EventType, String)>>);

    impl EventApi for Recorded {
        async fn publish(&self, ev: &Event, to: &ObjectReference) -> Result<(), kube::Error> {
            assert_eq!(to.kind.as_deref(), Some("Pod"));
            let mut seen = self.0.lock().unwrap();
            seen.push((ev.type_, ev.note.clone().unwrap_or_default()));
            Ok(())
        }
    }

    #[tokio::test]
    async fn sink_sends_the_type_and_a_truncated_note_unless_rate_limited() {
        let pod: PodView = serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                "spec": {"containers": [{"name": "c"}]}}),
        )
        .map(|p| PodView::try_from(&p).unwrap())
        .unwrap();
        let mut sink = EventSink::with_recorder(Recorded::default(), S(60));
        let long = "x".repeat(2000);
        assert!(
            sink.publish(&pod, EventType::Warning, REASON_DRIFT, long, S(0))
                .await
        );
        assert!(
            !sink
                .publish(&pod, EventType::Warning, REASON_DRIFT, "again".into(), S(1))
                .await,
            "same pod and reason within the interval"
        );
        assert!(
            sink.publish(&pod, EventType::Normal, REASON_RESIZED, "ok".into(), S(1))
                .await
        );
        let seen = sink.recorder.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        assert_eq!((seen[0].0, seen[0].1.len()), (EventType::Warning, 1000));
        assert_eq!(seen[1], (EventType::Normal, "ok".to_string()));
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        let s = "é".repeat(600);
        assert!(truncate(s, 1000).len() <= 1000);
    }
}
