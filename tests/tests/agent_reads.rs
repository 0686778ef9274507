//! The running agent against a cgroup tree that turns hostile: a FIFO in
//! place of kubepods `cpu.max` once blocked the runtime thread (no
//! `/healthz`), and failed ticks left `/readyz` at 200 with frozen gauges.

use std::time::{Duration, Instant};

use testkit::agent::{AgentProcess, fast_args, metric, parse_metrics};
use testkit::kubelet_sim::WriteMode;
use testkit::scenario::Scenario;

const WAIT: Duration = Duration::from_secs(60);

async fn wait_status(agent: &AgentProcess, path: &str, want: u16) -> Duration {
    let t0 = Instant::now();
    loop {
        let got = tokio::time::timeout(Duration::from_secs(2), agent.get(path)).await;
        match got {
            Ok(Ok((code, _))) if code == want => return t0.elapsed(),
            Ok(_) => {}
            Err(_) => panic!("{path} did not answer within 2 s\n{}", agent.log_tail(30)),
        }
        if t0.elapsed() > WAIT {
            panic!("{path} never answered {want}\n{}", agent.log_tail(30));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_kubepods_cpu_max_fails_ticks_but_http_answers() {
    let s = Scenario::builder("reads")
        .not_opted_in()
        .sim(|cfg| cfg.write_mode = WriteMode::InPlace)
        .agent(fast_args())
        .start()
        .await;
    let (sim, agent) = (s.sim(), s.agent());
    wait_status(agent, "/readyz", 200).await;

    let cpu_max = sim.kubepods_path().join("cpu.max");
    let saved = std::fs::read(&cpu_max).unwrap();
    std::fs::remove_file(&cpu_max).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&cpu_max)
        .status()
        .unwrap();
    assert!(made.success());

    // 3 failed 200 ms ticks: /readyz turns 503; /healthz answers throughout.
    let took = wait_status(agent, "/readyz", 503).await;
    eprintln!("/readyz 503 after {took:?}");
    for _ in 0..5 {
        wait_status(agent, "/healthz", 200).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let scrape = parse_metrics(&agent.scrape().await.unwrap()).unwrap();
    let failed = metric(
        &scrape,
        "headroom_scan_errors_total",
        &[("kind", "kubepods")],
    );
    assert!(failed.is_some_and(|v| v >= 3.0), "{failed:?}");
    assert!(agent.log().contains("a FIFO"), "{}", agent.log_tail(30));

    std::fs::remove_file(&cpu_max).unwrap();
    std::fs::write(&cpu_max, saved).unwrap();
    wait_status(agent, "/readyz", 200).await;
    s.stop().await;
}
