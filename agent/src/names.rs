//! Kubernetes object names as the apiserver validates them. Names taken from
//! the command line end up in field selectors and API paths, so anything
//! else (empty, `a,metadata.namespace=x`, `../x`) is refused before use.

/// Why a string is not a valid name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{what} must not be empty")]
    Empty { what: &'static str },
    #[error("{what} {name:?} is {len} characters long; at most {max} are allowed")]
    TooLong {
        what: &'static str,
        name: String,
        len: usize,
        max: usize,
    },
    #[error(
        "{what} {name:?} is not a DNS-1123 {kind}: lowercase letters, digits{dots} and '-', \
         starting and ending with a letter or digit"
    )]
    Invalid {
        what: &'static str,
        name: String,
        kind: &'static str,
        dots: &'static str,
    },
}

/// Max length of a DNS-1123 label (namespaces).
pub const LABEL_MAX: usize = 63;
/// Max length of a DNS-1123 subdomain (nodes, pods).
pub const SUBDOMAIN_MAX: usize = 253;

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= LABEL_MAX
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(inner)
}

fn check_len(what: &'static str, name: &str, max: usize) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { what });
    }
    if name.len() > max {
        return Err(NameError::TooLong {
            what,
            name: name.to_string(),
            len: name.len(),
            max,
        });
    }
    Ok(())
}

/// A DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, ≤ 63): namespaces.
pub fn dns1123_label(what: &'static str, name: &str) -> Result<(), NameError> {
    check_len(what, name, LABEL_MAX)?;
    if is_label(name) {
        Ok(())
    } else {
        Err(NameError::Invalid {
            what,
            name: name.to_string(),
            kind: "label",
            dots: "",
        })
    }
}

/// A DNS-1123 subdomain (dot-separated labels, ≤ 253): nodes and pods.
pub fn dns1123_subdomain(what: &'static str, name: &str) -> Result<(), NameError> {
    check_len(what, name, SUBDOMAIN_MAX)?;
    if name.split('.').all(is_label) {
        Ok(())
    } else {
        Err(NameError::Invalid {
            what,
            name: name.to_string(),
            kind: "subdomain",
            dots: ", '.'",
        })
    }
}

/// A node name (`run --node-name`, `NODE_NAME`).
pub fn node_name(name: &str) -> Result<(), NameError> {
    dns1123_subdomain("node name", name)
}

/// `NAMESPACE/NAME` of a pod, each part validated.
pub fn pod_ref(s: &str) -> Result<(&str, &str), PodRefError> {
    let (ns, name) = s
        .split_once('/')
        .ok_or_else(|| PodRefError::Shape(s.into()))?;
    dns1123_label("namespace", ns)?;
    dns1123_subdomain("pod name", name)?;
    Ok((ns, name))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodRefError {
    #[error("expected NAMESPACE/POD, got {0:?}")]
    Shape(String),
    #[error(transparent)]
    Name(#[from] NameError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names() {
        let longest = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61),
        ]
        .join(".");
        assert_eq!(longest.len(), 253);
        for ok in ["a", "node-1", "ip-10-0-0-1.ec2.internal", "0", &longest] {
            assert_eq!(node_name(ok), Ok(()), "{ok}");
        }
        assert_eq!(node_name(""), Err(NameError::Empty { what: "node name" }));
        for bad in [
            "a,metadata.namespace=x",
            "Node",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "a b",
            "a=b",
            "ä",
        ] {
            assert!(
                matches!(node_name(bad), Err(NameError::Invalid { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            node_name(&format!("{longest}e")),
            Err(NameError::TooLong { max: 253, .. })
        ));
        assert!(matches!(
            node_name(&"a".repeat(64)),
            Err(NameError::Invalid { .. })
        ));
        // Each label of a subdomain is at most 63 long.
        assert!(node_name(&format!("{}.b", "a".repeat(64))).is_err());
    }

    #[test]
    fn pod_refs() {
        assert_eq!(pod_ref("default/web-0"), Ok(("default", "web-0")));
        assert_eq!(pod_ref("kube-system/a.b"), Ok(("kube-system", "a.b")));
        assert!(matches!(pod_ref("web"), Err(PodRefError::Shape(_))));
        for bad in [
            "default/pod/log",
            "../../x/y",
            "a.b/pod",
            "/pod",
            "default/",
            "Default/pod",
            &format!("{}/pod", "a".repeat(64)),
        ] {
            assert!(
                matches!(pod_ref(bad), Err(PodRefError::Name(_))),
                "{bad}: {:?}",
                pod_ref(bad)
            );
        }
        let msg = pod_ref("default/pod/log").unwrap_err().to_string();
        assert!(msg.contains("pod name \"pod/log\""), "{msg}");
    }
}
