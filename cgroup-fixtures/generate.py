#!/usr/bin/env python3
"""Writes the cgroup fixture trees under cgroup-fixtures/<name>/.

Each fixture: root/ (the cgroup v2 tree as the kubelet and the runtime leave
it), pods.json (a v1 PodList of the node's pods, uids and containerIDs
matching the tree) and node.json (the Node, with allocatable).

The cpu.max values follow docs/kubelet-behaviour.md §2 (see README.md here for the rules and
the few values that are measured rather than derived). Deterministic: ids and
counters come from hashes of names, so re-running gives the same bytes.

    python3 cgroup-fixtures/generate.py
"""

import hashlib
import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PERIOD = 100000  # kernel default, used wherever the kubelet sets no period
# Each fixture has two samples of its tree: root/ and later/, LATER_S apart.
# Between them every container used CPU at its `load` (millicores), so the
# usage `slack`/`plan` compute from the two is known and the same everywhere.
LATER_S = 10
ELAPSED_US = 0  # set per sample by Fixture.generate
CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc\n"


def h(*parts):
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def uid(*parts):
    x = h("uid", *parts)
    return f"{x[0:8]}-{x[8:12]}-4{x[13:16]}-8{x[17:20]}-{x[20:32]}"


def cid(*parts):
    return h("cid", *parts)


def num(*parts, lo=0, hi=10**6):
    return lo + int(h("num", *parts)[:12], 16) % (hi - lo)


# ---- kubelet arithmetic (pkg/kubelet/cm/helpers_linux.go) -------------------


