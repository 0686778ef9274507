//! The image built without Docker (`scripts/build-image.sh`, umoci + skopeo)
//! is the image the Dockerfile's final stage describes: same user, ports,
//! entrypoint, command and labels, one layer holding only the static binary
//! (no shell, no libc). Change either file and this fails until the other
//! follows. Checked for the Docker archive the node VMs import (amd64) and for
//! both images of the OCI image index (linux/amd64, linux/arm64); the arm64
//! binary from the image runs under qemu-user-static and reads every cgroup
//! fixture exactly as the amd64 one does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The final stage of a Dockerfile, as the instructions this image uses.
#[derive(Debug, Default)]
struct FinalStage {
    from: String,
    copies: Vec<(String, String)>,
    user: Option<String>,
    expose: Vec<String>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    labels: BTreeMap<String, String>,
}

/// `key="value" key2=value2` (LABEL's form), double quotes and `\"` honoured.
fn key_values(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                value.push(c);
            }
        }
        out.insert(key.trim().to_string(), value);
    }
    out
}

/// Exec form (`["a", "b"]`) only: shell form would need a shell the image lacks.
fn exec_form(args: &str) -> Vec<String> {
    serde_json::from_str(args).unwrap_or_else(|e| panic!("not exec form (JSON array): {args}: {e}"))
}

fn final_stage(dockerfile: &str) -> FinalStage {
    // Join continuation lines, drop comments and blank lines.
    let mut logical = Vec::new();
    let mut cur = String::new();
    for line in dockerfile.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                logical.push(std::mem::take(&mut cur));
            }
        }
    }
    let mut stage = FinalStage::default();
    for l in logical {
        let (instr, args) = l.split_once(char::is_whitespace).unwrap_or((&l, ""));
        let args = args.trim();
        match instr.to_ascii_uppercase().as_str() {
            "FROM" => {
                stage = FinalStage {
                    from: args.split_whitespace().next().unwrap_or("").to_string(),
                    ..FinalStage::default()
                }
            }
            "COPY" => {
                let parts: Vec<&str> = args
                    .split_whitespace()
                    .filter(|p| !p.starts_with("--"))
                    .collect();
                if let [src, dst] = parts[..] {
                    stage.copies.push((src.to_string(), dst.to_string()));
                } else {
                    panic!("COPY with other than one source and one destination: {l}");
                }
            }
            "USER" => stage.user = Some(args.to_string()),
            "EXPOSE" => stage.expose.extend(args.split_whitespace().map(|p| {
                if p.contains('/') {
                    p.to_string()
                } else {
                    format!("{p}/tcp")
                }
            })),
            "ENTRYPOINT" => stage.entrypoint = Some(exec_form(args)),
            "CMD" => stage.cmd = Some(exec_form(args)),
            "LABEL" => stage.labels.extend(key_values(args)),
            "ARG" | "WORKDIR" | "RUN" | "ENV" => {}
            other => panic!("instruction {other} is not checked by this test: teach it"),
        }
    }
    stage
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8")
}

/// One layer of the unpacked archive: its tarball and `tar -tv` listing.
struct Layer {
    tarball: PathBuf,
    listing: Vec<String>,
}

/// The archive unpacked into `into`: the image config JSON and its layers.
fn unpack(archive: &Path, into: &Path) -> (Value, Vec<Layer>) {
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(into));
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(into.join("manifest.json")).expect("manifest.json"))
            .expect("manifest JSON");
    let entry = &manifest[0];
    let config: Value = serde_json::from_slice(
        &std::fs::read(into.join(entry["Config"].as_str().expect("Config"))).expect("config"),
    )
    .expect("config JSON");
    let layers = entry["Layers"]
        .as_array()
        .expect("Layers")
        .iter()
        .map(|l| {
            let tarball = into.join(l.as_str().expect("layer"));
            let listing = run(Command::new("tar")
                .arg("--numeric-owner")
                .arg("-tvf")
                .arg(&tarball))
            .lines()
            .map(str::to_string)
            .collect();
            Layer { tarball, listing }
        })
        .collect();
    (config, layers)
}

/// The Dockerfile's final stage.
fn dockerfile_stage() -> FinalStage {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let stage = final_stage(&dockerfile);
    assert_eq!(stage.from, "scratch", "final stage must be FROM scratch");
    stage
}

