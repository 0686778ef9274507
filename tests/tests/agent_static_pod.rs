//! A static pod displaced by a managed pod (docs/kubelet-behaviour.md
//! "Static pods"): its cgroup is `pod<config hash>`, its mirror pod in the
//! apiserver has another `metadata.uid`. The agent must match the two —
//! read the static pod's request for its cgroup, owe it CPU, lower the
//! managed pod for it and say so naming it, audit it without drift — and
//! never patch it (the apiserver refuses a mirror pod's resize).

use std::time::Duration;

use serde_json::json;
use testkit::agent::{fast_args_with, metric};
use testkit::kubelet_sim::StaticPod;
use testkit::scenario::pod::{burstable, cpu_limit_m, generation, touched_by_agent};
use testkit::scenario::{Scenario, quick_kubelet, wait_until};

/// The static pod's request, and what it wants: within the request.
const STATIC_REQUEST: &str = "500m";
const STATIC_DEMAND_M: u64 = 400;
/// Share of its fluid grant the static pod cedes to the burster while the
/// node has no idle CPU (`SimKubelet::set_cede`): 160m of its 400m.
const CEDE: f64 = 0.4;

/// The value of `key=` in a log line (quotes stripped).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(|v| v.trim_matches('"'))
}

fn field_m(line: &str, key: &str) -> Option<i64> {
    field(line, key)?.trim_end_matches('m').parse().ok()
}

/// The agent's `pod displaced` lines about the static pod: naming its
/// cgroup (config hash) or the pod.
fn displaced_lines(log: &str, hash: &str, pod: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("pod displaced"))
        .filter(|l| l.contains(hash) || l.contains(pod))
        .map(str::to_string)
        .collect()
}