def quota(milli, period):
    """MilliCPUToQuota: at least 1000 µs (a limit under 10m acts as 10m)."""
    return max(milli * period // 1000, 1000)


def shares(milli):
    return min(max(milli * 1024 // 1000, 2), 262144)


def weight(milli):
    # runc's shares→weight conversion (the linear one; versions differ, which
    # is why Headroom reads cpu.weight and never computes it).
    s = shares(milli)
    return 1 + ((s - 2) * 9999) // 262142


def systemd_round(q, period):
    """systemd stores CPUQuotaPerSecUSec in 10 ms steps per second: a pod slice
    quota comes out rounded up to period/100 (docs/kubelet-behaviour.md §2; measured: 101m → 11000)."""
    step = period // 100
    return -(-q // step) * step


# ---- pod model ---------------------------------------------------------------


def cpu(q):
    if q is None:
        return None
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


class C:
    def __init__(self, name, req=None, lim=None, mreq=None, mlim=None, sidecar=False, load=None):
        self.name, self.req, self.lim, self.mreq, self.mlim = name, req, lim, mreq, mlim
        self.sidecar = sidecar
        self.load = load  # millicores used between the samples; None: a small hashed value

    def requests(self):
        r = {}
        cr = self.req or self.lim
        mr = self.mreq or self.mlim
        if cr:
            r["cpu"] = cr
        if mr:
            r["memory"] = mr
        return r

    def limits(self):
        r = {}
        if self.lim:
            r["cpu"] = self.lim
        if self.mlim:
            r["memory"] = self.mlim
        return r

    def cpu_req(self):
        return cpu(self.req or self.lim) or 0

    def cpu_lim(self):
        return cpu(self.lim)


class Pod:
    def __init__(self, name, ns, containers, pod_res=None, overhead=None, runtime_class=None,
                 share_pid=False, static_hash=None, annotations=None, headroom_set=False):
        self.name, self.ns, self.containers = name, ns, containers
        self.pod_res = pod_res  # {"requests": {...}, "limits": {...}}
        self.overhead = overhead
        self.runtime_class = runtime_class
        self.share_pid = share_pid
        self.static_hash = static_hash
        self.annotations = annotations or {}
        # The limits are Headroom's: managedFields name the agent as their manager.
        self.headroom_set = headroom_set

    def qos(self):
        if self.pod_res:
            r, l = self.pod_res.get("requests", {}), self.pod_res.get("limits", {})
            g = all(k in l and r.get(k, l[k]) == l[k] for k in ("cpu", "memory"))
            return "Guaranteed" if g else "Burstable"
        if not any(c.requests() or c.limits() for c in self.containers):
            return "BestEffort"
        g = all(
            c.lim and c.mlim and (c.req or c.lim) == c.lim and (c.mreq or c.mlim) == c.mlim
            for c in self.containers
        )
        return "Guaranteed" if g else "Burstable"

    def pod_cpu_limit(self):
        if self.pod_res:
            return cpu(self.pod_res.get("limits", {}).get("cpu"))
        return None

    def pod_cpu_request(self):
        if self.pod_res and "cpu" in self.pod_res.get("requests", {}):
            return cpu(self.pod_res["requests"]["cpu"])
        if self.pod_res and "cpu" in self.pod_res.get("limits", {}):
            return cpu(self.pod_res["limits"]["cpu"])
        return sum(c.cpu_req() for c in self.containers)


# ---- writing -----------------------------------------------------------------


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def cgroup(dirpath, cpu_max, weight_v, usage, *, limited=False, pressure=(0.0, 0.0)):
    """Writes one cgroup's CPU files. Throttling counters only move when a
    quota is set; `usage` is µs."""
    os.makedirs(dirpath, exist_ok=True)
    write(os.path.join(dirpath, "cgroup.controllers"), CONTROLLERS)
    write(os.path.join(dirpath, "cpu.max"), cpu_max)
    user = usage * 7 // 10
    periods = num(dirpath, "p", lo=1000, hi=90000) if limited else 0
    throttled = periods * num(dirpath, "t", lo=0, hi=20) // 100 if limited else 0
    write(
        os.path.join(dirpath, "cpu.stat"),
        f"usage_usec {usage}\nuser_usec {user}\nsystem_usec {usage - user}\n"
        f"core_sched.force_idle_usec 0\nnr_periods {periods}\nnr_throttled {throttled}\n"
        f"throttled_usec {throttled * 1700}\nnr_bursts 0\nburst_usec 0\n",
    )
    some, full = pressure
    write(
        os.path.join(dirpath, "cpu.pressure"),
        f"some avg10={some:.2f} avg60={some / 2:.2f} avg300={some / 4:.2f} total={usage // 50}\n"
        f"full avg10={full:.2f} avg60={full / 2:.2f} avg300={full / 4:.2f} total={usage // 90}\n",
    )
    write(os.path.join(dirpath, "cpu.weight"), f"{weight_v}\n")
    return usage


def max_line(q, period):
    return f"max {DEFAULT_PERIOD}\n" if q is None else f"{q} {period}\n"


class Fixture:
    def __init__(self, name, driver, prefix, runtime, period, allocatable, pods,
                 kubepods_max=None, node_name=None, infra_always=True, cpus=4):
        self.name, self.driver, self.prefix, self.runtime = name, driver, prefix, runtime
        self.period, self.allocatable, self.pods = period, allocatable, pods
        self.kubepods_max = kubepods_max
        self.node_name = node_name or f"{name}-node"
        self.infra_always = infra_always  # CRI-O drops the infra container unless needed
        self.cpus = cpus

    # names -------------------------------------------------------------
    def kubepods_rel(self):
        if self.driver == "systemd":
            if self.prefix:
                return f"{self.prefix}.slice/{self.prefix}-kubepods.slice"
            return "kubepods.slice"
        return f"{self.prefix}/kubepods" if self.prefix else "kubepods"

    def sd_base(self):
        return f"{self.prefix}-kubepods" if self.prefix else "kubepods"

    def qos_rel(self, qos):
        kp = self.kubepods_rel()
        if qos == "Guaranteed":
            return kp
        q = qos.lower()
        if self.driver == "systemd":
            return f"{kp}/{self.sd_base()}-{q}.slice"
        return f"{kp}/{q}"

    def pod_rel(self, pod, cg_uid):
        parent = self.qos_rel(pod.qos())
        if self.driver == "systemd":
            base = self.sd_base() if pod.qos() == "Guaranteed" else f"{self.sd_base()}-{pod.qos().lower()}"
            return f"{parent}/{base}-pod{cg_uid.replace('-', '_')}.slice"
        return f"{parent}/pod{cg_uid}"

    def ctr_names(self, id_):
        """(cgroup name of the container, conmon cgroup name or None)."""
        sd = self.driver == "systemd"
        if self.runtime == "containerd":
            return (f"cri-containerd-{id_}.scope" if sd else id_), None
        if self.runtime == "cri-o":
            if sd:
                return f"crio-{id_}.scope", f"crio-conmon-{id_}.scope"
            return f"crio-{id_}", f"crio-conmon-{id_}"
        return (f"docker-{id_}.scope" if sd else id_), None

    # generation ----------------------------------------------------------
    def generate(self):
        global ELAPSED_US
        out = os.path.join(HERE, self.name)
        shutil.rmtree(out, ignore_errors=True)
        for sample, elapsed in (("root", 0), ("later", LATER_S * 10**6)):
            ELAPSED_US = elapsed
            self.generate_sample(out, os.path.join(out, sample))

    def generate_sample(self, out, root):
        write(os.path.join(root, "cgroup.controllers"), CONTROLLERS)
        write(os.path.join(root, "cgroup.subtree_control"), "cpuset cpu io memory pids\n")
        # The CPUs the node's pods may use: capacity must not depend on the host.
        write(os.path.join(root, "cpuset.cpus.effective"), f"0-{self.cpus - 1}\n")
        svc = {"containerd": "containerd", "cri-o": "crio", "docker": "cri-docker"}[self.runtime]
        for d in [f"system.slice/{svc}.service", "system.slice/kubelet.service", "init.scope"]:
            write(os.path.join(root, d, "cgroup.controllers"), CONTROLLERS)
        if self.prefix and self.driver == "systemd":
            write(os.path.join(root, f"{self.prefix}.slice", "cgroup.controllers"), CONTROLLERS)

        items = []
        qos_usage = {"Burstable": 0, "BestEffort": 0}
        qos_req = {"Burstable": 0}
        total = 0
        for pod in self.pods:
            item, usage = self.write_pod(root, pod)
            items.append(item)
            total += usage
            if pod.qos() in qos_usage:
                qos_usage[pod.qos()] += usage
            if pod.qos() == "Burstable":
                qos_req["Burstable"] += pod.pod_cpu_request() + (cpu((pod.overhead or {}).get("cpu")) or 0)
        for qos in ("Burstable", "BestEffort"):
            w = weight(qos_req["Burstable"]) if qos == "Burstable" else 1
            cgroup(os.path.join(root, self.qos_rel(qos)), f"max {DEFAULT_PERIOD}\n", w,
                   qos_usage[qos] + 1000)
        kp_max = max_line(self.kubepods_max and quota(self.kubepods_max, DEFAULT_PERIOD), DEFAULT_PERIOD)
        cgroup(os.path.join(root, self.kubepods_rel()), kp_max, weight(cpu(self.allocatable)),
               total + 5000, limited=self.kubepods_max is not None, pressure=(2.35, 0.41))

        podlist = {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1000"},
                   "items": items}
        write(os.path.join(out, "pods.json"), json.dumps(podlist, indent=2) + "\n")
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.node_name, "uid": uid(self.name, "node"),
                         "labels": {"kubernetes.io/hostname": self.node_name}},
            "status": {"capacity": {"cpu": str(self.cpus), "memory": "16Gi", "pods": "110"},
                       "allocatable": {"cpu": self.allocatable, "memory": "15Gi", "pods": "110"}},
        }
        write(os.path.join(out, "node.json"), json.dumps(node, indent=2) + "\n")

    def write_pod(self, root, pod):
        meta_uid = uid(self.name, pod.ns, pod.name)
        # A static pod's cgroup carries the kubelet's own uid (the config hash);
        # its mirror Pod in the apiserver has a different metadata.uid.
        cg_uid = pod.static_hash or meta_uid
        prel = self.pod_rel(pod, cg_uid)
        pdir = os.path.join(root, prel)
        qos = pod.qos()
        period = self.period
        sd = self.driver == "systemd"
        scheme = {"containerd": "containerd", "cri-o": "cri-o", "docker": "docker"}[self.runtime]

        usage = 0
        statuses, init_statuses = [], []
        pod_lim = pod.pod_cpu_limit()
        for c in pod.containers:
            id_ = cid(self.name, pod.ns, pod.name, c.name)
            name, conmon = self.ctr_names(id_)
            lim = c.cpu_lim()
            if lim is None and pod_lim is not None:
                lim = pod_lim  # a container without a limit follows the pod-level limit
            q = quota(lim, period) if lim is not None else None
            load = c.load if c.load is not None else num(self.name, pod.name, c.name, "load", lo=2, hi=40)
            if lim is not None:
                load = min(load, lim)  # a quota caps what a container can use
            u = num(self.name, pod.name, c.name, lo=10**6, hi=9 * 10**8) + load * ELAPSED_US // 1000
            usage += cgroup(os.path.join(pdir, name), max_line(q, period), weight(c.cpu_req()), u,
                            limited=q is not None)
            if conmon:
                usage += cgroup(os.path.join(pdir, conmon), f"max {DEFAULT_PERIOD}\n", 1, 20000)
            st = {
                "name": c.name, "containerID": f"{scheme}://{id_}",
                "image": f"registry.example/{c.name}:1.0",
                "imageID": f"registry.example/{c.name}@sha256:{h('img', c.name)}",
                "ready": True, "restartCount": 0, "started": True,
                "state": {"running": {"startedAt": "2026-11-08T10:00:00Z"}},
                "resources": {k: v for k, v in (("requests", c.requests()), ("limits", c.limits())) if v},
            }
            (init_statuses if c.sidecar else statuses).append(st)
        # The pause (sandbox) container: no limit from the kubelet. CRI-O only
        # runs it when the pod needs one (drop_infra_ctr), e.g. a shared PID ns.
        if self.runtime != "cri-o" or self.infra_always or pod.share_pid:
            sid = cid(self.name, pod.ns, pod.name, "sandbox")
            name, conmon = self.ctr_names(sid)
            usage += cgroup(os.path.join(pdir, name), f"max {DEFAULT_PERIOD}\n", 1, 15000)
            if conmon:
                usage += cgroup(os.path.join(pdir, conmon), f"max {DEFAULT_PERIOD}\n", 1, 9000)

        # Pod cgroup (docs/kubelet-behaviour.md §2): quota only if a pod-level CPU limit is set or
        # every container (sidecars included) has one; plus overhead.
        overhead = cpu((pod.overhead or {}).get("cpu")) or 0
        if qos == "BestEffort":
            pq = None
        elif pod_lim is not None:
            pq = quota(pod_lim + overhead, period)
        elif all(c.cpu_lim() is not None for c in pod.containers):
            pq = quota(sum(c.cpu_lim() for c in pod.containers) + overhead, period)
        else:
            pq = None
        if pq is not None and sd:
            pq = systemd_round(pq, period)
        pw = 1 if qos == "BestEffort" else weight(pod.pod_cpu_request() + overhead)
        usage += 3000
        cgroup(pdir, max_line(pq, period), pw, usage, limited=pq is not None)

        spec = {
            "nodeName": self.node_name,
            "containers": [self.cspec(c) for c in pod.containers if not c.sidecar],
            "restartPolicy": "Always",
        }
        sidecars = [self.cspec(c) | {"restartPolicy": "Always"} for c in pod.containers if c.sidecar]
        if sidecars:
            spec["initContainers"] = sidecars
        if pod.pod_res:
            spec["resources"] = pod.pod_res
        if pod.overhead:
            spec["overhead"] = pod.overhead
        if pod.runtime_class:
            spec["runtimeClassName"] = pod.runtime_class
        if pod.share_pid:
            spec["shareProcessNamespace"] = True
        meta = {"name": pod.name, "namespace": pod.ns, "uid": meta_uid, "generation": 1,
                "resourceVersion": str(num(pod.name, hi=900) + 100)}
        if pod.annotations:
            meta["annotations"] = dict(pod.annotations)
        if pod.headroom_set:
            paths = {f'k:{{"name":"{c.name}"}}': {"f:resources": {"f:limits": {"f:cpu": {}}}}
                     for c in pod.containers if not c.sidecar and c.lim}
            meta["managedFields"] = [{
                "manager": "headroom-agent", "operation": "Update", "apiVersion": "v1",
                "time": "2026-11-08T10:05:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:containers": paths}}, "subresource": "resize"}]
            meta["generation"] = 2
        if pod.static_hash:
            meta["annotations"] = {
                "kubernetes.io/config.hash": pod.static_hash,
                "kubernetes.io/config.mirror": pod.static_hash,
                "kubernetes.io/config.source": "file",
            }
        status = {"phase": "Running", "qosClass": qos, "containerStatuses": statuses,
                  "hostIP": "172.18.0.2", "podIP": f"10.244.0.{num(pod.name, hi=250) + 2}",
                  "observedGeneration": meta["generation"]}
        if init_statuses:
            status["initContainerStatuses"] = init_statuses
        item = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}
        return item, usage

    @staticmethod
    def cspec(c):
        res = {k: v for k, v in (("requests", c.requests()), ("limits", c.limits())) if v}
        d = {"name": c.name, "image": f"registry.example/{c.name}:1.0"}
        if res:
            d["resources"] = res
        return d


