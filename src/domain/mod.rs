//! What watermarkd knows without doing any I/O: the rules file and WPA objects compiled into
//! autoscalers, the state an autoscaler keeps between evaluations, and the small types the
//! layers above share.

pub mod chart;
pub mod claims;
pub mod crd;
pub mod fallback;
pub mod forecast;
pub mod import;
pub mod instant;
pub mod label_selector;
pub mod markup;
pub mod observed;
pub mod outcome;
pub mod restriction;
pub mod rules;
pub mod schedule;
pub mod sparse;
pub mod state;
pub mod status;
