//! Everything that talks to the Kubernetes API: watches of the own node's
//! pods and their conversion to [`crate::model::PodView`], the resize patch
//! and its classification, and events.

pub mod classify;
pub mod events;
pub mod owner;
pub mod patch;
pub mod pods;
pub mod resize;
pub mod view;
pub mod watch;
