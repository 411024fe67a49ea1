"""The bare platform beside orch in scripts/bench-kubernetes.sh: Jobs made and
waited for with the official Python client (`kubernetes`), as a user who
needs no orch would, against the same fake API server in the same run.

    python3 kube_jobs.py KUBECONFIG SHAPE N [DRY_RUN_YAML]

SHAPE `orch` (or `orch_*`): the Jobs `orch run --dry-run` prints for the
noop suite (the same agent delivery, an image volume or an init container,
the same cell container running the agent's noop task), renamed; SHAPE `true`: a plain Job
of one container running `true` in the cells' image. All N are started at
once (as orch starts the suite's N cells), each timed from just before its
create to its pod seen `Succeeded` in one watch of the pods (the platform's
own start: scheduling, the containers' start and run), then to its Job's
deletion answered (background propagation, as orch deletes it at a cell's
end). Prints one JSON object: the milliseconds of each Job, sorted.
"""

import json
import sys
import threading
import time

import yaml
from kubernetes import client, config, watch

LABEL = "bench.orch.dev/bare"


def jobs(shape, n, dry_run):
    """N Job bodies of the shape, named `bare-SHAPE-K`, labelled for the watch."""
    if shape.startswith("orch"):
        docs = [d for d in yaml.safe_load_all(open(dry_run)) if d and d.get("kind") == "Job"]
        if not docs:
            sys.exit(f"no Job in {dry_run}")
    out = []
    for k in range(n):
        name = f"bare-{shape.replace('_', '-')}-{k}"
        if shape.startswith("orch"):
            job = json.loads(json.dumps(docs[k % len(docs)]))
            job["metadata"] = {"name": name, "labels": {LABEL: shape}}
        else:
            job = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "labels": {LABEL: shape}},
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {"name": "c", "image": "debian:bookworm-slim", "command": ["true"]}
                            ],
                        }
                    },
                },
            }
        tmpl = job["spec"]["template"].setdefault("metadata", {})
        tmpl["labels"] = {**(tmpl.get("labels") or {}), LABEL: shape, "bench.orch.dev/job": name}
        out.append(job)
    return out


def main():
    kubeconfig, shape, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dry_run = sys.argv[4] if len(sys.argv) > 4 else None
    config.load_kube_config(config_file=kubeconfig)
    _, ctx = config.list_kube_config_contexts(config_file=kubeconfig)
    ns = ctx["context"].get("namespace", "default")
    batch, core = client.BatchV1Api(), client.CoreV1Api()
    bodies = jobs(shape, n, dry_run)
    ended = {b["metadata"]["name"]: threading.Event() for b in bodies}
    failed = []
    w = watch.Watch()
    listening = threading.Event()

    def pods():
        rv = core.list_namespaced_pod(ns, label_selector=f"{LABEL}={shape}").metadata.resource_version
        listening.set()
        for ev in w.stream(core.list_namespaced_pod, ns, label_selector=f"{LABEL}={shape}",
                           resource_version=rv, timeout_seconds=120):
            pod = ev["object"]
            job = (pod.metadata.labels or {}).get("bench.orch.dev/job")
            phase = pod.status.phase if pod.status else None
            if job in ended and phase in ("Succeeded", "Failed"):
                if phase == "Failed":
                    failed.append(job)
                ended[job].set()
            if all(e.is_set() for e in ended.values()):
                return

    watcher = threading.Thread(target=pods, daemon=True)
    watcher.start()
    listening.wait(30)
    go = threading.Barrier(n)
    took = [0.0] * n

    def one(k, body):
        go.wait()
        t0 = time.perf_counter()
        batch.create_namespaced_job(ns, body)
        if not ended[body["metadata"]["name"]].wait(120):
            failed.append(body["metadata"]["name"] + " (no end within 120 s)")
        batch.delete_namespaced_job(body["metadata"]["name"], ns, propagation_policy="Background")
        took[k] = (time.perf_counter() - t0) * 1000

    threads = [threading.Thread(target=one, args=(k, b)) for k, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.stop()
    if failed:
        sys.exit(f"bare {shape} Jobs did not succeed: {failed}")
    print(json.dumps({"shape": shape, "ms": sorted(round(t, 1) for t in took)}))


if __name__ == "__main__":
    main()
