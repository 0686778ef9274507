//! Pod JSON → PodView, and the pure functions that read a view: never panic
//! on any Pod the API could deserialize.
#![no_main]
use headroom::model::PodView;
use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(pod) = serde_json::from_slice::<Pod>(data) else {
        return;
    };
    let Ok(v) = PodView::try_from(&pod) else {
        return;
    };
    let _ = v.cpu_request();
    let _ = v.container_cpu_requests();
    let _ = headroom::node_slack::booked_request(&v);
    for period in [1_000, 100_000, 1_000_000] {
        let _ = headroom::verify::expected_cpu_max(&v, period);
    }
});
