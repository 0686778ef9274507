//! `Accept` negotiation for `/metrics`: OpenMetrics or Prometheus text.
//!
//! Honours q-values (RFC 9110 §12.5.1): `q=0` means "not acceptable", so
//! `application/openmetrics-text;q=0` gets the Prometheus text format.

const OPENMETRICS: &str = "application/openmetrics-text";
const TEXT: &str = "text/plain";

/// One media range of an `Accept` header and its weight.
#[derive(Debug, Clone, PartialEq)]
struct Range<'a> {
    media: &'a str,
    q: f64,
}

fn ranges(header: &str) -> impl Iterator<Item = Range<'_>> {
    header.split(',').filter_map(|part| {
        let mut params = part.split(';');
        let media = params.next()?.trim();
        if media.is_empty() {
            return None;
        }
        let q = params
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .map_or(Some(1.0), |(_, v)| {
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|q| (0.0..=1.0).contains(q))
            })
            // A malformed q makes the range unusable, not preferred.
            .unwrap_or(0.0);
        Some(Range { media, q })
    })
}

/// Weight of `media` (`type/subtype`): that of the most specific range
/// that matches it (`type/subtype`, then `type/*`, then `*/*`); 0 if none.
fn weight(header_values: &[&str], media: &str) -> (f64, bool) {
    let (ty, _) = media.split_once('/').unwrap_or((media, ""));
    let mut best: Option<(u8, f64)> = None;
    for r in header_values.iter().flat_map(|h| ranges(h)) {
        let specificity = if r.media.eq_ignore_ascii_case(media) {
            3
        } else if r
            .media
            .strip_suffix("/*")
            .is_some_and(|t| t.eq_ignore_ascii_case(ty))
        {
            2
        } else if r.media == "*/*" {
            1
        } else {
            continue;
        };
        match best {
            // The most specific wins; among equals, the highest q.
            Some((s, q)) if s > specificity || (s == specificity && q >= r.q) => {}
            _ => best = Some((specificity, r.q)),
        }
    }
    best.map_or((0.0, false), |(s, q)| (q, s == 3))
}

/// Serve OpenMetrics? Only when the client names it explicitly with a
/// q above 0 and at least that of the Prometheus text format (`*/*` alone,
/// or no header, keeps the text format every scraper reads).
pub fn wants_openmetrics(header_values: &[&str]) -> bool {
    let (om, named) = weight(header_values, OPENMETRICS);
    let (text, _) = weight(header_values, TEXT);
    named && om > 0.0 && om >= text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_default_scrape_accept_gets_openmetrics() {
        let prom = "application/openmetrics-text;version=1.0.0;q=0.5,\
                    application/openmetrics-text;version=0.0.1;q=0.4,\
                    text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert!(wants_openmetrics(&[prom]));
        assert!(wants_openmetrics(&["application/openmetrics-text"]));
        assert!(wants_openmetrics(&[
            "Application/OpenMetrics-Text; version=1.0.0"
        ]));
    }

    #[test]
    fn q_zero_means_not_acceptable() {
        assert!(!wants_openmetrics(&["application/openmetrics-text;q=0"]));
        assert!(!wants_openmetrics(&["application/openmetrics-text; q=0.0"]));
        assert!(!wants_openmetrics(&[
            "application/openmetrics-text;q=0, text/plain;q=0.1"
        ]));
    }

    #[test]
    fn preference_follows_q() {
        assert!(!wants_openmetrics(&[
            "text/plain;q=0.9, application/openmetrics-text;q=0.5"
        ]));
        assert!(wants_openmetrics(&[
            "text/plain;q=0.4, application/openmetrics-text;q=0.5"
        ]));
        // Split over two Accept headers.
        assert!(wants_openmetrics(&[
            "text/plain;q=0.4",
            "application/openmetrics-text;q=0.5"
        ]));
    }

    #[test]
    fn wildcards_and_garbage_keep_the_text_format() {
        assert!(!wants_openmetrics(&[]));
        assert!(!wants_openmetrics(&["*/*"]));
        assert!(!wants_openmetrics(&["application/*"]));
        assert!(!wants_openmetrics(&["text/plain"]));
        assert!(!wants_openmetrics(&["application/openmetrics-text;q=abc"]));
        assert!(!wants_openmetrics(&["application/openmetrics-text;q=2"]));
        assert!(!wants_openmetrics(&[",,;;"]));
    }
}
