"""The Kubernetes scheduler driver (docs/kubernetes.md)."""
