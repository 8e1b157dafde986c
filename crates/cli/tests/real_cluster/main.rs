//! End-to-end tests on the real control plane (`../shared/kube`: kube-apiserver with RBAC,
//! etcd, kube-controller-manager, kube-scheduler): our binaries as processes under their own
//! ServiceAccounts with the manifests of `deploy/kubernetes` applied unchanged, and every test
//! fails if a request of ours was answered 403. Without the control plane's binaries these
//! tests fail; they never pass silently.

#![allow(clippy::unwrap_used)]

mod attach;
mod bed;
mod binder_differential;
mod can_i;
mod capacity;
mod data_sources;
mod leader;
mod newer_apis;
mod node_deployment;
mod pods;
mod provisioning;
mod pv_binder;
mod quantities;
mod recycler;
mod seeds_gaps;
mod tables;
mod upstream_rbac;
mod volume_sets;
