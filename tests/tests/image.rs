//! The image built without Docker (`scripts/build-image.sh`, umoci + skopeo)
//! is the image the Dockerfile's final stage describes: same user, ports,
//! entrypoint, command and labels, one layer holding only the static binary
//! (no shell, no libc). Change either file and this fails until the other
//! follows.

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

#[test]
fn image_built_without_docker_matches_the_dockerfile_final_stage() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let stage = final_stage(&dockerfile);
    assert_eq!(stage.from, "scratch", "final stage must be FROM scratch");
    let archive = testkit::node_vm::agent_image().expect("scripts/build-image.sh");
    let dir = tempfile::tempdir().expect("tempdir");
    let (config, layers) = unpack(&archive, dir.path());
    let c = &config["config"];

    assert_eq!(c["User"].as_str(), stage.user.as_deref(), "USER");
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

    // And it is the static binary scripts/static-build.sh produces.
    let binary = testkit::node_vm::static_agent_binary().expect("static binary");
    let in_layer = Command::new("tar")
        .arg("-xOf")
        .arg(&layers[0].tarball)
        .arg(dst)
        .output()
        .expect("tar -xO");
    assert!(in_layer.status.success(), "{in_layer:?}");
    assert!(
        in_layer.stdout == std::fs::read(&binary).expect("static binary"),
        "the image's binary is {}",
        binary.display()
    );
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
