//! The Helm chart (deploy/helm/headroom) with a real helm, built from the Go
//! module proxy by tests/tools/helm/build.sh (pinned in its go.mod/go.sum):
//! `helm lint`, `helm template` with default and non-default values, the values
//! schema refusing bad values, parity with deploy/ (RBAC rules, admission
//! policy, DaemonSet security context: read from the files on both sides, so
//! a change to one that is not made to the other fails here), and `helm
//! install` into the real kube-apiserver, then the created objects read back.

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use testkit::control_plane::ControlPlane;
use testkit::manifests::{apply_all, kind_name, load_kustomization, one, parse_docs, repo_dir};

fn chart() -> PathBuf {
    repo_dir().join("deploy/helm/headroom")
}

fn cache_dir() -> PathBuf {
    std::env::var_os("HEADROOM_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_dir().join(".cache"))
}

/// The helm binary tests/tools/helm/build.sh put in the cache.
fn helm_bin() -> PathBuf {
    let gomod = std::fs::read_to_string(repo_dir().join("tests/tools/helm/go.mod")).unwrap();
    let version = gomod
        .lines()
        .find_map(|l| l.strip_prefix("require helm.sh/helm/v3 "))
        .expect("require helm.sh/helm/v3 in tests/tools/helm/go.mod")
        .trim();
    let bin = cache_dir().join("bin").join(format!("helm-{version}"));
    assert!(
        bin.exists(),
        "{} missing: run tests/tools/helm/build.sh (scripts/test does)",
        bin.display()
    );
    bin
}

/// helm with its state kept out of $HOME.
fn helm(args: &[&str]) -> (bool, String, String) {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(helm_bin())
        .args(args)
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("run helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Values that change every knob the chart has (written to a temp file).
fn full_values() -> Value {
    json!({
        "image": {"registry": "registry.example.com/platform", "repository": "headroom-agent",
                  "tag": "0.1.0-test", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"kubernetes.io/os": "linux", "pool": "general"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}],
        "priorityClassName": "",
        "podAnnotations": {"example.com/team": "platform"},
        "podLabels": {"team": "platform"},
        "resources": {"requests": {"cpu": "20m", "memory": "40Mi"},
                      "limits": {"cpu": "200m", "memory": "96Mi"}},
        "metricsPort": 9500,
        "agent": {"logFormat": "human", "tick": "2s", "dryRun": true, "auditInterval": "1m",
                  "driftGrace": "45s", "eventInterval": "2m", "unreadyAfterFailedTicks": 7,
                  "extraArgs": ["--node-allocatable=4000"]},
        "policy": {"reserve_m": 200, "ceiling_factor": 3.5, "quantum_m": 20,
                   "raise_dead_band_pct": 5, "raise_dead_band_m": 25,
                   "lower_dead_band_pct": 15, "lower_dead_band_m": 75,
                   "raise_cooldown_s": 120, "pressure_start_pct": 15,
                   "contention_window_s": 3, "patch_rate_per_s": 2.5, "patch_burst": 4,
                   "floor": "declared"},
        "networkPolicy": {"enabled": true,
                          "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
                          "podSelector": {"matchLabels": {"app": "prometheus"}}},
        "podMonitor": {"enabled": true, "interval": "15s", "labels": {"release": "kps"}},
        "prometheusRule": {"enabled": true, "labels": {"release": "kps"}},
        "dashboard": {"enabled": true, "labels": {"grafana_dashboard": "1"}},
    })
}

fn values_file(v: &Value) -> tempfile::NamedTempFile {
    let f = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    // JSON is YAML.
    std::fs::write(f.path(), v.to_string()).unwrap();
    f
}

/// `helm template` → objects. `extra` are more helm arguments.
fn template(release: &str, ns: &str, extra: &[&str]) -> Vec<Value> {
    let chart = chart();
    let mut args = vec![
        "template",
        release,
        chart.to_str().unwrap(),
        "--namespace",
        ns,
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm template {extra:?} failed:\n{err}");
    parse_docs(&out).expect("helm template output parses")
}

/// The chart with every opt-in deploy/monitoring has: namespace, network
/// policy, PodMonitor, PrometheusRule.
fn template_with_every_opt_in() -> Vec<Value> {
    template(
        "headroom",
        "headroom-system",
        &[
            "--set",
            "namespace.create=true",
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "podMonitor.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
        ],
    )
}

fn template_full(release: &str, ns: &str) -> Vec<Value> {
    let f = values_file(&full_values());
    template(release, ns, &["-f", f.path().to_str().unwrap()])
}

fn kinds(objs: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = objs.iter().map(kind_name).collect();
    v.sort();
    v
}

fn deploy(dir: &str) -> Vec<Value> {
    load_kustomization(&repo_dir().join(dir)).expect("deploy/ renders")
}

fn pod_spec(objs: &[Value]) -> &Value {
    &one(objs, "DaemonSet").unwrap()["spec"]["template"]["spec"]
}

// ---------------------------------------------------------------- lint and render

#[test]
fn helm_lint_passes_strict_with_default_and_full_values() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let (ok, out, err) = helm(&["lint", "--strict", chart]);
    assert!(ok, "helm lint (defaults):\n{out}{err}");
    let f = values_file(&full_values());
    let (ok, out, err) = helm(&["lint", "--strict", chart, "-f", f.path().to_str().unwrap()]);
    assert!(ok, "helm lint (full values):\n{out}{err}");
    assert!(
        out.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{out}"
    );
}

#[test]
fn default_render_is_deploy_base_without_namespace_and_network_policy() {
    let chart = template("headroom", "headroom-system", &[]);
    let base = deploy("deploy/base");
    let expected: Vec<String> = base
        .iter()
        .filter(|o| o["kind"] != "Namespace" && o["kind"] != "NetworkPolicy")
        .map(kind_name)
        .collect();
    let mut expected = expected;
    expected.sort();
    assert_eq!(kinds(&chart), expected);
    // The admission policy is on by default.
    assert!(
        chart
            .iter()
            .any(|o| o["kind"] == "ValidatingAdmissionPolicy")
    );
}

#[test]
fn opt_ins_render_the_same_objects_as_deploy_monitoring() {
    let chart = template_with_every_opt_in();
    assert_eq!(kinds(&chart), kinds(&deploy("deploy/monitoring")));
}

#[test]
fn admission_policy_can_be_switched_off() {
    let objs = template(
        "headroom",
        "headroom-system",
        &["--set", "admissionPolicy.enabled=false"],
    );
    assert!(
        !objs.iter().any(|o| o["kind"] == "ValidatingAdmissionPolicy"
            || o["kind"] == "ValidatingAdmissionPolicyBinding")
    );
    assert!(objs.iter().any(|o| o["kind"] == "DaemonSet"));
}

// ---------------------------------------------------------------- parity with deploy/

#[test]
fn chart_and_deploy_have_the_same_rbac_rules() {
    let chart = template("headroom", "headroom-system", &[]);
    let base = deploy("deploy/base");
    let c = one(&chart, "ClusterRole").unwrap();
    let d = one(&base, "ClusterRole").unwrap();
    assert_eq!(c["rules"], d["rules"], "ClusterRole rules differ");
    let c = one(&chart, "ClusterRoleBinding").unwrap();
    let d = one(&base, "ClusterRoleBinding").unwrap();
    assert_eq!(c["roleRef"], d["roleRef"]);
    assert_eq!(c["subjects"], d["subjects"]);
    // No other RBAC object on either side.
    for objs in [&chart, &base] {
        let rbac: Vec<String> = objs
            .iter()
            .filter(|o| o["apiVersion"].as_str().unwrap_or("").starts_with("rbac."))
            .map(kind_name)
            .collect();
        assert_eq!(rbac.len(), 2, "{rbac:?}");
    }
}

#[test]
fn chart_and_deploy_have_the_same_admission_policy() {
    let chart = template("headroom", "headroom-system", &[]);
    let base = deploy("deploy/base");
    for kind in [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        let c = one(&chart, kind).unwrap();
        let d = one(&base, kind).unwrap();
        assert_eq!(c["metadata"]["name"], d["metadata"]["name"], "{kind} name");
        assert_eq!(c["spec"], d["spec"], "{kind} spec differs");
    }
}

#[test]
fn other_release_names_its_serviceaccount_in_the_policy() {
    let objs = template("edge", "kube-tools", &[]);
    let vap = one(&objs, "ValidatingAdmissionPolicy").unwrap();
    assert_eq!(
        vap["spec"]["matchConditions"][0]["expression"],
        "request.userInfo.username == 'system:serviceaccount:kube-tools:edge-headroom-agent'"
    );
    let sa = one(&objs, "ServiceAccount").unwrap();
    assert_eq!(sa["metadata"]["name"], "edge-headroom-agent");
    assert_eq!(sa["metadata"]["namespace"], "kube-tools");
    assert_eq!(pod_spec(&objs)["serviceAccountName"], "edge-headroom-agent");
    let binding = one(&objs, "ValidatingAdmissionPolicyBinding").unwrap();
    assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
}

#[test]
fn chart_and_deploy_have_the_same_daemonset_pod() {
    let chart = template("headroom", "headroom-system", &[]);
    let base = deploy("deploy/base");
    let (c, d) = (pod_spec(&chart), pod_spec(&base));
    for key in [
        "securityContext",
        "serviceAccountName",
        "automountServiceAccountToken",
        "priorityClassName",
        "tolerations",
        "volumes",
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "nodeSelector",
    ] {
        assert_eq!(c[key], d[key], "pod spec {key} differs");
    }
    let (cc, dc) = (&c["containers"][0], &d["containers"][0]);
    for key in [
        "securityContext",
        "args",
        "env",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "resources",
        "volumeMounts",
        "imagePullPolicy",
        "image",
    ] {
        assert_eq!(cc[key], dc[key], "container {key} differs");
    }
    assert_eq!(c["containers"].as_array().unwrap().len(), 1);
    let (cds, dds) = (
        one(&chart, "DaemonSet").unwrap(),
        one(&base, "DaemonSet").unwrap(),
    );
    assert_eq!(cds["spec"]["updateStrategy"], dds["spec"]["updateStrategy"]);
    assert_eq!(
        cds["spec"]["template"]["metadata"]["annotations"],
        dds["spec"]["template"]["metadata"]["annotations"]
    );
}

#[test]
fn chart_and_deploy_have_the_same_namespace_network_policy_and_monitoring() {
    let chart = template_with_every_opt_in();
    let mon = deploy("deploy/monitoring");
    let (c, d) = (
        one(&chart, "Namespace").unwrap(),
        one(&mon, "Namespace").unwrap(),
    );
    assert_eq!(
        c["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        d["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    );
    let (c, d) = (
        one(&chart, "NetworkPolicy").unwrap(),
        one(&mon, "NetworkPolicy").unwrap(),
    );
    assert_eq!(c["spec"]["ingress"], d["spec"]["ingress"]);
    assert_eq!(c["spec"]["policyTypes"], d["spec"]["policyTypes"]);
    let (c, d) = (
        one(&chart, "PrometheusRule").unwrap(),
        one(&mon, "PrometheusRule").unwrap(),
    );
    assert_eq!(
        c["spec"], d["spec"],
        "PrometheusRule spec differs from deploy/monitoring"
    );
    let (c, d) = (
        one(&chart, "PodMonitor").unwrap(),
        one(&mon, "PodMonitor").unwrap(),
    );
    assert_eq!(
        c["spec"]["podMetricsEndpoints"],
        d["spec"]["podMetricsEndpoints"]
    );
    // Selectors: the chart adds the release label; deploy's labels are a subset.
    for o in [
        &c["spec"]["selector"]["matchLabels"],
        &one(&chart, "NetworkPolicy").unwrap()["spec"]["podSelector"]["matchLabels"],
    ] {
        for (k, v) in d["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(&o[k], v, "selector {k}");
        }
    }
}

// ---------------------------------------------------------------- non-default values

#[test]
fn full_values_reach_the_daemonset() {
    let objs = template_full("headroom", "headroom-system");
    let pod = pod_spec(&objs);
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"],
        "registry.example.com/platform/headroom-agent:0.1.0-test"
    );
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(
        pod["nodeSelector"],
        json!({"kubernetes.io/os": "linux", "pool": "general"})
    );
    assert_eq!(pod["tolerations"], full_values()["tolerations"]);
    assert!(pod["priorityClassName"].is_null());
    assert_eq!(c["resources"], full_values()["resources"]);
    assert_eq!(c["ports"][0]["containerPort"], 9500);
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "run",
            "--cgroup-root=/host/sys/fs/cgroup",
            "--metrics-addr=0.0.0.0:9500",
            "--log-format=human",
            "--tick=2s",
            "--dry-run",
            "--audit-interval=1m",
            "--drift-grace=45s",
            "--event-interval=2m",
            "--unready-after-failed-ticks=7",
            "--config=/etc/headroom/policy.json",
            "--node-allocatable=4000",
        ]
    );
    let meta = &one(&objs, "DaemonSet").unwrap()["spec"]["template"]["metadata"];
    assert_eq!(meta["labels"]["team"], "platform");
    assert_eq!(meta["annotations"]["example.com/team"], "platform");
    assert_eq!(meta["annotations"]["headroom.dev/managed"], "false");
    assert!(meta["annotations"]["checksum/policy"].is_string());
    // The policy mount is read-only like the cgroup one; the security context is unchanged.
    for m in c["volumeMounts"].as_array().unwrap() {
        assert_eq!(m["readOnly"], true, "{m}");
    }
    let base = deploy("deploy/base");
    assert_eq!(pod["securityContext"], pod_spec(&base)["securityContext"]);
    assert_eq!(
        c["securityContext"],
        pod_spec(&base)["containers"][0]["securityContext"]
    );
    // Digest wins over the tag.
    let digest = format!("sha256:{}", "a".repeat(64));
    let objs = template(
        "headroom",
        "headroom-system",
        &["--set", &format!("image.digest={digest}")],
    );
    assert_eq!(
        pod_spec(&objs)["containers"][0]["image"],
        format!("headroom-agent@{digest}")
    );
}

