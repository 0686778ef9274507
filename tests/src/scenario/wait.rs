//! The one polling loop of the kit: ask until the answer is yes or the time
//! is up, then say what was awaited and what was seen last.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

/// What a check of [`wait_until`] may answer: `true`/`false`, `Some(v)`/
/// `None`, or `Ok(v)`/`Err(why not yet)`; the last "why not" goes into
/// [`TimedOut`].
pub trait Check<T> {
    fn outcome(self) -> Result<T, String>;
}

impl Check<()> for bool {
    fn outcome(self) -> Result<(), String> {
        if self { Ok(()) } else { Err(String::new()) }
    }
}

impl<T> Check<T> for Option<T> {
    fn outcome(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

impl<T, E: fmt::Display> Check<T> for Result<T, E> {
    fn outcome(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// A [`wait_until`] that ran out of time.
pub struct TimedOut {
    pub what: String,
    pub after: Duration,
    /// The last check's "why not yet" (empty for `false`/`None`).
    pub last: String,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} not reached within {:?}", self.what, self.after)?;
        if !self.last.is_empty() {
            write!(f, "; last seen: {}", self.last)?;
        }
        Ok(())
    }
}

/// As `Display`, so that `wait_until(..).await.unwrap()` panics readably.
impl fmt::Debug for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for TimedOut {}

/// How often [`wait_until`] asks: about 300 times per `timeout`, between
/// 50 ms and 1 s (200 ms for the usual 60 s).
pub fn poll_period(timeout: Duration) -> Duration {
    (timeout / 300).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// Runs `check` every [`poll_period`] until it answers yes; returns its
/// value and how long that took, or [`TimedOut`] once `timeout` has passed
/// (the check runs at least once).
///
/// `check` is a closure returning a future, e.g.
/// `wait_until("pod gone", WAIT, || async { pods.get_opt("a").await.ok()?.is_none().then_some(()) })`.
pub async fn wait_until<T, C, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<(T, Duration), TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = C>,
    C: Check<T>,
{
    let t0 = Instant::now();
    let every = poll_period(timeout);
    loop {
        let last = match check().await.outcome() {
            Ok(v) => return Ok((v, t0.elapsed())),
            Err(why) => why,
        };
        if t0.elapsed() >= timeout {
            return Err(TimedOut {
                what: what.to_string(),
                after: timeout,
                last,
            });
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_period_is_a_three_hundredth_within_bounds() {
        assert_eq!(
            poll_period(Duration::from_secs(60)),
            Duration::from_millis(200)
        );
        assert_eq!(
            poll_period(Duration::from_secs(1)),
            Duration::from_millis(50)
        );
        assert_eq!(
            poll_period(Duration::from_secs(900)),
            Duration::from_secs(1)
        );
    }

    #[tokio::test]
    async fn returns_the_first_yes_and_its_value() {
        let mut n = 0;
        let (v, _) = wait_until("third try", Duration::from_secs(5), || {
            n += 1;
            let now = n;
            async move { (now == 3).then_some(now) }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
    }

    #[tokio::test]
    async fn times_out_with_the_last_reason() {
        let err = wait_until("never", Duration::from_millis(120), || async {
            Err::<(), _>("still 7")
        })
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "never not reached within 120ms; last seen: still 7"
        );
    }

    #[tokio::test]
    async fn a_bool_check_runs_at_least_once() {
        let (_, took) = wait_until("at once", Duration::ZERO, || async { true })
            .await
            .unwrap();
        assert!(took < Duration::from_secs(1));
    }
}
