#!/usr/bin/env python3
"""An image tarball (Docker archive format: what `docker load`, `ctr images
import` and kind read) from ready layer tarballs plus a layer of files, without
Docker or a registry. tests/node-vm/images/mkimage.py packs one layer of files;
this adds `--layer TAR` (a root filesystem tarball, e.g. Debian's, shared by
several images: the same bytes give the same layer digest) and several tags.

  mkimage-layers.py --name registry.k8s.io/kube-proxy:v1.37.2 --out kube-proxy.tar \
      --layer slim-rootfs.tar --file build/kube-proxy:/usr/local/bin/kube-proxy:0755 \
      [--tag another/name:tag] [--entrypoint JSON] [--env K=V]
"""
import argparse, hashlib, io, json, os, sys, tarfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "node-vm", "images"))
import mkimage  # noqa: E402


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--out", required=True)
    p.add_argument("--layer", action="append", default=[])
    p.add_argument("--entrypoint", default="null")
    p.add_argument("--cmd", default="null")
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--link", action="append", default=[])
    p.add_argument("--env", action="append", default=[])
    a = p.parse_args()

    layers = [(sha256_file(path), path, None) for path in a.layer]
    if a.file or a.link:
        files = []
        for f in a.file:
            src, dst, mode = f.split(":")
            files.append((src, dst, int(mode, 8)))
        data = mkimage.layer(files, [tuple(l.split("=", 1)) for l in a.link])
        layers.append((hashlib.sha256(data).hexdigest(), None, data))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Entrypoint": json.loads(a.entrypoint),
            "Cmd": json.loads(a.cmd),
            "Env": a.env or None,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + d for d, _, _ in layers]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "mkimage-layers.py"}
                    for _ in layers],
    }
    config["config"] = {k: v for k, v in config["config"].items() if v is not None}
    cfg = json.dumps(config, sort_keys=True).encode()
    cfg_id = hashlib.sha256(cfg).hexdigest()
    manifest = [{"Config": cfg_id + ".json", "RepoTags": [a.name] + a.tag,
                 "Layers": [d + "/layer.tar" for d, _, _ in layers]}]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
        def add(name, data=None, path=None):
            if path is not None:
                info = tarfile.TarInfo(name)
                info.size, info.mode = os.path.getsize(path), 0o644
                with open(path, "rb") as f:
                    out.addfile(info, f)
            else:
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                out.addfile(info, io.BytesIO(data))
        add(cfg_id + ".json", cfg)
        for digest, path, data in layers:
            add(digest + "/layer.tar", data=data, path=path)
        add("manifest.json", json.dumps(manifest).encode())
    os.replace(tmp, a.out)
    print(f"{a.name}: {a.out} (config sha256:{cfg_id[:12]})")


if __name__ == "__main__":
    main()