#[test]
fn policy_configmap_holds_every_setting_and_the_agent_accepts_it() {
    let objs = template_full("headroom", "headroom-system");
    let cm = objs
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "headroom-agent-policy")
        .expect("policy ConfigMap");
    let text = cm["data"]["policy.json"].as_str().unwrap();
    let policy: headroom::policy::PolicyConfig =
        serde_json::from_str(text).expect("policy.json is a PolicyConfig (no unknown keys)");
    policy.validate().expect("in range");
    // Every field was set from values (none left at its default).
    let defaults = serde_json::to_value(headroom::policy::PolicyConfig::default()).unwrap();
    let got = serde_json::to_value(&policy).unwrap();
    for (k, v) in defaults.as_object().unwrap() {
        assert_ne!(&got[k], v, "{k} kept its default: not set through values");
    }
    assert_eq!(
        defaults.as_object().unwrap().len(),
        full_values()["policy"].as_object().unwrap().len(),
        "values.yaml/full_values do not cover every policy field"
    );
    // The agent parses the rendered args and the policy file and gets as far as
    // cgroup discovery (the host root does not exist here).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.json");
    std::fs::write(&file, text).unwrap();
    let args: Vec<String> = pod_spec(&objs)["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            a.as_str()
                .unwrap()
                .replace("/etc/headroom/policy.json", file.to_str().unwrap())
        })
        .collect();
    testkit::agent::assert_stops_at_the_host_cgroup_root(&args, "arguments and policy");
}

