//! Kubernetes Events on pods (`HeadroomResized`, `HeadroomResizeRefused`,
//! `CgroupDrift`, `CgroupDriftCleared`, `HeadroomYielded`,
//! `HeadroomLoweringHelped`, `HeadroomLoweringUndone`,
//! `HeadroomLoweringNeedChanged`), rate-limited per pod and reason so a
//! flapping pod cannot flood the apiserver.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
pub use kube::runtime::events::EventType;
use kube::runtime::events::{Event, Recorder, Reporter};

use crate::model::PodView;

pub const REASON_RESIZED: &str = "HeadroomResized";
pub const REASON_REFUSED: &str = "HeadroomResizeRefused";
pub const REASON_DRIFT: &str = "CgroupDrift";
/// A lowering made for a pod short of CPU was checked: it helped.
pub const REASON_LOWERING_HELPED: &str = "HeadroomLoweringHelped";
/// A lowering made for a pod short of CPU bought nothing and is undone.
pub const REASON_LOWERING_UNDONE: &str = "HeadroomLoweringUndone";
/// A lowering whose owed pod's own need changed before it could be judged.
pub const REASON_LOWERING_NEED_CHANGED: &str = "HeadroomLoweringNeedChanged";
pub const REASON_DRIFT_CLEARED: &str = "CgroupDriftCleared";
/// Headroom leaves the pod's limits to another writer (`policy::writers`).
pub const REASON_YIELDED: &str = "HeadroomYielded";

/// When each reason's Event was last sent for one pod. Kept in the pod's
/// record (`reconcile::records::PodRecord`), so it is forgotten with the pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SentEvents {
    /// (reason, when): a handful of reasons at most, so a list.
    last: Vec<(&'static str, Duration)>,
}

/// Pure limiter: at most one event per (pod, reason) per `interval` (the
/// pod's [`SentEvents`]), and at most `burst` events per `interval`
/// node-wide.
#[derive(Debug)]
pub struct EventLimiter {
    interval: Duration,
    burst: usize,
    window_start: Duration,
    in_window: usize,
}

impl EventLimiter {
    pub fn new(interval: Duration, burst: usize) -> Self {
        Self {
            interval,
            burst,
            window_start: Duration::ZERO,
            in_window: 0,
        }
    }

    /// Whether an event of `reason` may be sent now for the pod whose
    /// events so far are `sent`; records it there if so.
    pub fn allow(&mut self, sent: &mut SentEvents, reason: &'static str, now: Duration) -> bool {
        if now.saturating_sub(self.window_start) >= self.interval {
            self.window_start = now;
            self.in_window = 0;
        }
        if self.in_window >= self.burst {
            return false;
        }
        match sent.last.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, t)) if now.saturating_sub(*t) < self.interval => return false,
            Some((_, t)) => *t = now,
            None => sent.last.push((reason, now)),
        }
        self.in_window += 1;
        true
    }
}

pub fn pod_reference(pod: &PodView) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.namespace.to_string()),
        name: Some(pod.name.to_string()),
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
        sent: &mut SentEvents,
        type_: EventType,
        reason: &'static str,
        note: String,
        now: Duration,
    ) -> bool {
        if !self.limiter.allow(sent, reason, now) {
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
        let (mut a, mut b) = (SentEvents::default(), SentEvents::default());
        assert!(l.allow(&mut a, REASON_RESIZED, S(0)));
        assert!(!l.allow(&mut a, REASON_RESIZED, S(30)));
        assert!(
            l.allow(&mut a, REASON_REFUSED, S(30)),
            "other reason has its own budget"
        );
        assert!(
            l.allow(&mut b, REASON_RESIZED, S(30)),
            "other pod has its own budget"
        );
        assert!(l.allow(&mut a, REASON_RESIZED, S(60)));
    }

    #[test]
    fn node_wide_burst_caps_a_storm() {
        let mut l = EventLimiter::new(S(60), 3);
        let mut pods = vec![SentEvents::default(); 50];
        let sent = pods
            .iter_mut()
            .map(|p| l.allow(p, REASON_DRIFT, S(1)))
            .filter(|&allowed| allowed)
            .count();
        assert_eq!(sent, 3);
        assert!(
            l.allow(&mut SentEvents::default(), REASON_DRIFT, S(62)),
            "window refills"
        );
    }

    #[test]
    fn a_pods_memory_is_its_own_a_fresh_one_starts_over() {
        let mut l = EventLimiter::new(S(60), 10);
        let mut a = SentEvents::default();
        assert!(l.allow(&mut a, REASON_DRIFT, S(0)));
        assert!(!l.allow(&mut a, REASON_DRIFT, S(1)));
        // A pod forgotten and seen again (a new record) starts over.
        assert!(l.allow(&mut SentEvents::default(), REASON_DRIFT, S(1)));
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
        let mut sent = SentEvents::default();
        let long = "x".repeat(2000);
        assert!(
            sink.publish(
                &pod,
                &mut sent,
                EventType::Warning,
                REASON_DRIFT,
                long,
                S(0)
            )
            .await
        );
        assert!(
            !sink
                .publish(
                    &pod,
                    &mut sent,
                    EventType::Warning,
                    REASON_DRIFT,
                    "again".into(),
                    S(1)
                )
                .await,
            "same pod and reason within the interval"
        );
        assert!(
            sink.publish(
                &pod,
                &mut sent,
                EventType::Normal,
                REASON_RESIZED,
                "ok".into(),
                S(1)
            )
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
