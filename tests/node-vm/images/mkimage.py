#!/usr/bin/env python3
"""Packs files into a single-layer image tarball (Docker archive format, which
`ctr images import` reads) without Docker or a registry.

  mkimage.py --name headroom.local/pause:1 --out pause.tar \
      --entrypoint '["/pause"]' --file build/pause:/pause:0755 [--link /bin/sh=busybox]
      [--user 65532:65532] [--label k=v] [--env K=V]

Deterministic: fixed mtimes and owners, so the same inputs give the same digest.
"""
import argparse, hashlib, io, json, os, tarfile


def layer(files, links):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = set()
        for _, dst, _ in files:
            parts = dst.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        for link, _ in links:
            parts = link.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for src, dst, mode in files:
            data = open(src, "rb").read()
            info = tarfile.TarInfo(dst.strip("/"))
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        for link, target in links:
            info = tarfile.TarInfo(link.strip("/"))
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
    return buf.getvalue()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--entrypoint", default="null")
    p.add_argument("--cmd", default="null")
    p.add_argument("--user", default="")
    p.add_argument("--workdir", default="/")
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--link", action="append", default=[])
    p.add_argument("--label", action="append", default=[])
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--expose", action="append", default=[])
    a = p.parse_args()

    files = []
    for f in a.file:
        src, dst, mode = f.split(":")
        files.append((src, dst, int(mode, 8)))
    links = [tuple(l.split("=", 1)) for l in a.link]
    tar = layer(files, links)
    diff_id = hashlib.sha256(tar).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Entrypoint": json.loads(a.entrypoint),
            "Cmd": json.loads(a.cmd),
            "User": a.user,
            "WorkingDir": a.workdir,
            "Env": a.env or None,
            "Labels": dict(l.split("=", 1) for l in a.label) or None,
            "ExposedPorts": {e: {} for e in a.expose} or None,
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "mkimage.py"}],
    }
    config = {k: v for k, v in config.items()}
    config["config"] = {k: v for k, v in config["config"].items() if v is not None}
    cfg = json.dumps(config, sort_keys=True).encode()
    cfg_id = hashlib.sha256(cfg).hexdigest()
    manifest = [{"Config": cfg_id + ".json", "RepoTags": [a.name],
                 "Layers": [diff_id + "/layer.tar"]}]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
        for name, data in [(cfg_id + ".json", cfg), (diff_id + "/layer.tar", tar),
                           ("manifest.json", json.dumps(manifest).encode())]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            out.addfile(info, io.BytesIO(data))
    os.replace(tmp, a.out)
    print(f"{a.name}: {a.out} (config sha256:{cfg_id[:12]})")


if __name__ == "__main__":
    main()