#[test]
fn schema_refuses_bad_values() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    for (set, needle) in [
        ("policy.ceiling_factor=100", "ceiling_factor"),
        ("policy.reserve_mc=5", "reserve_mc"),
        ("policy.patch_burst=0", "patch_burst"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("agent.logFormat=xml", "logFormat"),
        ("agent.tick=soon", "tick"),
        ("metricsPort=70000", "metricsPort"),
        ("podMonitor.enabeld=true", "enabeld"),
    ] {
        let (ok, _, err) = helm(&["template", "headroom", chart, "--set", set]);
        assert!(!ok, "--set {set} accepted");
        assert!(
            err.contains("values don't meet the specifications of the schema"),
            "{set}: {err}"
        );
        assert!(
            err.contains(needle),
            "{set}: error does not name {needle}: {err}"
        );
    }
}

#[test]
fn dashboard_configmap_carries_the_generated_dashboard_for_the_grafana_sidecar() {
    let objs = template_full("headroom", "headroom-system");
    let cm = objs
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "headroom-dashboard")
        .expect("dashboard ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value = serde_json::from_str(cm["data"]["headroom.json"].as_str().unwrap()).unwrap();
    // The committed file, which tools/tests/dashboard.rs keeps equal to the
    // generated dashboard (headroom_tools::dashboard).
    let committed = std::fs::read_to_string(chart().join("dashboards/headroom.json")).unwrap();
    assert_eq!(json, serde_json::from_str::<Value>(&committed).unwrap());
}

