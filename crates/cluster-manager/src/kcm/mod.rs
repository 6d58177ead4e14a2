//! The sandbox's stand-ins for kube-controller-manager and kube-scheduler (work in progress).