/// Checks one image (its config JSON and layers) against the final stage and
/// returns the bytes of the binary in its layer.
fn check_image(stage: &FinalStage, config: &Value, layers: &[Layer], gzip: bool) -> Vec<u8> {
    let c = &config["config"];
    assert_eq!(c["User"].as_str(), stage.user.as_deref(), "USER");
    assert_eq!(c["User"], "65532:65532", "the non-root user");
    let ports: Vec<String> = c["ExposedPorts"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    assert_eq!(ports, stage.expose, "EXPOSE");
    let strings = |v: &Value| -> Option<Vec<String>> {
        v.as_array().map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap_or("").to_string())
                .collect()
        })
    };
    assert_eq!(strings(&c["Entrypoint"]), stage.entrypoint, "ENTRYPOINT");
    assert_eq!(strings(&c["Cmd"]), stage.cmd, "CMD");
    let labels: BTreeMap<String, String> = c["Labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(labels, stage.labels, "LABEL");
    assert!(
        !stage.labels.is_empty(),
        "the Dockerfile declares the OCI labels"
    );
    assert_eq!(
        stage
            .labels
            .get("org.opencontainers.image.version")
            .map(String::as_str),
        Some(env!("CARGO_PKG_VERSION")),
        "image version label is the crate version"
    );
    assert_eq!(config["os"], "linux");
    assert!(
        c["Env"].as_array().is_none_or(Vec::is_empty),
        "the Dockerfile sets no ENV: {c}"
    );

    // One layer: the COPY destination and nothing else (no shell, no libc).
    assert_eq!(layers.len(), stage.copies.len(), "one layer per COPY");
    let files: Vec<&String> = layers[0]
        .listing
        .iter()
        .filter(|l| !l.starts_with('d'))
        .collect();
    assert_eq!(files.len(), 1, "only the binary: {:?}", layers[0].listing);
    let dst = stage.copies[0].1.trim_start_matches('/');
    let f = files[0];
    assert!(
        f.starts_with("-rwxr-xr-x 0/0 ") && f.ends_with(&format!(" {dst}")),
        "{dst} is a root-owned 0755 file: {f}"
    );
    assert_eq!(
        Some(format!("/{dst}")),
        stage.entrypoint.as_ref().and_then(|e| e.first().cloned()),
        "the entrypoint is the copied binary"
    );
    let in_layer = Command::new("tar")
        .arg(if gzip { "-xzOf" } else { "-xOf" })
        .arg(&layers[0].tarball)
        .arg(dst)
        .output()
        .expect("tar -xO");
    assert!(in_layer.status.success(), "{in_layer:?}");
    in_layer.stdout
}

#[test]
fn image_built_without_docker_matches_the_dockerfile_final_stage() {
    let stage = dockerfile_stage();
    let archive = testkit::node_vm::agent_image().expect("scripts/build-image.sh");
    let dir = tempfile::tempdir().expect("tempdir");
    let (config, layers) = unpack(&archive, dir.path());
    assert_eq!(config["architecture"], "amd64");
    let in_layer = check_image(&stage, &config, &layers, false);
    // And it is the static binary scripts/static-build.sh produces.
    let binary = testkit::node_vm::static_agent_binary().expect("static binary");
    assert!(
        in_layer == std::fs::read(&binary).expect("static binary"),
        "the image's binary is {}",
        binary.display()
    );
}

/// The OCI layout scripts/build-image.sh writes (built when stale).
fn oci_layout() -> PathBuf {
    let archive = testkit::node_vm::agent_image().expect("scripts/build-image.sh");
    archive.with_file_name("headroom-agent-oci")
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    layout.join("blobs/sha256").join(hex)
}

fn json_blob(layout: &Path, digest: &str) -> Value {
    serde_json::from_slice(&std::fs::read(blob(layout, digest)).expect("blob")).expect("blob JSON")
}

/// (architecture, config, layers) of every image in the index tagged with the
/// crate version.
fn index_images(layout: &Path) -> Vec<(String, Value, Vec<Layer>)> {
    let top: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    let entry = top["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == version)
        .unwrap_or_else(|| panic!("no {version} in {top}"));
    assert_eq!(
        entry["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let index = json_blob(layout, entry["digest"].as_str().unwrap());
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
            let arch = m["platform"]["architecture"].as_str().unwrap().to_string();
            assert_eq!(m["platform"]["os"], "linux");
            let manifest = json_blob(layout, m["digest"].as_str().unwrap());
            let config = json_blob(layout, manifest["config"]["digest"].as_str().unwrap());
            assert_eq!(config["architecture"], arch.as_str(), "platform = config");
            let layers = manifest["layers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    assert_eq!(
                        l["mediaType"],
                        "application/vnd.oci.image.layer.v1.tar+gzip"
                    );
                    let tarball = blob(layout, l["digest"].as_str().unwrap());
                    let listing = run(Command::new("tar")
                        .arg("--numeric-owner")
                        .arg("-tzvf")
                        .arg(&tarball))
                    .lines()
                    .map(str::to_string)
                    .collect();
                    Layer { tarball, listing }
                })
                .collect();
            (arch, config, layers)
        })
        .collect()
}