// ---------------------------------------------------------------- real apiserver

/// The prometheus-operator CRDs tests/control-plane/build.sh caches.
fn prometheus_crds() -> Vec<Value> {
    let dir = cache_dir().join("crds/prometheus-operator-v0.94.0");
    [
        "monitoring.coreos.com_podmonitors.yaml",
        "monitoring.coreos.com_prometheusrules.yaml",
    ]
    .iter()
    .flat_map(|f| {
        let p = dir.join(f);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (tests/control-plane/build.sh fetches it)",
                p.display()
            )
        });
        parse_docs(&text).unwrap()
    })
    .collect()
}

fn kubeconfig_arg(cp: &ControlPlane) -> String {
    format!("--kubeconfig={}", cp.kubeconfig_path().display())
}

async fn wait_crds(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for _ in 0..300 {
        let mut ready = 0;
        for n in [
            "podmonitors.monitoring.coreos.com",
            "prometheusrules.monitoring.coreos.com",
        ] {
            if let Ok(c) = api.get(n).await
                && c.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            {
                ready += 1;
            }
        }
        if ready == 2 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("prometheus-operator CRDs not established");
}

/// What README's Helm install does: the namespace with its Pod Security label
/// first, then `helm install`. Every object is created for real; the
/// DaemonSet and RBAC are read back from the apiserver.
#[tokio::test]
async fn helm_install_creates_the_objects_in_the_real_apiserver() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let ns = "headroom-system";
    let nsobj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns,
        "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &nsobj)
        .await
        .unwrap();
    let chart = chart();
    let (ok, out, err) = helm(&[
        "install",
        "headroom",
        chart.to_str().unwrap(),
        "--namespace",
        ns,
        &kubeconfig_arg(cp),
        "--wait=false",
    ]);
    assert!(ok, "helm install failed:\n{out}{err}");

    let ds = Api::<DaemonSet>::namespaced(client.clone(), ns)
        .get("headroom-agent")
        .await
        .expect("DaemonSet created");
    let got = serde_json::to_value(&ds).unwrap()["spec"]["template"]["spec"].clone();
    let base = deploy("deploy/base");
    let want = pod_spec(&base);
    assert_eq!(got["securityContext"], want["securityContext"]);
    assert_eq!(
        got["containers"][0]["securityContext"],
        want["containers"][0]["securityContext"]
    );
    assert_eq!(got["containers"][0]["args"], want["containers"][0]["args"]);
    assert_eq!(got["serviceAccountName"], "headroom-agent");
    assert_eq!(got["volumes"][0]["hostPath"]["path"], "/sys/fs/cgroup");

    let role = Api::<ClusterRole>::all(client.clone())
        .get("headroom-agent")
        .await
        .expect("ClusterRole created");
    let rules = serde_json::to_value(role.rules.unwrap()).unwrap();
    assert_eq!(rules, one(&base, "ClusterRole").unwrap()["rules"]);

    // The policy is served, and it denies: a resize by the agent's
    // ServiceAccount without a node claim (deploy.rs tests every path of the
    // same policy; here its presence and binding).
    let vap: Value = client
        .request(
            http::Request::get(
                "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/headroom-agent-own-node-only",
            )
            .body(Vec::new())
            .unwrap(),
        )
        .await
        .expect("ValidatingAdmissionPolicy created");
    // The server adds defaults (matchPolicy, selectors, scope); the rest is deploy/'s.
    let want = &one(&base, "ValidatingAdmissionPolicy").unwrap()["spec"];
    for key in [
        "failurePolicy",
        "matchConditions",
        "variables",
        "validations",
    ] {
        assert_eq!(vap["spec"][key], want[key], "policy {key}");
    }
    let rule = &vap["spec"]["matchConstraints"]["resourceRules"][0];
    let want_rule = &want["matchConstraints"]["resourceRules"][0];
    for key in ["apiGroups", "apiVersions", "operations", "resources"] {
        assert_eq!(rule[key], want_rule[key], "policy rule {key}");
    }

    let (ok, out, err) = helm(&["status", "headroom", "--namespace", ns, &kubeconfig_arg(cp)]);
    assert!(ok && out.contains("STATUS: deployed"), "{out}{err}");
    assert!(
        out.contains("label their namespace headroom.dev/managed=true"),
        "NOTES: {out}"
    );
    assert!(!out.contains("WARNING"), "{out}");

    // Without the admission policy, the install notes say what that costs
    // (a client-side dry run against this apiserver: nothing is created).
    let (ok, out, err) = helm(&[
        "install",
        "nopolicy",
        chart.to_str().unwrap(),
        "--namespace",
        ns,
        &kubeconfig_arg(cp),
        "--dry-run=client",
        "--set",
        "admissionPolicy.enabled=false",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("WARNING: admissionPolicy.enabled=false"),
        "{out}"
    );
}

/// Every opt-in object, with non-default values, created for real (the
/// Prometheus Operator CRDs installed first), in another namespace and release.
#[tokio::test]
async fn full_values_render_applies_to_the_real_apiserver() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    apply_all(&client, &prometheus_crds(), "headroom-helm-test")
        .await
        .unwrap();
    wait_crds(&client).await;
    let ns = "headroom-full";
    let mut objs = template_full("full", ns);
    let nsobj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    objs.insert(0, nsobj);
    // A priority class is a cluster object the user brings; none is set in full values.
    apply_all(&client, &objs, "headroom-helm-test")
        .await
        .unwrap();

    let ds = Api::<DaemonSet>::namespaced(client.clone(), ns)
        .get("full-headroom-agent")
        .await
        .unwrap();
    let pod = serde_json::to_value(&ds).unwrap()["spec"]["template"]["spec"].clone();
    assert_eq!(pod["nodeSelector"]["pool"], "general");
    assert_eq!(
        pod["containers"][0]["image"],
        "registry.example.com/platform/headroom-agent:0.1.0-test"
    );
    assert_eq!(
        pod["volumes"][1]["configMap"]["name"],
        "full-headroom-agent-policy"
    );
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get("full-headroom-dashboard")
        .await
        .unwrap();
    assert!(cm.data.unwrap().contains_key("headroom.json"));
    let role = Api::<ClusterRole>::all(client.clone())
        .get("full-headroom-agent")
        .await
        .unwrap();
    let base = deploy("deploy/base");
    assert_eq!(
        serde_json::to_value(role.rules.unwrap()).unwrap(),
        one(&base, "ClusterRole").unwrap()["rules"]
    );
    // The PodMonitor and PrometheusRule were accepted by the real CRD schemas.
    for path in [
        format!("/apis/monitoring.coreos.com/v1/namespaces/{ns}/podmonitors/full-headroom-agent"),
        format!("/apis/monitoring.coreos.com/v1/namespaces/{ns}/prometheusrules/full-headroom"),
    ] {
        let v: Value = client
            .request(http::Request::get(&path).body(Vec::new()).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(v["spec"].is_object(), "{path}");
    }
}
