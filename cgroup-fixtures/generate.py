#!/usr/bin/env python3
"""Writes the cgroup fixture trees under cgroup-fixtures/<name>/.

Each fixture: root/ (the cgroup v2 tree as the kubelet and the runtime leave
it), pods.json (a v1 PodList of the node's pods, uids and containerIDs
matching the tree) and node.json (the Node, with allocatable).

The cpu.max values follow docs/kubelet-behaviour.md §2 (see README.md here for the rules and
the few values that are measured rather than derived). Deterministic: ids and
the counters' history before root/ come from hashes of names, so re-running
gives the same bytes. Between root/ and later/ every cumulative counter grows
by what each cgroup did in the interval (see `Load`), never by a hash.

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
SAMPLE_ROOT = ""  # the sample being written (root/ or later/)
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
    def __init__(self, name, req=None, lim=None, mreq=None, mlim=None, sidecar=False, load=None,
                 threads=None, psi=None):
        self.name, self.req, self.lim, self.mreq, self.mlim = name, req, lim, mreq, mlim
        self.sidecar = sidecar
        # Between the samples: `load` millicores it would use under no quota
        # of its own (None: a small hashed value), i.e. what its threads want
        # as far as the node's CPUs and the other cgroups let them. It uses
        # that, or its quota if lower (then it is throttled). `threads`: its
        # busy threads (default: as many as `load` needs). `psi`: (some,
        # full) share of wall time it stalled behind other tasks (its own
        # threads queued behind each other: some only; displaced by other
        # cgroups: full and some); its own throttling is added from the quota.
        self.load = load
        self.threads = threads
        self.psi = psi or (0.0, 0.0)

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


class Load:
    """What one cgroup did between the two samples, as rates over the interval:
    `used_m` CPU used (millicores), `want_m` CPU its tasks would have used
    under no quota of their own (the node's CPUs and the other cgroups
    still bound it), `threads` its busy threads, `some`/`full` the share of
    wall time its tasks stalled (PSI, kernel >= 5.13), `busy` the share of
    wall time at least one of its tasks ran.

    The cumulative counters of `later/` are those of `root/` plus these rates
    times LATER_S, so they only grow and their deltas mean what they say."""

    def __init__(self, used_m=0, want_m=None, threads=None, some=0.0, full=0.0, busy=None):
        self.used_m = used_m
        self.want_m = used_m if want_m is None else want_m
        self.threads = threads or max(1, -(-self.want_m // 1000))
        self.some, self.full = some, full
        self.busy = min(1.0, used_m / 1000) if busy is None else busy

    def throttled_frac(self, limit_m):
        """Wall share throttled at a quota of `limit_m`: a task that wants W
        under a limit L < W runs L's worth of each period, then waits out the
        rest: (W - L) / W of the time."""
        if limit_m is None or self.want_m <= limit_m:
            return 0.0
        return (self.want_m - limit_m) / self.want_m

    @staticmethod
    def parent(children, limit_m=None):
        """A parent cgroup (pod, QoS class, kubepods): its tasks are its
        children's. It uses what they use; it stalls (`some`) whenever one of
        them does (stalls taken as independent); it is fully stalled
        (`full`) while a child is and no other child runs. Its own quota, if
        any, throttles the sum its children pass up."""
        used = sum(c.used_m for c in children)
        none_stalled, none_busy = 1.0, 1.0
        for c in children:
            none_stalled *= 1 - c.some
            none_busy *= 1 - c.busy
        full = 0.0
        for i, c in enumerate(children):
            others_idle = 1.0
            for j, o in enumerate(children):
                if j != i:
                    others_idle *= 1 - o.busy
            full = max(full, c.full * others_idle)
        # What the children pass up: each capped by its own quota, if any.
        want = sum(c.want_m if c.limit_m is None else min(c.want_m, c.limit_m) for c in children)
        p = Load(used, want_m=want,
                 threads=sum(c.threads for c in children if c.want_m) or 1,
                 some=1 - none_stalled, full=full, busy=1 - none_busy)
        thr = p.throttled_frac(limit_m)
        p.some, p.full = max(p.some, thr), max(p.full, thr)
        return p

    limit_m = None  # the quota (millicores) it ran under, set by cgroup()


def rel(dirpath):
    """A cgroup's path inside its sample: the same in root/ and later/, so
    the hashed history below is the same in both samples."""
    return os.path.relpath(dirpath, SAMPLE_ROOT)


def cgroup(dirpath, cpu_max, weight_v, usage, load, *, limit_m=None, period=DEFAULT_PERIOD):
    """Writes one cgroup's CPU files. `usage` is usage_usec in this sample;
    `load` (a Load) what the cgroup did between the samples; `limit_m` its
    quota in millicores, None for `max`.

    Every cumulative counter is a history hashed from the cgroup's path
    (the same in both samples) plus `load` times the time elapsed since
    root/: nr_periods counts the periods elapsed while it had a quota and
    runnable tasks, nr_throttled/throttled_usec the periods and time its
    quota ran out (only when it wanted more than the quota), cpu.pressure
    the time its tasks stalled. So later/ >= root/ everywhere."""
    os.makedirs(dirpath, exist_ok=True)
    load.limit_m = limit_m
    key = rel(dirpath)
    write(os.path.join(dirpath, "cgroup.controllers"), CONTROLLERS)
    write(os.path.join(dirpath, "cpu.max"), cpu_max)
    user = usage * 7 // 10  # monotonic in usage, and so is usage - user
    limited = limit_m is not None
    periods = num(key, "p", lo=1000, hi=90000) if limited else 0
    throttled = periods * num(key, "t", lo=0, hi=20) // 100 if limited else 0
    throttled_us = throttled * 1700
    thr = load.throttled_frac(limit_m)
    if limited and load.want_m > 0:
        periods += ELAPSED_US // period
    if thr > 0:
        throttled += ELAPSED_US // period
        # Summed over the runqueues throttled: one per busy thread.
        throttled_us += round(ELAPSED_US * thr * load.threads)
    load.some, load.full = max(load.some, thr), max(load.full, thr)
    write(
        os.path.join(dirpath, "cpu.stat"),
        f"usage_usec {usage}\nuser_usec {user}\nsystem_usec {usage - user}\n"
        f"core_sched.force_idle_usec 0\nnr_periods {periods}\nnr_throttled {throttled}\n"
        f"throttled_usec {throttled_us}\nnr_bursts 0\nburst_usec 0\n",
    )
    # History: stall before root/ as a share of the usage then (so parents,
    # which used more, stalled more), full no more than some; then the stall
    # of the interval.
    hist = usage - load.used_m * ELAPSED_US // 1000  # usage_usec in root/
    some_total = hist // 50 + round(ELAPSED_US * load.some)
    full_total = hist // 90 + round(ELAPSED_US * load.full)
    some, full = load.some * 100, load.full * 100  # steady: every average the same
    write(
        os.path.join(dirpath, "cpu.pressure"),
        f"some avg10={some:.2f} avg60={some:.2f} avg300={some:.2f} total={some_total}\n"
        f"full avg10={full:.2f} avg60={full:.2f} avg300={full:.2f} total={full_total}\n",
    )
    write(os.path.join(dirpath, "cpu.weight"), f"{weight_v}\n")
    return usage


def idle():
    """A cgroup whose tasks sleep: the pause container, conmon."""
    return Load(0)


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
        global SAMPLE_ROOT
        SAMPLE_ROOT = root
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
        qos_loads = {"Burstable": [], "BestEffort": []}
        kp_loads = []  # kubepods' children: Guaranteed pods, the two QoS cgroups
        qos_req = {"Burstable": 0}
        total = 0
        for pod in self.pods:
            item, usage, pload = self.write_pod(root, pod)
            items.append(item)
            total += usage
            if pod.qos() in qos_usage:
                qos_usage[pod.qos()] += usage
                qos_loads[pod.qos()].append(pload)
            else:
                kp_loads.append(pload)
            if pod.qos() == "Burstable":
                qos_req["Burstable"] += pod.pod_cpu_request() + (cpu((pod.overhead or {}).get("cpu")) or 0)
        for qos in ("Burstable", "BestEffort"):
            w = weight(qos_req["Burstable"]) if qos == "Burstable" else 1
            qload = Load.parent(qos_loads[qos])
            cgroup(os.path.join(root, self.qos_rel(qos)), f"max {DEFAULT_PERIOD}\n", w,
                   qos_usage[qos] + 1000, qload)
            kp_loads.append(qload)
        kp_q = self.kubepods_max and quota(self.kubepods_max, DEFAULT_PERIOD)
        kp_max = max_line(kp_q, DEFAULT_PERIOD)
        kp_m = None if kp_q is None else kp_q * 1000 // DEFAULT_PERIOD
        cgroup(os.path.join(root, self.kubepods_rel()), kp_max, weight(cpu(self.allocatable)),
               total + 5000, Load.parent(kp_loads, kp_m), limit_m=kp_m)

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
        loads = []  # each child cgroup's Load
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
            want = load
            # The quota caps what it can use (a limit under 10m acts as 10m).
            lim_m = None if q is None else q * 1000 // period
            used = want if lim_m is None else min(want, lim_m)
            u = num(self.name, pod.name, c.name, lo=10**6, hi=9 * 10**8) + used * ELAPSED_US // 1000
            ld = Load(used, want_m=want, threads=c.threads, some=c.psi[0], full=c.psi[1])
            usage += cgroup(os.path.join(pdir, name), max_line(q, period), weight(c.cpu_req()), u,
                            ld, limit_m=lim_m, period=period)
            loads.append(ld)
            if conmon:
                usage += cgroup(os.path.join(pdir, conmon), f"max {DEFAULT_PERIOD}\n", 1, 20000, idle())
                loads.append(idle())
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
            usage += cgroup(os.path.join(pdir, name), f"max {DEFAULT_PERIOD}\n", 1, 15000, idle())
            loads.append(idle())
            if conmon:
                usage += cgroup(os.path.join(pdir, conmon), f"max {DEFAULT_PERIOD}\n", 1, 9000, idle())
                loads.append(idle())

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
        pq_m = None if pq is None else pq * 1000 // period
        pload = Load.parent(loads, pq_m)
        cgroup(pdir, max_line(pq, period), pw, usage, pload, limit_m=pq_m, period=period)

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
        return item, usage, pload

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
            # 5m acts as 10m: quota 1000 µs, the kernel's floor. metrics wants
            # 25m: it uses 10m and is throttled 60 % of the time, every period.
            Pod("sd-tiny-limit", "default",
                [C("app", "100m", "495m", "64Mi", "128Mi"), C("metrics", "5m", "5m", load=25)]),
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
        # An idle 2-CPU node but for one opted-in pod whose 4 busy threads
        # outnumber the CPUs: it uses both (2000m, its limit, which it never
        # exceeds: no throttling); its threads queue behind each other (pod
        # some ~100 %, full ~0), so kubepods some reads ~100 % though nobody
        # else wants CPU. The agent must not lower it.
        "lone-threads", "systemd", "kubelet", "containerd", DEFAULT_PERIOD, "2", cpus=2,
        node_name="kind-worker",
        pods=[
            # Limit raised to 2000m by Headroom earlier (4x its request).
            Pod("thumbnailer-6f9c7d8b5-kx2vq", "media",
                [C("thumbnailer", "500m", "2000m", "256Mi", "1Gi", load=2000, threads=4,
                   psi=(0.995, 0.002))],
                annotations={"headroom.dev/managed": "true"}, headroom_set=True),
            Pod("node-exporter-h7x2m", "monitoring",
                [C("node-exporter", "100m", "100m", "64Mi", "64Mi", load=0)]),
            Pod("netshoot", "dev", [C("netshoot", load=0)]),
        ],
    ),
    Fixture(
        # A 2-CPU node, both CPUs busy. The opted-in indexer (request 500m,
        # limit 1500m set by Headroom, 4 busy threads) uses 1500m: all the
        # CPU left to it, not throttled; its threads queue (some ~100 %,
        # full ~0). The neighbour (another namespace, not opted in, request
        # 800m, no limit, one busy thread) wants 800m and gets 500m: it
        # waits 300 ms a second with none of its tasks running (full = some
        # = 30 %), within its request. The agent lowers the indexer.
        "displaced", "systemd", "kubelet", "containerd", DEFAULT_PERIOD, "2", cpus=2,
        node_name="kind-worker",
        pods=[
            Pod("indexer-7c5d9b8f6-m4zqt", "search",
                [C("indexer", "500m", "1500m", "512Mi", "1Gi", load=1500, threads=4,
                   psi=(0.995, 0.002))],
                annotations={"headroom.dev/managed": "true"}, headroom_set=True),
            Pod("ledger-api-5b8c6d7f9-r2wxp", "payments",
                # Wants 800m, gets 500m: 300 ms a second displaced.
                [C("api", "800m", None, "256Mi", load=500, threads=1, psi=(0.3, 0.3))]),
            Pod("node-exporter-p9k4d", "monitoring",
                [C("node-exporter", "100m", "100m", "64Mi", "64Mi", load=0)]),
            Pod("netshoot", "dev", [C("netshoot", load=0)]),
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
