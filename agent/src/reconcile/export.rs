//! The tick's gauges: node capacity, usage and slack (real and as the
//! scheduler books it), each managed pod's values, pods by state.

use foldhash::{HashMap, HashMapExt};

use super::Round;
use crate::metrics::{Metrics, NodeValues, PodValues};
use crate::model::{CgroupPodId, Millis, PodView};
use crate::policy::Verdict;
use crate::signal::usage::{NodeUsage, booked_request};

/// The node's gauges for this round; `allocatable` as the Node (or the
/// flag) says.
pub fn node_values(
    views: &[PodView],
    slack: &NodeUsage,
    round: &Round,
    allocatable: Option<Millis>,
) -> NodeValues {
    let booked: Millis = views
        .iter()
        .filter(|v| !v.terminating)
        .map(booked_request)
        .sum();
    NodeValues {
        capacity_millicores: slack.capacity_m as f64,
        usage_millicores: slack.usage_m as f64,
        real_slack_millicores: round.node.slack_m as f64,
        booked_slack_millicores: allocatable.map_or(0.0, |a| a as f64 - booked as f64),
        pressure_some_ratio: slack.pressure_some_avg10.unwrap_or(0.0) / 100.0,
        pressure_full_ratio: slack.pressure_full_avg10.map(|p| p / 100.0),
        throttling_stall_ratio: round.node.contention.throttling_pct / 100.0,
        contention_ratio: if slack.capacity_m > 0 {
            round.node.contention.demand_m as f64 / slack.capacity_m as f64
        } else {
            0.0
        },
    }
}

/// Sets the round's gauges; `unreadable`: pods of the node not readable as
/// a pod view.
pub(super) fn export(
    metrics: &Metrics,
    views: &[PodView],
    slack: &NodeUsage,
    round: &Round,
    allocatable: Option<Millis>,
    unreadable: usize,
) {
    metrics.set_node(&node_values(views, slack, round, allocatable));
    let by_id: HashMap<&CgroupPodId, Option<f64>> = slack
        .pods
        .iter()
        .map(|p| (&p.id, p.throttled_ratio))
        .collect();
    let mut unmanaged: HashMap<&'static str, usize> = HashMap::new();
    if unreadable > 0 {
        unmanaged.insert("unreadable", unreadable);
    }
    let mut managed = 0;
    // Decisions come in the order of the views they were made for
    // (`policy::decide_with`): the view gives the cgroup to read.
    for (d, v) in round.decisions.iter().zip(views) {
        debug_assert_eq!(d.uid, v.uid);
        match &d.verdict {
            Verdict::Managed(m) => {
                managed += 1;
                let throttled = by_id.get(&v.cgroup_id).copied().flatten().unwrap_or(0.0);
                metrics.set_pod(
                    &d.namespace,
                    &d.name,
                    &PodValues {
                        request_millicores: d.request_m as f64,
                        limit_millicores: m.current_limit_m.map(|m| m as f64),
                        target_millicores: Some(m.target_m as f64),
                        usage_millicores: d.usage_m as f64,
                        throttled_ratio: throttled,
                    },
                );
            }
            Verdict::Unmanaged { reason, .. } => {
                *unmanaged.entry(reason.reason()).or_default() += 1;
                metrics.remove_pod_values(&d.namespace, &d.name);
            }
        }
    }
    metrics.set_pod_states(managed, &unmanaged);
}
