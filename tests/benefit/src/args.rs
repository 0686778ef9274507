//! `--name value` flags of the two binaries (no parser crate: the static
//! build stays small and quick).

use std::collections::HashMap;

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ArgError {
    #[error("unknown or repeated flag {0:?}")]
    Unknown(String),
    #[error("flag {0} needs a value")]
    Missing(String),
    #[error("flag --{0}: {1:?} is not valid")]
    Invalid(String, String),
    #[error("flag --{0} is required")]
    Required(String),
}

pub struct Args(HashMap<String, String>);

impl Args {
    /// Parses `--k v` pairs; only flags in `known` are accepted.
    pub fn parse(argv: impl IntoIterator<Item = String>, known: &[&str]) -> Result<Args, ArgError> {
        let mut m = HashMap::new();
        let mut it = argv.into_iter();
        while let Some(a) = it.next() {
            let k = a
                .strip_prefix("--")
                .filter(|k| known.contains(k))
                .ok_or_else(|| ArgError::Unknown(a.clone()))?;
            let v = it.next().ok_or_else(|| ArgError::Missing(a.clone()))?;
            if m.insert(k.to_string(), v).is_some() {
                return Err(ArgError::Unknown(a));
            }
        }
        Ok(Args(m))
    }

    pub fn str(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    pub fn required(&self, k: &str) -> Result<&str, ArgError> {
        self.str(k).ok_or_else(|| ArgError::Required(k.into()))
    }

    /// A parsed value, or `default` when the flag is absent.
    pub fn get<T: std::str::FromStr>(&self, k: &str, default: T) -> Result<T, ArgError> {
        match self.str(k) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| ArgError::Invalid(k.into(), v.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn flags_values_defaults_and_refusals() {
        let a = Args::parse(
            argv("--workers 4 --listen 0.0.0.0:8080"),
            &["workers", "listen", "burn-us"],
        )
        .unwrap();
        assert_eq!(a.get("workers", 1usize), Ok(4));
        assert_eq!(a.get("burn-us", 7u64), Ok(7));
        assert_eq!(a.required("listen"), Ok("0.0.0.0:8080"));
        assert!(matches!(a.required("burn-us"), Err(ArgError::Required(_))));
        assert!(matches!(
            a.get::<u64>("listen", 0),
            Err(ArgError::Invalid(..))
        ));
        assert!(matches!(
            Args::parse(argv("--nope 1"), &["workers"]),
            Err(ArgError::Unknown(_))
        ));
        assert!(matches!(
            Args::parse(argv("--workers"), &["workers"]),
            Err(ArgError::Missing(_))
        ));
        assert!(matches!(
            Args::parse(argv("--workers 1 --workers 2"), &["workers"]),
            Err(ArgError::Unknown(_))
        ));
        assert!(matches!(
            Args::parse(argv("workers 1"), &["workers"]),
            Err(ArgError::Unknown(_))
        ));
    }
}