/// The agent's `resized` lines, for a failure message.
fn resized_lines(log: &str) -> String {
    log.lines()
        .filter(|l| l.contains(" resized "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The timestamp a log line starts with (RFC 3339, so it sorts as text).
fn at(line: &str) -> &str {
    line.split_whitespace().next().unwrap_or_default()
}

/// A one-CPU node; a static pod within its request (500m, wants 400m) and
/// a managed pod (request 250m) raised to its ceiling (1000m) that then
/// wants a whole CPU: on the full node the static pod waits 160m
/// (`full`) for CPU the managed pod runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pod_displaced_within_its_request_is_owed_by_its_config_hash() {
    let started = std::time::Instant::now();
    let manifest = json!({
        "metadata": {"name": "static"},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": STATIC_REQUEST, "memory": "64Mi"}}}]}
    });
    let c = Scenario::builder("static-owed")
        .sim(quick_kubelet)
        .sim(|cfg| {
            cfg.allocatable_cpu_m = 1000;
            // Counters 20 times per agent tick (see the agent's tick below).
            cfg.tick = Duration::from_millis(25);
            cfg.static_pods = vec![StaticPod::new(manifest)];
        })
        // Ticks of 500 ms: a tick's usage of kubepods and of a pod, read a
        // moment apart, differ by up to a simulator tick, and on a loaded
        // host a simulator tick stretches to hundreds of ms (its counters
        // then jump); over 200 ms that swung the slack of this one-CPU node
        // by 200–700m and sent the managed pod to its floor before anyone
        // waited.
        .agent(fast_args_with(&[("--tick", "500ms")]))
        .start()
        .await;
    let node = c.node().to_string();
    let sp = c.sim().static_pod_name("static");
    let sp_key = format!("{}/{sp}", c.ns);
    let hash = c.sim().config_hash(&c.ns, &sp).expect("static pod");
    c.wait_running(&sp).await;
    let mirror = c.get(&sp).await;
    let mirror_uid = mirror.metadata.uid.clone().unwrap_or_default();
    assert_ne!(mirror_uid, hash, "the mirror has a uid of its own");

    c.create(burstable("m", &node, "250m", Some("300m"))).await;
    c.wait_pod("m", "raised to its 1000m ceiling", |p| {
        cpu_limit_m(p, "app") == Some(1000)
    })
    .await;
    // The managed pod busy first and alone (2 s, 4 agent ticks): the static pod
    // starts waiting against a steady burst, not in the agent's first noisy
    // interval of both loads changing at once (where a slack lowering to
    // the floor, made before anyone is owed, opens no claim).
    c.sim().set_demand(&c.ns, "m", 1000);
    tokio::time::sleep(secs(2)).await;
    c.wait_pod("m", "busy alone at 900m or more", |p| {
        cpu_limit_m(p, "app").is_some_and(|m| m >= 900)
    })
    .await;
    c.sim().set_demand(&c.ns, &sp, STATIC_DEMAND_M);
    c.sim().set_cede(&c.ns, &sp, CEDE);
    let load_at = std::time::Instant::now();

    // 1. The agent sees the static pod wait, by its cgroup.
    let agent = c.agent();
    let seen = wait_until(
        "a `pod displaced` line for the static pod",
        secs(15),
        || {
            let lines = displaced_lines(&agent.log(), &hash, &sp_key);
            async move { lines.last().cloned() }
        },
    )
    .await;
    let first = match seen {
        Ok((l, _)) => l,
        Err(e) => c.fail(format!(
            "{e}: the static pod {sp_key} (cgroup pod{hash}) never showed as displaced"
        )),
    };
    eprintln!(
        "measured: first displaced line {:?} after load: {first}",
        load_at.elapsed()
    );

    // 2. It is owed: its request was found for its cgroup.
    let owed = wait_until("the static pod owed CPU", secs(15), || {
        let lines = displaced_lines(&agent.log(), &hash, &sp_key);
        let owed = lines
            .iter()
            .find(|l| field_m(l, "owed_m").is_some_and(|m| m > 0))
            .cloned();
        async move { owed }
    })
    .await;
    let owed_line = match owed {
        Ok((l, took)) => {
            eprintln!("measured: static pod owed {took:?} after its first wait: {l}");
            l
        }
        Err(e) => {
            let lines = displaced_lines(&agent.log(), &hash, &sp_key);
            let last = lines.last().cloned().unwrap_or_default();
            c.fail(format!(
                "{e}: static pod {sp_key} (cgroup pod{hash}, mirror uid {mirror_uid}) waited \
                 {}m within its {STATIC_REQUEST} request on a full node ({} `pod displaced` lines) \
                 but was owed nothing; the agent read request_m={} for it (the static pod's \
                 request must be keyed by its cgroup's config hash, not the mirror's uid). \
                 Last line: {last}",
                field_m(&last, "displaced_m").unwrap_or(-1),
                lines.len(),
                field(&last, "request_m").unwrap_or("?"),
            ))
        }
    };
    assert_eq!(
        field_m(&owed_line, "request_m"),
        Some(500),
        "request read for the static pod: {owed_line}"
    );

    // 3. The managed pod is lowered while the static pod is owed (a
    //    pressure lowering, or the slack path's, whichever targets lower).
    let m_key = format!("{}/m", c.ns);
    let lowered = wait_until("m lowered after the static pod was owed", secs(15), || {
        let l = agent
            .log()
            .lines()
            .filter(|l| l.contains(" resized ") && field(l, "pod") == Some(m_key.as_str()))
            .filter(|l| at(l) >= at(&owed_line))
            .find(|l| l.contains("why=lower"))
            .map(str::to_string);
        async move { l }
    })
    .await;
    match lowered {
        Ok((l, took)) => eprintln!("measured: m lowered {took:?} after owed: {l}"),
        Err(e) => c.fail(format!(
            "{e}: the static pod was owed but m was never lowered for it"
        )),
    }

    // 4. The lowering is checked against the static pod, named as such.
    let checked = wait_until("lowering checked for the static pod", secs(30), || {
        let l = agent
            .log()
            .lines()
            .find(|l| l.contains("lowering checked"))
            .map(str::to_string);
        async move { l }
    })
    .await;
    let checked = match checked {
        Ok((l, took)) => {
            eprintln!("measured: lowering checked {took:?} after the lowering: {l}");
            l
        }
        Err(e) => c.fail(format!(
            "{e}: the lowering made for {sp_key} was never checked (no lowering made on \
             a tick it was owed, or its claim dropped: the owed pod looked gone?); \
             resizes:\n{}",
            resized_lines(&agent.log())
        )),
    };
    assert_eq!(
        field(&checked, "owed"),
        Some(sp_key.as_str()),
        "the owed pod is named, not its hash: {checked}"
    );
    assert_eq!(
        field(&checked, "effect"),
        Some("helped"),
        "the lowering gave the static pod its CPU: {checked}"
    );
    for l in displaced_lines(&agent.log(), &hash, &sp_key)
        .iter()
        .filter(|l| at(l) <= at(&checked))
        .rev()
        .take(4)
    {
        eprintln!("measured: before the check: {l}");
    }
    let helped = c.wait_events("m", "HeadroomLoweringHelped").await;
    let note = helped[0].note.clone().unwrap_or_default();
    assert!(note.contains(&sp_key), "Event names the static pod: {note}");
    let s = c.scrape().await;
    let helped_n = metric(&s, "headroom_lowerings_total", &[("effect", "helped")]);
    assert!(
        helped_n.is_some_and(|n| n >= 1.0),
        "a checked lowering that helped: {helped_n:?}"
    );

    // 5. Audited without drift (matched to pod<hash>), never patched.
    let log = agent.log();
    let about_static = |l: &&str| field(l, "pod") == Some(sp_key.as_str());
    let drift: Vec<&str> = log
        .lines()
        .filter(about_static)
        .filter(|l| l.contains("cgroup drift") || l.contains("resize") || l.contains("resized"))
        .collect();
    assert!(
        drift.is_empty(),
        "drift or a resize for the static pod: {drift:#?}"
    );
    for (name, v) in [
        (
            "headroom_cgroup_drift",
            metric(&s, "headroom_cgroup_drift", &[("pod", &sp)]),
        ),
        (
            "headroom_pod_cpu_target_millicores",
            metric(&s, "headroom_pod_cpu_target_millicores", &[("pod", &sp)]),
        ),
    ] {
        assert!(
            v.is_none_or(|v| v == 0.0),
            "{name} for the static pod: {v:?}"
        );
    }
    let unmanaged = [("state", "unmanaged"), ("reason", "static_pod")];
    assert_eq!(
        metric(&s, "headroom_pods", &unmanaged),
        Some(1.0),
        "the agent counts the mirror as a static pod it leaves alone"
    );
    let mirror = c.get(&sp).await;
    assert_eq!(generation(&mirror), 1, "the mirror pod's spec changed");
    assert!(!touched_by_agent(&mirror), "the agent wrote the mirror pod");
    assert_eq!(mirror.metadata.uid.as_deref(), Some(mirror_uid.as_str()));
    eprintln!("resizes:\n{}", resized_lines(&agent.log()));
    eprintln!("measured: test took {:?}", started.elapsed());
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
