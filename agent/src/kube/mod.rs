//! What the agent's `run` says to and hears from the Kubernetes API:
//! watches of the own node's pods and their conversion to
//! [`crate::model::PodView`], the resize patch and its classification, owner
//! templates, and events. (`explain` lists pods, the Node and namespaces
//! once itself, in `cli/explain.rs`.)

pub mod classify;
pub mod events;
pub mod owner;
pub mod patch;
pub mod pods;
pub mod resize;
pub mod view;
pub mod watch;