def common_pods(tag):
    """Guaranteed, Burstable with and without limits, BestEffort."""
    return [
        Pod(f"{tag}-guaranteed", "default",
            [C("app", "500m", "500m", "256Mi", "256Mi")]),
        Pod(f"{tag}-limited", "default",
            [C("api", "250m", "1", "128Mi", "512Mi"),
             C("proxy", "50m", "200m", "32Mi", "64Mi", sidecar=True)]),
        Pod(f"{tag}-unlimited", "batch",
            [C("worker", "100m", None, "64Mi"),
             C("logger", "10m", "100m")]),
        Pod(f"{tag}-besteffort", "dev", [C("debug")]),
    ]


FIXTURES = [
    Fixture(
        "kind", "systemd", "kubelet", "containerd", DEFAULT_PERIOD, "8", cpus=8,
        node_name="kind-worker",
        pods=common_pods("kind") + [
            Pod("kind-overhead", "default", [C("app", "200m", "400m", "64Mi", "128Mi")],
                overhead={"cpu": "100m", "memory": "32Mi"}, runtime_class="runc-overhead"),
            Pod("kube-scheduler-kind-worker", "kube-system", [C("kube-scheduler", "100m")],
                static_hash=h("static", "kube-scheduler")[:32]),
            # Opted in, busy near its limit: `plan` raises it.
            Pod("web", "shop", [C("app", "200m", "300m", "128Mi", "256Mi", load=290)],
                annotations={"headroom.dev/managed": "true"}),
            # Opted in, limit raised by Headroom earlier, now the node is busy:
            # `plan` lowers it to its share of the slack.
            Pod("report", "shop", [C("app", "200m", "800m", "128Mi", "256Mi", load=150)],
                annotations={"headroom.dev/managed": "true"}, headroom_set=True),
            # Not opted in, no limit, using most of the node.
            Pod("etl", "batch", [C("job", "1", None, "1Gi", load=6500)]),
        ],
    ),
    Fixture(
        # An operator capped kubepods by hand (the kubelet never writes it):
        # capacity is that cap when it is below allocatable.
        "systemd-containerd", "systemd", None, "containerd", DEFAULT_PERIOD, "3800m",
        kubepods_max=3500,
        pods=common_pods("sd") + [
            # 5m acts as 10m: quota 1000 µs, the kernel's floor.
            Pod("sd-tiny-limit", "default",
                [C("app", "100m", "495m", "64Mi", "128Mi"), C("metrics", "5m", "5m")]),
            Pod("sd-overhead", "default",
                [C("a", "300m", "300m", "64Mi", "64Mi"), C("b", "200m", "200m", "64Mi", "64Mi")],
                overhead={"cpu": "250m", "memory": "64Mi"}, runtime_class="kata"),
        ],
    ),
    Fixture(
        # kubelet cpuCFSQuotaPeriod: 50ms. Only cgroups with a quota get the
        # 50000 period; unlimited ones keep the kernel default 100000.
        "cgroupfs-containerd", "cgroupfs", None, "containerd", 50000, "4", cpus=4,
        pods=common_pods("cfs") + [
            Pod("cfs-big", "default", [C("app", "1500m", "2500m", "1Gi", "2Gi")]),
        ],
    ),
    Fixture(
        "crio", "systemd", None, "cri-o", DEFAULT_PERIOD, "3900m", infra_always=False,
        pods=common_pods("crio") + [
            Pod("crio-shared-pid", "default",
                [C("app", "200m", "600m", "64Mi", "128Mi"), C("shell", "10m", "100m")],
                share_pid=True),
        ],
    ),
    Fixture(
        "pod-level", "systemd", "kubelet", "containerd", DEFAULT_PERIOD, "4", cpus=4,
        node_name="kind-worker",
        pods=[
            # docs/kubelet-behaviour.md §4 pod a: container without own limit follows the pod.
            Pod("plr-a", "default", [C("c", "100m")],
                pod_res={"requests": {"cpu": "100m", "memory": "64Mi"},
                         "limits": {"cpu": "500m", "memory": "128Mi"}}),
            # pod b: the container keeps its own (lower) limit as a sub-cap.
            Pod("plr-b", "default", [C("c", "100m", "400m")],
                pod_res={"requests": {"cpu": "100m", "memory": "64Mi"},
                         "limits": {"cpu": "500m", "memory": "128Mi"}}),
            # Measured on 1.37.0: pod-level limit 101m → pod cpu.max 11000 100000.
            Pod("plr-101m", "default", [C("c", "100m")],
                pod_res={"requests": {"cpu": "100m", "memory": "128Mi"},
                         "limits": {"cpu": "101m", "memory": "128Mi"}}),
            # pod f: Guaranteed through pod-level resources.
            Pod("plr-pod-guaranteed", "default", [C("c", "100m")],
                pod_res={"requests": {"cpu": "500m", "memory": "128Mi"},
                         "limits": {"cpu": "500m", "memory": "128Mi"}}),
            # Pod-level limit plus RuntimeClass overhead.
            Pod("plr-overhead", "default", [C("c", "200m"), C("side", "50m", sidecar=True)],
                pod_res={"limits": {"cpu": "1", "memory": "256Mi"},
                         "requests": {"cpu": "250m", "memory": "128Mi"}},
                overhead={"cpu": "100m", "memory": "32Mi"}, runtime_class="runc-overhead"),
        ] + common_pods("plr"),
    ),
]


if __name__ == "__main__":
    for f in FIXTURES:
        f.generate()
        print(f"wrote {f.name}")