fn static_binary(triple: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    target.join(triple).join("release/headroom-agent")
}

#[test]
fn oci_index_holds_amd64_and_arm64_images_of_the_dockerfile_final_stage() {
    let stage = dockerfile_stage();
    let layout = oci_layout();
    let images = index_images(&layout);
    let arches: Vec<&str> = images.iter().map(|(a, _, _)| a.as_str()).collect();
    assert_eq!(arches, ["amd64", "arm64"]);
    for (arch, config, layers) in &images {
        let bin = check_image(&stage, config, layers, true);
        let triple = if arch == "amd64" {
            "x86_64-unknown-linux-musl"
        } else {
            "aarch64-unknown-linux-musl"
        };
        let want = std::fs::read(static_binary(triple)).expect("static binary");
        assert!(bin == want, "{arch}: the image's binary is not {triple}'s");
        // ELF machine: x86-64 is 62, AArch64 is 183 (e_machine at offset 18).
        let machine = u16::from_le_bytes([bin[18], bin[19]]);
        assert_eq!(machine, if arch == "amd64" { 62 } else { 183 }, "{arch}");
    }
    // skopeo reads the index back as one multi-arch image.
    let out = run(Command::new("skopeo")
        .args(["inspect", "--raw"])
        .arg(format!(
            "oci:{}:{}",
            layout.display(),
            env!("CARGO_PKG_VERSION")
        )));
    let raw: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(raw["manifests"].as_array().map(Vec::len), Some(2), "{raw}");
}

/// Every fixture's `root/`.
fn fixture_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = std::fs::read_dir(repo().join("cgroup-fixtures"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("root"))
        .filter(|p| p.is_dir())
        .collect();
    roots.sort();
    roots
}

fn slack_json(cmd: &mut Command, root: &Path) -> Value {
    let out = cmd
        .args(["slack", "--json", "--interval", "10ms", "--cgroup-root"])
        .arg(root)
        .output()
        .expect("run slack");
    assert!(
        out.status.success(),
        "{cmd:?} on {}: {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{}: not JSON: {e}: {}",
            root.display(),
            String::from_utf8_lossy(&out.stdout)
        )
    });
    // The measured wall time between the two samples: the only field that
    // differs between two runs on the same tree.
    let interval = v["node"]
        .as_object_mut()
        .and_then(|n| n.remove("interval_us"));
    assert!(
        interval.is_some_and(|i| i.is_u64()),
        "no node.interval_us: {v}"
    );
    v
}

#[test]
fn arm64_binary_from_the_image_reads_every_fixture_like_amd64_under_qemu() {
    let layout = oci_layout();
    let dir = tempfile::tempdir().unwrap();
    let mut bins = BTreeMap::new();
    let stage = dockerfile_stage();
    for (arch, config, layers) in index_images(&layout) {
        let path = dir.path().join(format!("headroom-agent-{arch}"));
        std::fs::write(&path, check_image(&stage, &config, &layers, true)).unwrap();
        run(Command::new("chmod").arg("0755").arg(&path));
        bins.insert(arch, path);
    }
    let roots = fixture_roots();
    assert!(roots.len() >= 5, "fixtures: {roots:?}");
    for root in &roots {
        let amd64 = slack_json(&mut Command::new(&bins["amd64"]), root);
        // qemu-user-static (Debian), run directly: no binfmt registration needed.
        let arm64 = slack_json(
            Command::new("qemu-aarch64-static").arg(&bins["arm64"]),
            root,
        );
        assert_eq!(arm64, amd64, "{}: arm64 and amd64 disagree", root.display());
        assert!(amd64.is_object(), "{amd64}");
    }
}

#[test]
fn dockerfile_parser_reads_what_this_test_relies_on() {
    let s = final_stage(
        "FROM rust AS build\nRUN x \\\n  y\nFROM scratch\n# c\nLABEL a=\"b c\" \\\n d=e\n\
         COPY --from=build /o /p\nUSER 1:2\nEXPOSE 80 53/udp\nENTRYPOINT [\"/p\"]\nCMD [\"run\"]\n",
    );
    assert_eq!(s.from, "scratch");
    assert_eq!(s.copies, vec![("/o".to_string(), "/p".to_string())]);
    assert_eq!(s.user.as_deref(), Some("1:2"));
    assert_eq!(s.expose, vec!["80/tcp", "53/udp"]);
    assert_eq!(s.entrypoint, Some(vec!["/p".to_string()]));
    assert_eq!(s.cmd, Some(vec!["run".to_string()]));
    assert_eq!(s.labels.get("a").map(String::as_str), Some("b c"));
    assert_eq!(s.labels.get("d").map(String::as_str), Some("e"));
    assert_eq!(s.labels.len(), 2);
}
