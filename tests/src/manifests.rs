//! Kubernetes manifests as JSON values: deploy/'s kustomizations, rendered
//! Helm output, and server-side apply of either to the test apiserver.

use std::path::{Path, PathBuf};

use anyhow::Context;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use kube::{Client, ResourceExt};
use serde_json::Value;

pub fn repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The documents of a multi-document YAML text, empty ones dropped.
pub fn parse_docs(text: &str) -> anyhow::Result<Vec<Value>> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The objects of a kustomization directory, in the order it lists them.
/// Plain `resources:` lists only: any other kustomize field is refused, since
/// this loader would silently ignore it.
pub fn load_kustomization(dir: &Path) -> anyhow::Result<Vec<Value>> {
    let path = dir.join("kustomization.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let k: Value = serde_saphyr::from_str(&text)?;
    let fields = k
        .as_object()
        .ok_or_else(|| anyhow::anyhow!("{}: not a mapping", path.display()))?;
    for key in fields.keys() {
        anyhow::ensure!(
            ["apiVersion", "kind", "resources"].contains(&key.as_str()),
            "{}: field {key:?} is not supported by this loader (keep plain resources lists)",
            path.display()
        );
    }
    let mut out = Vec::new();
    for r in fields
        .get("resources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let r = r
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("{}: resource not a string", path.display()))?;
        let p = dir.join(r);
        if p.is_dir() {
            out.extend(load_kustomization(&p)?);
        } else {
            out.extend(parse_docs(&std::fs::read_to_string(&p)?)?);
        }
    }
    Ok(out)
}

/// "Kind/name" of an object.
pub fn kind_name(o: &Value) -> String {
    format!(
        "{}/{}",
        o["kind"].as_str().unwrap_or("?"),
        o["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// The one object of `kind`; an error if there is none or several.
pub fn one<'a>(objs: &'a [Value], kind: &str) -> anyhow::Result<&'a Value> {
    let mut it = objs.iter().filter(|o| o["kind"] == kind);
    let first = it.next().with_context(|| format!("no {kind}"))?;
    anyhow::ensure!(it.next().is_none(), "more than one {kind}");
    Ok(first)
}

/// Server-side apply (create or update) of every object, in order, resolved
/// through discovery. Namespaced objects go to their own namespace.
pub async fn apply_all(client: &Client, objs: &[Value], manager: &str) -> anyhow::Result<()> {
    let discovery = Discovery::new(client.clone()).run().await?;
    for obj in objs {
        apply_one(client, &discovery, obj, manager, false)
            .await
            .with_context(|| format!("applying {}", kind_name(obj)))?;
    }
    Ok(())
}

/// Server-side apply of one object (forced, as `manager`; a server-side
/// dry-run when `dry_run`), its kind resolved through `discovery`.
pub async fn apply_one(
    client: &Client,
    discovery: &Discovery,
    obj: &Value,
    manager: &str,
    dry_run: bool,
) -> anyhow::Result<DynamicObject> {
    let dynobj: DynamicObject = serde_json::from_value(obj.clone())?;
    let tm = dynobj
        .types
        .as_ref()
        .with_context(|| format!("{}: no apiVersion/kind", kind_name(obj)))?;
    let gvk = GroupVersionKind::try_from(tm)?;
    let (ar, caps) = discovery
        .resolve_gvk(&gvk)
        .with_context(|| format!("{}: kind unknown to the server", kind_name(obj)))?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            dynobj.namespace().as_deref().unwrap_or("default"),
            &ar,
        ),
        Scope::Cluster => Api::all_with(client.clone(), &ar),
    };
    let mut pp = PatchParams::apply(manager).force();
    if dry_run {
        pp = pp.dry_run();
    }
    Ok(api
        .patch(&dynobj.name_any(), &pp, &Patch::Apply(obj))
        .await?)
}
